"""A synthetic experiment for sweep tests: its objective is a known function of the learning rate.

    objective(η) = (log₁₀ η − log₁₀ η*)² + seed / 1000

with η* the optimizer's optimum (``--sgd-optimum``, ``--adam-optimum``), so the tuned learning rate of a
√10 grid is the grid point nearest η* in log space, known in advance. A run diverges above
``--diverge-above``, finishes without a value (as a run that never reaches its target) below ``--miss-below``,
raises at exactly ``--crash-at`` and kills the process running it at exactly ``--die-at``
(as the kernel kills one whose memory ran out: for pool and Ray workers only); ``--text`` names a file it
refuses when it runs (as ``lm`` refuses a corpus file that is not there). With ``--hold DIR`` trials meet in
DIR before that refusal, so that trials run side by side refuse at known moments: a run above ``--slow-above``
says it has started and refuses ``SLOW`` seconds later, one at or below it refuses once such a run has started.
With ``--started DIR`` each run writes its process id to ``DIR/<label>-seed-<seed>`` when it starts, and with
``--sleep-while FILE`` it then sleeps as long as FILE exists: a sweep to kill while its trials run, whose resumed
trials finish at once once the test has removed FILE.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import torch

from optiscope.experiments import ConfigError, Objective, only_run
from optiscope.optim.recipes import parse_runs

SUMMARY = "a known objective of the learning rate (tests)"
LEARNING_RATES = {"sgd": 0.01, "adam": 0.01}


@dataclass
class Config:
    optimizers: str = "sgd"
    seed: int = 0
    sgd_optimum: float = 0.01
    adam_optimum: float = 0.01
    diverge_above: float = math.inf
    miss_below: float = 0.0
    crash_at: float = 0.0
    die_at: float = 0.0
    text: str = ""
    hold: str = ""
    slow_above: float = math.inf
    started: str = ""
    sleep_while: str = ""
    curvature: float = 20.0
    quiet: bool = field(default=False, metadata={"affects_results": False})

    def __post_init__(self) -> None:
        runs_of(self)
        if self.sgd_optimum <= 0:
            raise ConfigError(f"sgd_optimum={self.sgd_optimum} must be > 0")


def runs_of(config):
    return parse_runs(config.optimizers, LEARNING_RATES)


QUICK: dict = {}


class Results(TypedDict):
    runs: dict[str, dict]


def objective(lr: float, optimum: float, seed: int) -> float:
    return (math.log10(lr) - math.log10(optimum)) ** 2 + seed / 1000


#: seconds a run above ``--slow-above`` takes to refuse (with ``--hold``); at most a minute waited for it
SLOW = 3.0


def meet(config) -> None:
    """The trials' meeting in ``config.hold`` before a refusal: the slow run marks its start and waits ``SLOW``
    seconds, the others wait for that mark."""
    started = Path(config.hold) / "slow-started"
    if runs_of(config)[0].lr > config.slow_above:
        started.touch()
        time.sleep(SLOW)
        return
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def mark_start(config) -> None:
    """Write this process's id to ``config.started``'s file of this run; sleep while ``config.sleep_while`` exists."""
    spec = runs_of(config)[0]
    with (Path(config.started) / f"{spec.label}-seed-{config.seed}").open("a") as f:
        f.write(f"{os.getpid()}\n")
    while config.sleep_while and Path(config.sleep_while).exists():
        time.sleep(0.05)


def run(config, run_dir):
    if runs_of(config)[0].lr == config.die_at:
        os._exit(1)
    if config.started:
        mark_start(config)
    if config.hold:
        meet(config)
    if config.text:
        raise ConfigError(f"corpus file {config.text} does not exist")
    out = {}
    for spec in runs_of(config):
        if spec.lr == config.crash_at:
            raise RuntimeError(f"trial at {spec.lr} crashed on purpose")
        optimum = config.sgd_optimum if spec.optimizer == "sgd" else config.adam_optimum
        value = objective(spec.lr, optimum, config.seed)
        diverged = spec.lr > config.diverge_above
        curve = {"step": [1, 2, 3], "value": [value + 2, value + 1, value]}
        value = math.inf if spec.lr < config.miss_below else value
        out[spec.label] = {"value": math.nan if diverged else value, "curve": curve}
    status = "diverged" if all(math.isnan(r["value"]) for r in out.values()) else "ok"
    return {"status": status, "runs": out, "torch_threads": torch.get_num_threads()}


OBJECTIVES = {
    "value": Objective(
        "the known function of η",
        "min",
        lambda results: only_run(results["runs"])["value"],
        curve=lambda results: (only_run(results["runs"])["curve"]["step"], only_run(results["runs"])["curve"]["value"]),
    )
}


def trainee(config, spec):
    """A run to probe for ``--lr-from suggest``: ½·curvature·w² from w = 1, whose edge for SGD is 2/curvature."""
    from torch import nn

    from optiscope.experiments import Trainee

    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return Trainee(model, lambda m, c: 0.5 * c * m.weight.sum() ** 2, [torch.tensor(config.curvature)], 400, 1)


def without_wall_times(results: dict) -> dict:
    """A sweep's results with the trials' wall times left out (the only numbers that may differ)."""
    return {**results, "trials": [{k: v for k, v in t.items() if k != "wall_seconds"} for t in results["trials"]]}
