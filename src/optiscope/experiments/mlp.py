"""Experiment ``mlp``: a small MLP classifier on generated data, trained in mini-batches by each optimizer.

A fixed random "teacher" (one hidden ReLU layer) labels Gaussian inputs x ~ N(0, I) with the class of its largest
output; a share ``label_noise`` of the labels is then replaced by a uniformly drawn class, so that no student fits
them all. A fresh "student" MLP (``depth`` hidden ReLU layers of ``width`` units) learns them with the
cross-entropy loss from mini-batches of a fixed training set, at a constant learning rate, with no gradient
clipping; a held-out set of the same distribution gives the validation loss and accuracy. It trains in seconds on a
CPU with nothing to download, and it differs from ``lm`` and ``adder`` on purpose — no attention, no schedule, no
clipping, a classification loss —: it is the task that no calibration of
[`suggest_lr`][optiscope.suggest.suggest_lr] saw, and what ``optiscope sweep mlp`` tunes is the final validation
loss.

Every optimizer starts from the same initial weights and sees the same batches in the same order (both drawn from
``seed``; the data from ``data_seed``, so that the sweep's seeds change the weights and the batch order, not the
task). Training goes through ``optiscope.train`` (checkpoints, exact resume, divergence handling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
from rich.console import Console
from torch import Tensor, nn

from .. import runs, train
from ..monitor import DivergenceGuard, Monitor, run_directory_sinks
from ..optim import RECIPES, build_optimizer
from ..optim.recipes import RunSpec, parse_runs, recipe
from ..runs import checkpoint_name
from ..train.loop import new_history
from ..train.progress import Progress
from . import (
    NO_EFFECT,
    Objective,
    Trainee,
    only_run,
    optimizers_help,
    require,
    require_counts,
    require_non_negative,
    require_threads,
    torch_threads,
)
from .objective import VALIDATION_LOSS
from .ranking import Ranking, rank

SUMMARY = "A small MLP classifier on generated data (a random teacher's labels), mini-batches, constant lr"

#: Every recipe but plain Muon (the student has biases) and muon+adamw.
OPTIMIZERS = tuple(name for name in RECIPES if name not in ("muon", "muon+adamw"))
#: The learning rate of a run that names none: a usual one per recipe (not tuned here).
LEARNING_RATES = {
    "sgd": 0.1,
    "momentum": 0.01,
    "nesterov": 0.01,
    "rmsprop": 1e-3,
    "adam": 1e-3,
    "adam-no-bc": 1e-3,
    "adamw": 1e-3,
    "adaml2": 1e-3,
    "lion": 1e-4,
}


@dataclass
class Config:
    optimizers: str = field(
        default="momentum,adamw",
        metadata={"help": optimizers_help("runs as optimizer[@lr], comma-separated", LEARNING_RATES)},
    )
    inputs: int = field(default=32, metadata={"help": "input dimension (features)"})
    classes: int = field(default=10, metadata={"help": "classes (the teacher's outputs)"})
    teacher_width: int = field(default=64, metadata={"help": "units in the teacher's hidden layer"})
    width: int = field(default=128, metadata={"help": "units in each of the student's hidden layers"})
    depth: int = field(default=2, metadata={"help": "the student's hidden layers"})
    examples: int = field(default=16384, metadata={"help": "training examples (a fixed set, drawn from in batches)"})
    val_examples: int = field(default=4096, metadata={"help": "held-out examples for the validation loss"})
    label_noise: float = field(default=0.1, metadata={"help": "share of labels replaced by a random class"})
    batch_size: int = field(default=32, metadata={"help": "examples per batch"})
    steps: int = field(default=1000, metadata={"help": "training steps per run"})
    weight_decay: float = field(default=0.01, metadata={"help": "λ, for the optimizers that decay"})
    eval_every: int = field(default=100, metadata={"help": "validation loss and accuracy every N steps"})
    log_every: int = field(
        default=50, metadata={"help": "the monitor's record (mean loss, g, w, u, ...) every N steps"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the initial weights and the batch order"})
    data_seed: int = field(default=0, metadata={"help": "seed of the teacher and the examples"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads (small models run best on one)", **NO_EFFECT})
    quiet: bool = field(default=False, metadata={"help": "print nothing while training", **NO_EFFECT})

    def __post_init__(self) -> None:
        runs_of(self)
        counts = ("inputs", "teacher_width", "width", "depth", "examples", "val_examples", "batch_size", "steps")
        require_counts(self, *counts, "eval_every", "log_every")
        require_counts(self, "classes", minimum=2)
        require_threads(self)
        require_non_negative(self, "weight_decay")
        require(0 <= self.label_noise < 1, f"--label-noise={self.label_noise!r} must be in [0, 1)")
        require(
            self.batch_size <= self.examples,
            f"--batch-size={self.batch_size} exceeds --examples={self.examples}, the training set it is drawn from",
        )


QUICK = dict(steps=300, examples=1024, val_examples=512, eval_every=50)


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, LEARNING_RATES, OPTIMIZERS)


class Evaluations(TypedDict):
    step: list[int]
    val_loss: list[float]
    accuracy: list[float]


class RunResults(TypedDict):
    optimizer: str
    lr: float
    setting: str
    status: str
    divergence: dict[str, Any] | None
    step: int
    train: dict[str, list[float]]
    eval: Evaluations
    final: dict[str, float]


class Results(TypedDict):
    status: str
    task: dict[str, Any]
    runs: dict[str, RunResults]
    ranking: NotRequired[Ranking]  # the runs by final validation loss, those that diverged left out


#: What ``optiscope sweep mlp`` tunes for: the last evaluation's validation loss.
OBJECTIVES = {
    "val_loss": VALIDATION_LOSS,
    "accuracy": Objective(
        "final validation accuracy", "max", lambda results: only_run(results["runs"])["final"]["accuracy"]
    ),
}


# ------------------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Data:
    x: Tensor
    y: Tensor
    val_x: Tensor
    val_y: Tensor


def make_data(config: Config) -> Data:
    """The teacher's labelled examples (``data_seed``): training and held-out sets of one distribution."""
    g = torch.Generator().manual_seed(config.data_seed)
    hidden = torch.randn(config.inputs, config.teacher_width, generator=g) / math.sqrt(config.inputs)
    out = torch.randn(config.teacher_width, config.classes, generator=g) / math.sqrt(config.teacher_width)

    def labelled(n: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, config.inputs, generator=g)
        y = (torch.relu(x @ hidden) @ out).argmax(1)
        noisy = torch.rand(n, generator=g) < config.label_noise
        y = torch.where(noisy, torch.randint(config.classes, (n,), generator=g), y)
        return x, y

    x, y = labelled(config.examples)
    return Data(x, y, *labelled(config.val_examples))


def student(config: Config) -> nn.Module:
    """The student: ``depth`` hidden ReLU layers of ``width`` units, then the class scores."""
    layers: list[nn.Module] = []
    fan_in = config.inputs
    for _ in range(config.depth):
        layers += [nn.Linear(fan_in, config.width), nn.ReLU()]
        fan_in = config.width
    return nn.Sequential(*layers, nn.Linear(fan_in, config.classes))


def cross_entropy(net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """The training loss: mean cross-entropy of the class scores."""
    x, y = batch
    return nn.functional.cross_entropy(net(x), y)


def draw_batch(data: Data, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch_size`` training examples drawn uniformly, with replacement across batches."""
    rows = torch.randint(len(data.y), (batch_size,), generator=generator)
    return data.x[rows], data.y[rows]


class Classification(train.Task):
    """Mini-batches of the training set; the held-out set scored at every evaluation."""

    def __init__(self, data: Data, config: Config) -> None:
        self.data, self.config = data, config

    def batch(self, step: int, data: torch.Generator) -> tuple[Tensor, Tensor]:
        return draw_batch(self.data, self.config.batch_size, data)

    def loss(self, net: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return cross_entropy(net, batch)

    def evaluate(self, run: train.Run) -> bool:
        with torch.no_grad():
            scores = run.model(self.data.val_x)
            loss = float(nn.functional.cross_entropy(scores, self.data.val_y))
            accuracy = float((scores.argmax(1) == self.data.val_y).float().mean())
        e = run.history["eval"]
        e["step"].append(run.step)
        e["val_loss"].append(loss)
        e["accuracy"].append(accuracy)
        return False

    def evaluation_fault(self, run: train.Run) -> str | None:
        loss = run.history["eval"]["val_loss"][-1]
        return None if math.isfinite(loss) else f"validation loss {loss} at the evaluation after step {run.step}"

    def finish(self, run: train.Run) -> None:
        e = run.history["eval"]
        run.history["final"] = {
            "val_loss": e["val_loss"][-1] if e["val_loss"] else math.nan,
            "accuracy": e["accuracy"][-1] if e["accuracy"] else math.nan,
        }

    def summary(self, run: train.Run) -> str:
        h = run.history
        ending = "finished" if h["status"] == "ok" else f"diverged at step {h['divergence']['step']}"
        final = h["final"]
        return f"{run.label}: {ending}; validation loss {final['val_loss']:.4f}, accuracy {final['accuracy']:.3f}"


def initial_model(config: Config) -> nn.Module:
    """The student as every run starts it (drawn from ``seed``)."""
    torch.manual_seed(config.seed)
    return student(config)


def batch_order(config: Config) -> torch.Generator:
    """The generator every run draws its batches from, in the same order."""
    return torch.Generator().manual_seed(1_000_003 * config.seed + 7)


def trainee(config: Config, spec: RunSpec) -> Trainee:
    """What a learning-rate suggestion probes for ``spec``'s optimizer: the run's model, loss, batches and optimizer."""
    data = make_data(config)
    order = batch_order(config)
    return Trainee(
        model=initial_model(config),
        loss_fn=cross_entropy,
        batches=(draw_batch(data, config.batch_size, order) for _ in range(config.steps)),
        steps=config.steps,
        batch_size=config.batch_size,
        weight_decay=config.weight_decay,
    )


def run(config: Config, run_dir: Path) -> Results:
    with torch_threads(config.threads):
        return train_all(config, Path(run_dir))


def train_all(config: Config, run_dir: Path) -> Results:
    data = make_data(config)
    initial = initial_model(config).state_dict()
    console = Console(quiet=config.quiet, soft_wrap=True)
    progress = Progress(console, enabled=not config.quiet)
    plan = train.Plan(config.steps, None, config.eval_every, eval_at_start=True, checkpoint_every=config.eval_every)
    task = Classification(data, config)
    results_runs: dict[str, Any] = {}
    for spec in runs_of(config):
        model = student(config)
        model.load_state_dict(initial)
        optimizer = build_optimizer(spec.optimizer, model, spec.lr, config.weight_decay)
        monitor = Monitor(
            model,
            optimizer,
            every=config.log_every,
            sinks=run_directory_sinks(run_dir, spec.label),
            batch_tokens=config.batch_size,
            guard=DivergenceGuard(),
            context={"run": spec.label},
        )
        history = new_history(
            optimizer=spec.optimizer,
            lr=spec.lr,
            setting=recipe(spec.optimizer).describe(),
            eval={"step": [], "val_loss": [], "accuracy": []},
        )
        trainee_run = train.Run(spec.label, model, optimizer, batch_order(config), None, monitor, history)
        path = run_dir / runs.CHECKPOINTS / checkpoint_name(spec.label)
        results_runs[spec.label] = train.train(trainee_run, task, plan, path, progress=progress)
    statuses = [r["status"] for r in results_runs.values()]
    return {
        "status": "diverged" if all(s == "diverged" for s in statuses) else "ok",
        "task": {
            "inputs": config.inputs,
            "classes": config.classes,
            "examples": config.examples,
            "val_examples": config.val_examples,
            "label_noise": config.label_noise,
            "parameters": sum(p.numel() for p in student(config).parameters()),
        },
        "runs": results_runs,
        "ranking": rank(
            {k: r["final"]["val_loss"] if r["status"] == "ok" else None for k, r in results_runs.items()},
            "final validation loss",
            "min",
        ),
    }
