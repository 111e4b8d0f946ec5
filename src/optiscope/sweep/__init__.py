"""``optiscope sweep``: a fair optimizer comparison — each optimizer's learning rate tuned on a grid
that grows until the best is interior, then several seeds — run on a local process pool or on Ray.

* ``grid`` — the protocol, as pure functions of the measurements;
* ``trial`` — one optimizer at one learning rate and seed, an ordinary run directory of the experiment;
* ``backends`` — a local process pool, or Ray tasks;
* ``workers`` — the local pool's processes, and how a sweep that stops stops them;
* ``stats`` — mean ± std, Student's and Welch's intervals, differences beyond seed noise;
* ``results`` — the ``Results`` of a sweep's results.json;
* ``sweep`` — ``run_sweep``: the directory, the rounds of trials, resume.

The objectives come from the experiments (``OBJECTIVES`` in each module that trains).
"""

from typing import Any

from .. import experiments
from .results import Results, what_trials_did
from .sweep import SweepConfig, run_sweep

SUMMARY = "each optimizer's learning rate tuned on a grid, then several seeds at the best: a fair comparison"


def result_kinds() -> list[str]:
    """What a results.json may name as its ``experiment``: every experiment, and ``sweep``."""
    return [*experiments.EXPERIMENTS, "sweep"]


def results_contract(name: Any) -> tuple[type, str] | None:
    """(the ``Results`` TypedDict, the summary) of results naming ``name``; None when none is known."""
    if name == "sweep":
        return Results, SUMMARY
    if name in experiments.EXPERIMENTS:
        module = experiments.load(name)
        return module.Results, module.SUMMARY
    return None


__all__ = [
    "SweepConfig",
    "run_sweep",
    "Results",
    "what_trials_did",
]
