"""One trial: one optimizer at one learning rate and seed, run by the experiment's own ``execute`` (the
code ``optiscope run`` uses) into its own run directory, and read back as one record.

``run_trial`` is what every backend runs, in this process, a pool worker or a Ray worker: it takes and
returns plain data, never raises for a trial that failed (a crash is recorded with its error and the
traceback goes to the trial's ``error.log``), and continues a trial that was killed half-way from its
checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import experiments, runs
from ..errors import ConfigError
from ..optim.recipes import register_table

TRIALS = "trials"
STATUSES = ("ok", "diverged", "crashed")
#: the status of a trial whose experiment refused its input: never recorded, the sweep stops on it
REFUSED = "refused"


@dataclass(frozen=True)
class Trial:
    experiment: str
    #: the registry entry of ``experiment``: a worker process imports the module from it
    module: str
    optimizer: str
    lr: float
    seed: int
    quick: bool
    options: dict[str, Any]
    objectives: tuple[str, ...]
    out: str
    #: which of ``objectives`` the sweep tunes for (the record's ``objective``)
    primary: str = field(default="")
    #: the user's recipes the sweep's optimizers name, as a recipes file's entries (``optim.recipes.recipe_data``):
    #: registered in the process that runs the trial, a pool or Ray worker included
    recipes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.optimizer}@{self.lr:g}"


def trial_dir(root: Path, optimizer: str, lr: float, seed: int) -> Path:
    """``root/trials/<optimizer>@<lr>/seed-<seed>``."""
    return Path(root) / TRIALS / f"{optimizer}@{lr:g}" / f"seed-{seed}"


def trial_config(trial: Trial) -> Any:
    """The experiment's Config of this trial: the sweep's options, one optimizer at one lr, the seed."""
    module = experiments.load(trial.experiment)
    overrides = {**trial.options, "optimizers": trial.label, "seed": trial.seed}
    if "quiet" in {f.name for f in dataclasses.fields(module.Config)}:
        overrides["quiet"] = True
    return experiments.build_config(module, trial.quick, overrides)


def finished_results(out: Path, config: Any) -> dict[str, Any] | None:
    """The results of a trial that already finished in ``out`` with this very configuration (a sweep
    killed after the trial wrote them but before it recorded the trial), else None."""
    try:
        stored = runs.read_json(out / runs.CONFIG)
        results = runs.read_json(out / runs.RESULTS)
    except runs.RunDirError:
        return None
    return results if stored.get("config") == experiments.config_dict(config) else None


#: how long a trial waits for its folder to be let go by a process still stopping: a pool worker of a sweep that was
#: killed outright stops its trial after a complete step (``workers.stop_when_orphaned``), so a ``--resume`` at
#: once meets the folder in use for that long; past this, the trial is recorded as crashed (in use) and run again
#: by the next ``--resume``
HELD_FOLDER_WAIT_SECONDS = 120.0


def wait_until_let_go(out: Path, seconds: float = HELD_FOLDER_WAIT_SECONDS) -> None:
    """Return once no process holds the run directory ``out`` (``runs.in_progress``), or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while runs.in_progress(out) and time.monotonic() < deadline:
        time.sleep(0.1)


#: torch threads of every trial, whatever runs it: torch's results depend on its thread count (the order
#: of its reductions), so one count for all keeps ``--workers`` and ``--backend`` from changing a result
#: (more cores are used by running more trials at once: ``--workers``)
TRIAL_THREADS = 1


def identity(trial: Trial) -> dict[str, Any]:
    """The fields every record of ``trial`` starts with."""
    return {"optimizer": trial.optimizer, "lr": trial.lr, "seed": trial.seed, "label": trial.label}


def record_of(
    trial: Trial, status: str, error: str | None, values: dict[str, float], curve: Any, seconds: float
) -> dict[str, Any]:
    """``trial``'s record: how it ended, the value of each objective (the primary one as ``objective``), the
    primary objective's curve (its last step as ``steps``) and the seconds it took."""
    return {
        **identity(trial),
        "status": status,
        "error": error,
        "objective": values[trial.primary or trial.objectives[0]],
        "objectives": values,
        "steps": curve[0][-1] if curve and curve[0] else None,
        "curve": {"step": list(curve[0]), "value": list(curve[1])} if curve else None,
        "wall_seconds": round(seconds, 3),
    }


def crashed(trial: Trial, error: BaseException, seconds: float, trace: str | None = None) -> dict[str, Any]:
    """The record of ``trial`` that crashed with ``error``: the worst value of every objective, the first line of
    the error; ``trace`` (by default the error itself: a worker that died leaves no traceback) goes to the
    trial's ``error.log``."""
    out = Path(trial.out)
    out.mkdir(parents=True, exist_ok=True)
    said = f"{type(error).__name__}: {error}"
    runs.write_error_log(out, f"sweep trial {trial.label} seed {trial.seed}", trace or said + "\n")
    declared = experiments.objectives(trial.experiment)
    values = {name: declared[name].worst for name in trial.objectives}
    return record_of(trial, "crashed", said.splitlines()[0], values, None, seconds)


def run_trial(trial: Trial) -> dict[str, Any]:
    """Run ``trial`` (or continue it) on ``TRIAL_THREADS`` torch threads and return its record; never raises
    for a failed trial."""
    with experiments.torch_threads(TRIAL_THREADS):
        return _run_trial(trial)


def _run_trial(trial: Trial) -> dict[str, Any]:
    experiments.EXPERIMENTS.setdefault(trial.experiment, trial.module)
    out = Path(trial.out)
    started = time.perf_counter()
    declared = experiments.objectives(trial.experiment)
    primary = declared[trial.primary or trial.objectives[0]]
    try:
        register_table(trial.recipes, "the sweep's recipes")
        config = trial_config(trial)
        wait_until_let_go(out)
        results = finished_results(out, config)
        if results is None:
            results = experiments.execute(trial.experiment, config, out, resume=True, quick=trial.quick)
        values = {name: declared[name].value(results) for name in trial.objectives}
        curve = primary.curve(results) if primary.curve is not None else None
    except ConfigError as e:
        # an option the experiment refused only when it ran (a --text file that is not there): every trial
        # would meet it, so it is the sweep's bad input, not a crash of this trial (the sweep stops, exit 2);
        # another UserError (this trial's damaged checkpoint, its folder in use) is this trial's crash
        return {**identity(trial), "status": REFUSED, "error": " ".join(str(e).split())}
    except Exception as e:  # a crash of one trial is recorded; the sweep goes on
        return crashed(trial, e, time.perf_counter() - started, traceback.format_exc())
    status = "diverged" if results.get("status") == "diverged" else "ok"
    return record_of(trial, status, None, values, curve, time.perf_counter() - started)
