"""``optiscope sweep``: a fair optimizer comparison — each optimizer's learning rate tuned on a grid
that grows until the best is interior, then several seeds — run on a local process pool or on Ray.

* ``grid`` — the protocol, as pure functions of the measurements;
* ``trial`` — one optimizer at one learning rate and seed, an ordinary run directory of the experiment;
* ``backends`` — a local process pool, or Ray tasks;
* ``stats`` — mean ± std, bootstrap intervals, differences beyond seed noise;
* ``results`` — the ``Results`` of a sweep's results.json;
* ``sweep`` — ``run_sweep``: the directory, the rounds of trials, resume.

The objectives come from the experiments (``OBJECTIVES`` in each module that trains).
"""

from .results import Results
from .sweep import RESERVED, SweepConfig, check, run_sweep

__all__ = ["RESERVED", "Results", "SweepConfig", "check", "run_sweep"]
