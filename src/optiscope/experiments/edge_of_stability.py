"""Experiment ``edge-of-stability``: sharpness against each optimizer's own stability threshold.

Measures, on a task of its own, the central observations of Cohen et al., ICLR 2021 ("Gradient Descent
on Neural Networks Typically Occurs at the Edge of Stability") and Cohen et al., 2022 ("Adaptive Gradient Methods at the
Edge of Stability"): under full-batch training the sharpness λ₁(H) first rises (progressive sharpening)
until it reaches the optimizer's threshold — 2/η for gradient descent, (2 + 2β)/η for heavy-ball
momentum — and then hovers there while the loss keeps falling, non-monotonically; for Adam the
*preconditioned* sharpness λ₁(P⁻¹H), P = diag(√v̂ + ε), does the same at (2 + 2β₁)/((1 − β₁)η) = 38/η.

The task is synthetic and ships as code: a fixed tanh "teacher" network labels ``examples`` Gaussian
inputs, and a two-hidden-layer tanh "student" fits them with the squared loss, full-batch. Cohen et al.
use tanh networks, the squared loss and a 5,000-image CIFAR-10 subset; what the phenomenon needs is
full-batch steps and a network that must sharpen to fit, which a teacher–student regression has in
seconds on a CPU, with no data to download. The teacher's scale is set so that the student sharpens by
a factor of about three before it fits (full-batch GD at η = 0.1, whose 2/η it never reaches: about 5 to
15 in 5,000 steps), and its width, 128, so that heavy-ball momentum sharpens to its (2 + 2β)/η too: with a
teacher 32 wide the student fitted while momentum's sharpness was still below that threshold at every η
tried that did not start above it, 0.1 to 0.33 (measured; the README has the numbers).

Training goes through ``optiscope.train.train`` with the monitor's curvature instrument attached
(``Monitor(..., curvature=Curvature(full_batch, loss, every=measure_every))``), so each run also has
``metrics.jsonl`` with the agreed curvature keys, checkpoints and exact resume. Results per run: the
measured steps, (preconditioned) sharpness, its ratio to the threshold, the loss, and the *equilibrium
ratio*: the median sharpness/threshold from the first measurement at ≥ ``edge`` × threshold to the end.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from .. import runs, train
from ..contracts import Positive
from ..curvature import stability_threshold
from ..monitor import Curvature, Monitor, run_directory_sinks
from ..optim import build_optimizer
from ..optim.recipes import RunSpec, parse_runs, recipe
from ..runs import checkpoint_name
from ..train.loop import new_history
from ..train.progress import Progress
from . import (
    NO_EFFECT,
    optimizers_help,
    require,
    require_counts,
    require_non_negative,
    require_threads,
    torch_threads,
)

SUMMARY = "Full-batch GD, momentum and Adam: (preconditioned) sharpness against 2/η, 3.8/η, 38/η (edge of stability)"

#: Learning rates for names given without @lr (each reaches its threshold in the default number of steps).
LEARNING_RATES = {"sgd": 0.2, "momentum": 0.3, "nesterov": 0.1, "adam": 0.01, "adamw": 0.01, "adaml2": 0.01}


@dataclass
class Config:
    optimizers: str = field(
        default="sgd@0.2,sgd@0.3,sgd@0.5,momentum@0.3,adam@0.003,adam@0.01",
        metadata={"help": optimizers_help("runs as optimizer[@lr]", LEARNING_RATES, "recipes with a known threshold")},
    )
    steps: int = field(default=2500, metadata={"help": "full-batch steps per run"})
    measure_every: int | None = field(
        default=None,
        metadata={
            "help": "sharpness every N steps (Lanczos, warm-started; default: a 70th of --steps, from 1 to 20)",
            "follows": "--steps",
        },
    )
    examples: int = field(default=256, metadata={"help": "training examples (the full batch)"})
    inputs: int = field(default=8, metadata={"help": "input dimension (features)"})
    outputs: int = field(default=4, metadata={"help": "output dimension (targets)"})
    width: int = field(default=64, metadata={"help": "units in each of the student's two hidden layers"})
    teacher_width: int = field(default=128, metadata={"help": "units in the teacher's hidden layer"})
    weight_decay: float = field(
        default=0.0, metadata={"help": "λ of the recipes that decay (adamw, adaml2; with λ = 0 they are adam)"}
    )
    tol: float = field(default=1e-3, metadata={"help": "Lanczos: relative residual of the top eigenpair"})
    edge: float = field(
        default=0.9, metadata={"help": "a run 'reached its edge' at sharpness >= edge × threshold (a ratio)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the data, the teacher and the initial weights"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads (tiny models run best on one)", **NO_EFFECT})
    quiet: bool = field(default=False, metadata={"help": "print nothing while training", **NO_EFFECT})

    def __post_init__(self) -> None:
        runs_of(self)
        require_counts(self, "steps")
        if self.measure_every is None:  # follows --steps, so that a short run needs no --measure-every of its own
            self.measure_every = min(20, max(1, self.steps // 70))
        require_counts(self, "measure_every", "inputs", "outputs", "width", "teacher_width")
        require_threads(self)
        require_counts(self, "examples", minimum=2)  # the targets are scaled by their std
        require_non_negative(self, "weight_decay")
        require(0 < self.tol < 1, f"--tol={self.tol!r} must be in (0, 1)")
        require(0 < self.edge <= 1, f"--edge={self.edge!r} must be in (0, 1]")
        require(
            self.measure_every <= self.steps,
            f"--measure-every={self.measure_every} exceeds --steps={self.steps}: nothing would be measured",
        )


QUICK = dict(optimizers="sgd@0.3,sgd@0.5,momentum@0.3,adam@0.01", steps=700)  # measured every 10 steps


class RunResults(TypedDict):
    label: str
    optimizer: str
    lr: Positive
    threshold: float | None
    threshold_label: str
    preconditioned: bool
    status: str
    divergence: dict[str, Any] | None
    step: list[int]
    sharpness: list[float]
    ratio: list[float | None]
    loss: list[float]
    hvps: list[int]
    edge_step: int | None
    equilibrium: float | None
    max_ratio: float | None


class Results(TypedDict):
    status: str
    task: dict[str, Any]
    steps: int
    measure_every: int
    edge: float
    runs: list[RunResults]


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, LEARNING_RATES)


# ------------------------------------------------------------------------------------------------ task
def teacher_data(config: Config) -> tuple[Tensor, Tensor]:
    """``examples`` inputs x ~ N(0, I) and targets from a random tanh network, scaled to unit variance."""
    g = torch.Generator().manual_seed(config.seed)
    x = torch.randn(config.examples, config.inputs, generator=g)
    w1 = torch.randn(config.inputs, config.teacher_width, generator=g) * 1.5 / config.inputs**0.5
    w2 = torch.randn(config.teacher_width, config.outputs, generator=g) * 1.5 / config.teacher_width**0.5
    y = torch.tanh(x @ w1) @ w2
    return x, y / y.std()


def student(config: Config) -> nn.Module:
    torch.manual_seed(config.seed + 1)
    return nn.Sequential(
        nn.Linear(config.inputs, config.width),
        nn.Tanh(),
        nn.Linear(config.width, config.width),
        nn.Tanh(),
        nn.Linear(config.width, config.outputs),
    )


def square_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """½ ‖f(x) − y‖² averaged over the examples (Cohen et al.'s squared loss)."""
    x, y = batch
    return 0.5 * (model(x) - y).pow(2).sum(1).mean()


class FullBatch(train.Task):
    """Every step sees the whole training set; each monitor record with curvature is kept."""

    def __init__(self, data: tuple[Tensor, Tensor]) -> None:
        self.data = data

    def batch(self, step: int, data: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data

    def loss(self, net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return square_loss(net, batch)

    def on_record(self, run: train.Run, record: dict[str, Any]) -> None:
        if "sharpness" not in record:
            return
        h = run.history["curvature"]
        h["step"].append(record["step"])
        h["sharpness"].append(record["sharpness"])
        h["ratio"].append(record["sharpness/threshold"])
        h["loss"].append(record["loss"])
        h["hvps"].append(record["curvature"]["hvps"])


# ----------------------------------------------------------------------------------------------- train
def train_one(config: Config, spec: RunSpec, data: tuple[Tensor, Tensor], run_dir: Path, progress) -> RunResults:
    model = student(config)
    optimizer = build_optimizer(spec.optimizer, model, spec.lr, weight_decay=config.weight_decay)
    stability = stability_threshold(optimizer)
    curvature = Curvature(data, square_loss, every=config.measure_every, tol=config.tol, directions=())
    monitor = Monitor(
        model,
        optimizer,
        every=config.measure_every,
        sinks=run_directory_sinks(run_dir, spec.label),
        curvature=curvature,
        context={"run": spec.label},
    )
    history = new_history(curvature={"step": [], "sharpness": [], "ratio": [], "loss": [], "hvps": []})
    run = train.Run(spec.label, model, optimizer, torch.Generator().manual_seed(config.seed), None, monitor, history)
    checkpoint = Path(run_dir) / runs.CHECKPOINTS / checkpoint_name(spec.label)
    h = train.train(run, FullBatch(data), train.Plan(config.steps), checkpoint, progress=progress)
    c = h["curvature"]
    edge_step, equilibrium, max_ratio = summarize(c["step"], c["ratio"], config.edge)
    if h["status"] == "diverged":
        equilibrium = None  # a run that left its edge for good has no equilibrium there
    return {
        "label": spec.label,
        "optimizer": spec.optimizer,
        "lr": spec.lr,
        "threshold": stability.threshold,
        "threshold_label": stability.label,
        "preconditioned": stability.preconditioned,
        "status": h["status"],
        "divergence": h["divergence"],
        **c,
        "edge_step": edge_step,
        "equilibrium": equilibrium,
        "max_ratio": max_ratio,
    }


HELD = 3  # measurements in a row at the edge that make reaching it (one alone can be a start-up transient)


def summarize(
    steps: list[int], ratios: list[float | None], edge: float
) -> tuple[int | None, float | None, float | None]:
    """(edge step, median ratio from then on, largest ratio) — None where undefined. The edge step is the first
    measurement with ratio ≥ ``edge`` that the next ``HELD`` − 1 measurements hold too (a run that gets there
    in its last ``HELD`` − 1 measurements has not been seen to hold it): heavy-ball momentum's first
    measurements can overshoot for a moment before its sharpening has begun."""
    known = [(s, r) for s, r in zip(steps, ratios, strict=True) if r is not None and r == r]
    if not known:
        return None, None, None
    held = (i for i in range(len(known) - HELD + 1) if all(r >= edge for _, r in known[i : i + HELD]))
    first = next(held, None)
    largest = max(r for _, r in known)
    if first is None:
        return None, None, largest
    return known[first][0], statistics.median(r for _, r in known[first:]), largest


def run(config: Config, run_dir: Path) -> Results:
    with torch_threads(config.threads):
        return train_all(config, Path(run_dir))


def train_all(config: Config, run_dir: Path) -> Results:
    data = teacher_data(config)
    progress = Progress(enabled=not config.quiet)
    results = [train_one(config, spec, data, Path(run_dir), progress) for spec in runs_of(config)]
    return {
        "status": "diverged" if all(r["status"] == "diverged" for r in results) else "ok",
        "task": {
            "examples": config.examples,
            "inputs": config.inputs,
            "outputs": config.outputs,
            "width": config.width,
            "teacher_width": config.teacher_width,
            "parameters": sum(p.numel() for p in student(config).parameters()),
            "recipes": {s.label: recipe(s.optimizer).describe() for s in runs_of(config)},
            "weight_decay": config.weight_decay,
        },
        "steps": config.steps,
        "measure_every": config.measure_every,
        "edge": config.edge,
        "runs": results,
    }
