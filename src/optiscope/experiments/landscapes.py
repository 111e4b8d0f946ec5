"""Landscapes: the classic optimizer pictures, measured — why each step from SGD to AdamW exists.

Three parts, each drawn as its own figure:

1. **Descent on three 2-D surfaces** (``surfaces.py``: an ill-conditioned ravine with condition number κ,
   a flat saddle, Rosenbrock's valley). Every optimizer runs over the same grid of learning rates from the
   same start; the figure shows the path of each optimizer's best learning rate on the contours, and a
   table gives the steps it needed to reach f − f* ≤ tolerance (or says it did not).
2. **Bias correction** (``bias_correction.py``): Adam with and without it on the seed's f(x) = x².
3. **AdamW vs Adam+L2** (``weight_decay.py``): final weight distributions and effective decay per
   parameter on a regression whose parameter groups see different gradient scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np
import torch

from ..checks import finite, is_count, positive
from ..contracts import Positive
from ..optim import RECIPES
from ..optim.recipes import RunSpec, parse_runs, recipe
from . import (
    NO_EFFECT,
    Objective,
    only_run,
    optimizers_help,
    require,
    require_counts,
    require_non_negative,
    require_positive,
    require_rates,
)
from .bias_correction import bias_correction_story
from .descent import best_run, descend, log_sampled, thin_path
from .ranking import Ranking, rank
from .surfaces import Surface, surfaces
from .weight_decay import weight_decay_story

SUMMARY = "SGD → momentum → Adam → AdamW on a ravine, a saddle and Rosenbrock; bias correction; AdamW vs Adam+L2"

#: Muon is left out: θ here is a 2-vector, and Muon orthogonalises matrices.
DESCENT_OPTIMIZERS = tuple(name for name in RECIPES if not name.startswith("muon"))
#: Side length of the grid of f − f* values stored for the contour plots.
CONTOUR_GRID = 90


@dataclass
class Config:
    steps: int = field(default=20000, metadata={"help": "step budget of each descent run"})
    condition_number: float = field(default=100.0, metadata={"help": "κ of the ravine ½(x² + κy²)"})
    tolerance: float = field(default=1e-6, metadata={"help": "a run has converged once f − f* ≤ tolerance"})
    lrs: tuple[float, ...] = field(
        default=(1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0),
        metadata={"help": "learning rates η every optimizer is run over (its best is shown)"},
    )
    optimizers: str = field(
        default="sgd,momentum,nesterov,rmsprop,adam,adamw,lion",
        metadata={
            "help": optimizers_help(
                "optimizers on the surfaces, each over the grid (name@lr: at that lr only)", DESCENT_OPTIMIZERS
            )
        },
    )
    weight_decay: float = field(default=0.01, metadata={"help": "λ on the surfaces, for the optimizers that decay"})
    bias_lr: float = field(default=0.05, metadata={"help": "η of the bias-correction runs on f(x) = x²"})
    bias_start: float = field(default=3.0, metadata={"help": "x₀ of the bias-correction runs"})
    bias_steps: int = field(default=1000, metadata={"help": "steps of the bias-correction runs"})
    decay_lr: float = field(default=0.01, metadata={"help": "η of the AdamW vs Adam+L2 runs"})
    decay_lambda: float = field(default=0.1, metadata={"help": "λ of the AdamW vs Adam+L2 runs"})
    decay_steps: int = field(default=3000, metadata={"help": "steps of the AdamW vs Adam+L2 runs"})
    group_scales: tuple[float, ...] = field(
        default=(0.1, 1.0, 10.0), metadata={"help": "feature scale s of each parameter group"}
    )
    weights_per_group: int = field(default=100, metadata={"help": "weights in each parameter group (at least 4)"})
    seed: int = field(default=0, metadata={"help": "seed of the regression data"})
    # taken by every experiment (one command line silences any); this one prints nothing while it runs anyway
    quiet: bool = field(default=False, metadata={"help": "print nothing while working (it never does)", **NO_EFFECT})

    def __post_init__(self) -> None:
        require_counts(self, "steps", "bias_steps", "decay_steps")
        require(
            is_count(self.weights_per_group, 4),
            f"--weights-per-group={self.weights_per_group!r} must be an integer >= 4 (each group's skewness and "
            "kurtosis need at least 4 weights; fewer divide by a zero variance)",
        )
        require_positive(self, "tolerance", "bias_lr", "decay_lr")
        require(
            finite(self.condition_number) and self.condition_number >= 1,
            f"--condition-number={self.condition_number!r} must be a finite number >= 1",
        )
        require(
            finite(self.bias_start) and self.bias_start != 0,
            f"--bias-start={self.bias_start!r} must be a finite number other than 0 (the minimum)",
        )
        require_non_negative(self, "weight_decay", "decay_lambda")
        self.lrs = require_rates(self, "lrs")
        self.group_scales = tuple(self.group_scales)
        bad = [s for s in self.group_scales if not positive(s)]
        require(self.group_scales and not bad, f"--group-scales={self.group_scales!r}: give finite numbers > 0")
        names = [item.strip().partition("@")[0] for item in str(self.optimizers).split(",")]
        require(
            not any(n.startswith("muon") for n in names),
            "--optimizers: muon is not offered here (θ is a 2-vector and Muon orthogonalises matrices); "
            f"valid: {', '.join(DESCENT_OPTIMIZERS)}",
        )
        runs_of(self)


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    """The optimizers on the surfaces; one named with an lr runs at that lr only, the others over ``lrs``."""
    return parse_runs(config.optimizers, None, DESCENT_OPTIMIZERS)


#: Where a sweep centres its grid: every optimizer here runs over ``lrs`` by default, and 0.03 is near its
#: geometric middle on a log scale (1e-3 … 1 spans three decades).
DEFAULT_LR = 0.03


def steps_to_tolerance(surface: str):
    """The objective 'steps to f − f* ≤ tolerance on ``surface``' (None: not reached in the budget)."""
    return lambda results: only_run(results["surfaces"][surface]["runs"])["reached_at"]


#: What ``optiscope sweep landscapes`` tunes for, one objective per surface.
OBJECTIVES = {
    f"steps_{name}": Objective(f"steps to f − f* ≤ tolerance on the {name}", "min", steps_to_tolerance(name))
    for name in ("ravine", "saddle", "rosenbrock")
}


QUICK = dict(steps=1500, lrs=(1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0), decay_steps=1000)


def plot_extent(extent: tuple[float, float, float, float], paths: list[list[list[float]]]) -> list[float]:
    """The surface's plot extent widened to hold every path with a 4% margin, but by at most half its
    width (height) on each side: one wild first step should not shrink the picture of everything else
    (a path that goes further leaves the frame, visibly)."""
    x_min, x_max, y_min, y_max = extent
    width, height = x_max - x_min, y_max - y_min
    points = np.asarray([point for path in paths for point in path], dtype=np.float64).reshape(-1, 2)
    if len(points):
        x_min = max(min(x_min, points[:, 0].min() - 0.04 * width), x_min - width / 2)
        x_max = min(max(x_max, points[:, 0].max() + 0.04 * width), x_max + width / 2)
        y_min = max(min(y_min, points[:, 1].min() - 0.04 * height), y_min - height / 2)
        y_max = min(max(y_max, points[:, 1].max() + 0.04 * height), y_max + height / 2)
    return [float(x_min), float(x_max), float(y_min), float(y_max)]


def contour_grid(surface: Surface, extent: list[float]) -> dict[str, Any]:
    """f − f* on a CONTOUR_GRID² grid over ``extent`` (what the contours are drawn from)."""
    x_min, x_max, y_min, y_max = extent
    xs = torch.linspace(x_min, x_max, CONTOUR_GRID, dtype=torch.float64)
    ys = torch.linspace(y_min, y_max, CONTOUR_GRID, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)
    gap = surface.f(grid) - surface.f_star
    return {"x": xs.tolist(), "y": ys.tolist(), "gap": [[float(f"{v:.5g}") for v in row] for row in gap.tolist()]}


def surface_results(surface: Surface, config: Config) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for spec in runs_of(config):
        lrs = list(config.lrs) if spec.lr is None else [spec.lr]
        found = descend(surface, spec.optimizer, lrs, config.steps, config.tolerance, config.weight_decay)
        best = best_run(found)
        runs[spec.label] = {
            "optimizer": spec.optimizer,
            "setting": recipe(spec.optimizer).describe(),
            "grid": [
                {"lr": lr, "reached_at": reached, "diverged_at": diverged, "final_gap": gap}
                for lr, reached, diverged, gap in zip(
                    found["lrs"], found["reached_at"], found["diverged_at"], found["final_gap"], strict=True
                )
            ],
            "best_lr": None if best is None else found["lrs"][best],
            "reached_at": None if best is None else found["reached_at"][best],
            "final_gap": None if best is None else found["final_gap"][best],
            "end": None if best is None else found["path"][best][-1].tolist(),
            "path": None if best is None else thin_path(found["path"][best], surface.extent),
            "gap_curve": None if best is None else log_sampled(found["gap"][best]),
        }
    extent = plot_extent(surface.extent, [run["path"] for run in runs.values() if run["path"] is not None])
    reached = {label: run["reached_at"] for label, run in runs.items() if run["reached_at"] is not None}
    return {
        "fastest": [label for label, steps in reached.items() if steps == min(reached.values())],
        "ranking": rank(
            {label: run["reached_at"] for label, run in runs.items()},
            f"steps to f − f* ≤ {config.tolerance:g} at each optimizer's best η",
            "min",
        ),
        "formula": surface.formula,
        "start": list(surface.start),
        "minima": [list(m) for m in surface.minima],
        "f_star": surface.f_star,
        "extent": extent,
        "contours": contour_grid(surface, extent),
        "runs": runs,
    }


class DescentRun(TypedDict):
    optimizer: str
    setting: str
    grid: list[dict[str, Any]]
    best_lr: float | None
    reached_at: int | None
    final_gap: float | None
    end: list[float] | None
    path: list[list[float]] | None
    gap_curve: dict[str, list] | None


class SurfaceResults(TypedDict):
    fastest: list[str]
    ranking: NotRequired[Ranking]  # the optimizers by their steps to the tolerance (absent before it existed)
    formula: str
    start: list[float]
    minima: list[list[float]]
    f_star: float
    extent: list[float]
    contours: dict[str, Any]
    runs: dict[str, DescentRun]


class Results(TypedDict):
    status: str  # "diverged" when every run on every surface diverged, else "ok"
    steps: int
    tolerance: Positive
    lrs: list[Positive]
    condition_number: Positive
    surfaces: dict[str, SurfaceResults]
    bias_correction: dict[str, Any]
    weight_decay: dict[str, Any]


def run(config: Config, run_dir: Path) -> Results:
    found = {name: surface_results(surface, config) for name, surface in surfaces(config.condition_number).items()}
    grids = [point for surface in found.values() for run in surface["runs"].values() for point in run["grid"]]
    return {
        "status": "diverged" if all(point["diverged_at"] is not None for point in grids) else "ok",
        "steps": config.steps,
        "tolerance": config.tolerance,
        "lrs": list(config.lrs),
        "condition_number": config.condition_number,
        "surfaces": found,
        "bias_correction": bias_correction_story(config.bias_lr, config.bias_start, config.bias_steps),
        "weight_decay": weight_decay_story(
            group_scales=config.group_scales,
            weights_per_group=config.weights_per_group,
            lr=config.decay_lr,
            weight_decay=config.decay_lambda,
            steps=config.decay_steps,
            seed=config.seed,
        ),
    }
