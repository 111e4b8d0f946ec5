r"""Rare tokens: SGD leaves rarely seen tokens untrained, Adam's per-token step size does not.

The model has one weight w_k per token k (a K×1 embedding table) and every true weight is w* = 1. Each
step draws a batch of B token occurrences k_1 … k_B independently from the frequencies p, with targets
y_i = w* + σξ_i (ξ_i standard normal), and takes the squared error

    L(w) = 1/(2B) Σ_i (w_{k_i} − y_i)²,   so   g_k = (c_k w_k − Σ_{i: k_i = k} y_i) / B,

where c_k counts token k in the batch. A token's weight gets gradient only in the batches it appears in,
and on average g_k = p_k (w_k − w*): SGD moves token k at the rate η p_k, so a token a thousand times
rarer needs a thousand times more steps. Adam divides by √v̂_k, the RMS of token k's own gradients, so
its effective learning rate η / (√v̂_k + ε) grows as the token gets rarer and its step is set by η
whatever p_k is.

Every optimizer runs at the same nominal η (unless ``--optimizers`` gives one its own, as ``name@lr``)
on the same data stream (same batches, same targets), from w = 0. A sweep over η then asks whether SGD
can be rescued by a larger learning rate, and at what cost to the common tokens (their jitter around w*, or divergence).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
from torch import Tensor

from ..checks import positive
from ..contracts import Positive
from ..monitor.stats import loglog_fit
from ..optim import RECIPES
from ..optim.recipes import RunSpec, build_optimizer, parse_runs, recipe
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
from .ranking import Ranking, rank

SUMMARY = "SGD vs Adam (and every optimizer) on rare tokens: frequency bias, effective LR, an LR sweep"

TRUE_WEIGHT = 1.0
#: A token counts as learned when the RMS of w − w* over the last quarter of training is at most this.
LEARNED_WITHIN = 0.1
#: A run has diverged once any |w − w*| exceeds this (or is not finite).
DIVERGED_BEYOND = 1e3
#: Divergence is checked every this many steps, for every step in between.
DIVERGENCE_CHECK_EVERY = 64
#: How many points of each weight trajectory results.json keeps (evenly spaced steps).
TRAJECTORY_POINTS = 500
#: Modelling decisions that results.json (and the figures) state next to the numbers.
NOTES = {
    "muon": "the weights are one K×1 matrix (an embedding table of width 1); orthogonalising a single column "
    "only rescales it to a fixed norm, so Muon here is Nesterov momentum normalised across all tokens together"
}
#: Zipf's law (frequency ∝ 1/rank) at ranks 1, 4, 16, 64, 256, 1024: six tokens over three decades.
ZIPF_RANKS = (1, 4, 16, 64, 256, 1024)


#: Every recipe but muon+adamw, which needs a model to split (the weights here are one table).
OPTIMIZERS = tuple(name for name in RECIPES if name != "muon+adamw")


def zipf_frequencies(ranks: tuple[int, ...]) -> tuple[float, ...]:
    """Frequencies ∝ 1/rank, normalised over the given ranks."""
    total = sum(1 / r for r in ranks)
    return tuple((1 / r) / total for r in ranks)


@dataclass
class Config:
    steps: int = field(default=8000, metadata={"help": "training steps per run"})
    batch_size: int = field(default=32, metadata={"help": "token occurrences per batch (B)"})
    lr: float = field(default=0.01, metadata={"help": "the nominal learning rate η every optimizer gets"})
    frequencies: tuple[float, ...] = field(
        default=zipf_frequencies(ZIPF_RANKS),
        metadata={"help": "token frequencies, summing to 1 (default: Zipf ranks 1, 4, 16, 64, 256, 1024)"},
    )
    label_noise: float = field(default=0.3, metadata={"help": "standard deviation σ of the target noise"})
    optimizers: str = field(
        default="sgd,momentum,rmsprop,adam,adamw,lion,muon",
        metadata={
            "help": optimizers_help("runs as optimizer[@lr] (the SGD-vs-Adam figure needs sgd and adam)", OPTIMIZERS)
        },
    )
    weight_decay: float = field(default=0.01, metadata={"help": "λ, for the optimizers that decay"})
    sweep_lrs: tuple[float, ...] = field(
        default=(0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 2.5, 3.0),
        metadata={"help": "learning rates η of the SGD-vs-Adam sweep"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the data stream"})
    # taken by every experiment (one command line silences any); this one prints nothing while it runs anyway
    quiet: bool = field(default=False, metadata={"help": "print nothing while working (it never does)", **NO_EFFECT})

    def __post_init__(self) -> None:
        require_counts(self, "steps", "batch_size")
        require_positive(self, "lr")
        require_non_negative(self, "label_noise")
        self.frequencies = tuple(self.frequencies)
        require(len(self.frequencies) >= 2, f"--frequencies={self.frequencies!r}: give at least two tokens")
        bad = [p for p in self.frequencies if not positive(p)]
        require(not bad, f"--frequencies: {bad} are not finite numbers > 0; every token needs a frequency in (0, 1]")
        total = math.fsum(self.frequencies)
        require(abs(total - 1) <= 1e-6, f"--frequencies sum to {total:.7g}; they must sum to 1 (within 1e-6)")
        require(
            min(self.frequencies) < max(self.frequencies),
            f"--frequencies={self.frequencies!r} are all equal: the experiment compares the rarest token with the "
            "most common one; give at least two different frequencies",
        )
        require_non_negative(self, "weight_decay")
        runs_of(self)
        self.sweep_lrs = require_rates(self, "sweep_lrs")
        need, have = memory_needed(self), physical_memory()
        # said up front: the kernel kills a process that outgrows memory without a word, where torch cannot raise
        require(
            have is None or need <= have,
            f"--steps {self.steps}: the run holds its whole token stream and every weight trajectory, about "
            f"{need / 2**30:.1f} GiB, more than this machine's {(have or 0) / 2**30:.1f} GiB of memory; give fewer "
            f"(--steps {int(self.steps * (have or 0) / need / 2)} would take half of it)",
        )


def memory_needed(config: Config) -> int:
    """Bytes the run holds at its peak, about: the token stream while it is drawn (tokens, noise and targets of
    every step's batch, in 8-byte numbers), the per-step count and target tables, and the sweep's trajectories
    (steps + 1 rows per learning rate and token)."""
    tokens = len(config.frequencies)
    per_step = 8 * (4 * config.batch_size + 2 * tokens + max(1, len(config.sweep_lrs)) * tokens)
    return per_step * (config.steps + 1)


def physical_memory() -> int | None:
    """The machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def runs_of(config: Config) -> tuple[RunSpec, ...]:
    return parse_runs(config.optimizers, config.lr, OPTIMIZERS)


def rarest_error(results: dict[str, Any]) -> float | None:
    """RMS of w − w* over the last quarter of training for the rarest token (None: diverged)."""
    errors = only_run(results["optimizers"])["tail_rms_error"]
    return None if errors is None else errors[results["rarest"]]


#: What ``optiscope sweep rare-tokens`` tunes for.
OBJECTIVES = {"rarest_error": Objective("rarest token's RMS error over the last quarter", "min", rarest_error)}


QUICK = dict(steps=2000, sweep_lrs=(0.01, 0.1, 0.3, 1.0, 1.5, 2.0, 2.5, 3.0))


# ------------------------------------------------------------------------------------------- data
def token_stream(
    frequencies: tuple[float, ...], batch_size: int, steps: int, label_noise: float, seed: int
) -> tuple[Tensor, Tensor]:
    """The data of every step: per step t and token k, the count c_k of k in the batch and the sum of
    its targets Σ y_i. Both have shape (steps, K, 1), the shape of the weights."""
    generator = torch.Generator().manual_seed(seed)
    probabilities = torch.tensor(frequencies, dtype=torch.float64)
    tokens = torch.multinomial(probabilities, steps * batch_size, replacement=True, generator=generator)
    tokens = tokens.view(steps, batch_size)
    noise = torch.randn(steps, batch_size, generator=generator, dtype=torch.float64)
    targets = TRUE_WEIGHT + label_noise * noise
    counts = torch.zeros(steps, len(frequencies), dtype=torch.float64).scatter_add_(1, tokens, torch.ones_like(noise))
    target_sums = torch.zeros_like(counts).scatter_add_(1, tokens, targets)
    return counts.unsqueeze(-1), target_sums.unsqueeze(-1)


def token_gradient(weights: Tensor, counts: Tensor, target_sums: Tensor, batch_size: int) -> Tensor:
    """g_k = (c_k w_k − Σ y_i) / B: the gradient of 1/(2B) Σ_i (w_{k_i} − y_i)² over one batch."""
    return (counts * weights - target_sums) / batch_size


# --------------------------------------------------------------------------------------- training
def train(
    name: str, lrs: list[float], counts: Tensor, target_sums: Tensor, batch_size: int, weight_decay: float = 0.0
) -> dict[str, Any]:
    """Train one K×1 weight table per learning rate in ``lrs`` with optimizer ``name``, all on the same
    stream. The tables are separate param groups of one optimizer: the rules are element-wise (Muon's
    per matrix), so the runs do not interact, and one optimizer steps them with less overhead.

    Returns the trajectories (steps + 1, len(lrs), K) (NaN after a divergence), the step each run
    diverged at (or None) and, per run, the final effective learning rates (None for optimizers that
    do not report one, and for diverged runs).
    """
    steps, tokens = counts.shape[0], counts.shape[1]
    # The tables are slices of one (runs, K, 1) tensor and their gradients slices of another: the
    # optimizer updates the slices in place, so every run is read and written without a Python loop.
    tables = torch.zeros(len(lrs), tokens, 1, dtype=torch.float64)
    gradients = torch.zeros_like(tables)
    weights = list(tables.unbind(0))
    for w, g in zip(weights, gradients.unbind(0), strict=True):
        w.grad = g
    groups = [{"params": [w], "lr": lr} for w, lr in zip(weights, lrs, strict=True)]
    optimizer = build_optimizer(name, groups, lrs[0], weight_decay)
    trajectory = torch.empty((steps + 1, len(lrs), tokens), dtype=torch.float64)
    trajectory[0] = 0.0
    diverged_at: list[int | None] = [None] * len(lrs)
    running = set(range(len(lrs)))
    # Divergence is checked once per chunk of steps, on the chunk's whole trajectory at once.
    for chunk_start in range(0, steps, DIVERGENCE_CHECK_EVERY):
        chunk_end = min(chunk_start + DIVERGENCE_CHECK_EVERY, steps)
        for t in range(chunk_start, chunk_end):
            gradients.copy_(token_gradient(tables, counts[t], target_sums[t], batch_size))
            optimizer.step()
            trajectory[t + 1] = tables[:, :, 0]
        # NaN fails the comparison too, so a NaN weight counts as diverged
        within = ((trajectory[chunk_start + 1 : chunk_end + 1] - TRUE_WEIGHT).abs() <= DIVERGED_BEYOND).all(dim=2)
        for i in sorted(running):
            blown = (~within[:, i]).nonzero()
            if len(blown):
                diverged_at[i] = chunk_start + 1 + int(blown[0])
                weights[i].grad = None  # a group without gradients is not stepped again
                running.discard(i)
    for i, at in enumerate(diverged_at):
        if at is not None:
            trajectory[at + 1 :, i] = math.nan
    effective_lr: list[list[float] | None] = [None] * len(lrs)
    if hasattr(optimizer, "effective_lr"):
        effective_lr = [
            optimizer.effective_lr(w)[:, 0].tolist() if at is None else None
            for w, at in zip(weights, diverged_at, strict=True)
        ]
    return {"trajectory": trajectory, "diverged_at": diverged_at, "effective_lr": effective_lr}


def run_summary(trajectory: Tensor, diverged_at: int | None) -> dict[str, Any]:
    """Per token: final weight and error |w − w*|, and over the last quarter of the steps the RMS of
    w − w* (how far it is, noise included) and the standard deviation of w (how much it jitters)."""
    if diverged_at is not None:
        return {"diverged_at": diverged_at, "final_weight": None, "final_error": None, "tail_rms_error": None}
    steps = trajectory.shape[0] - 1
    tail = trajectory[steps - steps // 4 :]
    return {
        "diverged_at": None,
        "final_weight": trajectory[-1].tolist(),
        "final_error": (trajectory[-1] - TRUE_WEIGHT).abs().tolist(),
        "tail_rms_error": (tail - TRUE_WEIGHT).square().mean(0).sqrt().tolist(),
        # one weight in the tail (a run of fewer than 4 steps) has no spread: NaN, said without torch's warning
        "tail_std": tail.std(0).tolist() if len(tail) > 1 else [math.nan] * tail.shape[1],
    }


def sampled_trajectory(trajectory: Tensor) -> dict[str, Any]:
    """At most TRAJECTORY_POINTS evenly spaced steps of a (steps + 1, K) trajectory, one list per token."""
    steps = trajectory.shape[0] - 1
    at = torch.linspace(0, steps, min(TRAJECTORY_POINTS, steps + 1), dtype=torch.float64).round().long().unique()
    return {"steps": at.tolist(), "weights": trajectory[at].T.tolist()}


# ---------------------------------------------------------------------------------------- findings
class RunResults(TypedDict):
    optimizer: str
    lr: Positive
    setting: str
    diverged_at: int | None
    final_weight: list[float] | None
    final_error: list[float] | None
    tail_rms_error: list[float] | None
    effective_lr: list[float] | None
    effective_lr_fit: dict[str, float] | None
    trajectory: dict[str, list]


class Results(TypedDict):
    status: str  # "diverged" when every optimizer's run diverged (the lr sweep's runs aside), else "ok"
    true_weight: Positive
    learned_within: Positive
    lr: Positive
    steps: int
    batch_size: int
    tokens: list[str]
    frequencies: list[Positive]
    rarest: int
    most_common: int
    occurrences: list[float]
    optimizers: dict[str, RunResults]
    pair: dict[str, str]
    ranking: NotRequired[Ranking]  # the optimizers by their rarest token's final error (absent before it existed)
    notes: dict[str, str]
    lr_sweep: dict[str, Any]


def sweep_findings(sweep: dict[str, Any], nominal: dict[str, Any], rarest: int, common: int) -> dict[str, Any]:
    """Can SGD be rescued by a larger η? The smallest swept η at which SGD learns the rarest token (tail
    RMS error ≤ LEARNED_WITHIN), what the most common token's jitter is there compared with the nominal
    η's (None where SGD diverged at the nominal η: it has no jitter to compare with), and the largest
    swept η SGD survives. The swept ηs may come in any order."""
    lrs, sgd = sweep["lrs"], sweep["sgd"]
    survived = [lr for lr, run in zip(lrs, sgd, strict=True) if run["diverged_at"] is None]
    rescued = [
        (lr, run)
        for lr, run in zip(lrs, sgd, strict=True)
        if run["diverged_at"] is None and run["tail_rms_error"][rarest] <= LEARNED_WITHIN
    ]
    findings: dict[str, Any] = {
        "largest_stable_sgd_lr": max(survived) if survived else None,
        "smallest_diverging_sgd_lr": min((lr for lr in lrs if lr not in survived), default=None),
        "rescue_lr": None,
    }
    if rescued:
        lr, run = min(rescued, key=lambda pair: pair[0])
        findings.update(
            rescue_lr=lr,
            rescue_common_tail_std=run["tail_std"][common],
            rescue_common_tail_rms_error=run["tail_rms_error"][common],
            nominal_common_tail_std=None,
            nominal_common_tail_rms_error=None,
            rescue_jitter_ratio=None,
        )
        if nominal["diverged_at"] is None:
            findings.update(
                nominal_common_tail_std=nominal["tail_std"][common],
                nominal_common_tail_rms_error=nominal["tail_rms_error"][common],
                rescue_jitter_ratio=run["tail_std"][common] / nominal["tail_std"][common]
                if nominal["tail_std"][common] > 0
                else math.inf,
            )
    return findings


def effective_lr_fit(
    effective_lr: list[float], frequencies: list[float], seen: list[bool], rarest: int, common: int
) -> dict[str, float]:
    """The line through (log p, log effective lr) of the tokens ``seen`` in training — a slope of −1 would cancel
    the frequency exactly; a token never seen has v̂ = 0 and the effective lr η/ε, which says nothing of its
    frequency — their number (``tokens``), and the rarest token's effective lr over the most common token's
    (NaN when either was never seen)."""
    kept = [k for k, s in enumerate(seen) if s]
    fit = loglog_fit([frequencies[k] for k in kept], [effective_lr[k] for k in kept])
    ratio = effective_lr[rarest] / effective_lr[common] if seen[rarest] and seen[common] else math.nan
    return {**fit, "tokens": len(kept), "ratio": ratio}


def run(config: Config, run_dir: Path) -> Results:
    counts, target_sums = token_stream(
        config.frequencies, config.batch_size, config.steps, config.label_noise, config.seed
    )
    frequencies = list(config.frequencies)
    rarest, common = frequencies.index(min(frequencies)), frequencies.index(max(frequencies))
    seen = (counts.sum(0) > 0).reshape(-1).tolist()  # a short run may never draw the rarest tokens

    optimizers: dict[str, Any] = {}
    for spec in runs_of(config):
        trained = train(spec.optimizer, [spec.lr], counts, target_sums, config.batch_size, config.weight_decay)
        trajectory = trained["trajectory"][:, 0]
        effective = trained["effective_lr"][0]
        optimizers[spec.label] = {
            "optimizer": spec.optimizer,
            "lr": spec.lr,
            "setting": recipe(spec.optimizer).describe(),
            **run_summary(trajectory, trained["diverged_at"][0]),
            "effective_lr": effective,
            "effective_lr_fit": (
                None if effective is None else effective_lr_fit(effective, frequencies, seen, rarest, common)
            ),
            "trajectory": sampled_trajectory(trajectory),
        }
    # the seed's figure sets the first SGD run against the first Adam run (when both were run)
    pair = {
        name: next(label for label, r in optimizers.items() if r["optimizer"] == name)
        for name in ("sgd", "adam")
        if any(r["optimizer"] == name for r in optimizers.values())
    }

    # in increasing order, whatever order --sweep-lrs gave: the figure draws the errors as lines over η
    sweep: dict[str, Any] = {"lrs": sorted(config.sweep_lrs)}
    for name in ("sgd", "adam"):
        trained = train(name, sweep["lrs"], counts, target_sums, config.batch_size, config.weight_decay)
        sweep[name] = [
            run_summary(trained["trajectory"][:, i], trained["diverged_at"][i]) for i in range(len(sweep["lrs"]))
        ]
    if "sgd" in pair:
        nominal = optimizers[pair["sgd"]]
    else:  # the findings compare with SGD at the nominal η: train it for them
        trained = train("sgd", [config.lr], counts, target_sums, config.batch_size, config.weight_decay)
        nominal = run_summary(trained["trajectory"][:, 0], trained["diverged_at"][0])
    sweep["findings"] = sweep_findings(sweep, nominal, rarest, common)

    return {
        "status": "diverged" if all(r["diverged_at"] is not None for r in optimizers.values()) else "ok",
        "true_weight": TRUE_WEIGHT,
        "learned_within": LEARNED_WITHIN,
        "lr": config.lr,
        "steps": config.steps,
        "batch_size": config.batch_size,
        "label_noise": config.label_noise,
        "tokens": [f"token {k + 1}" for k in range(len(frequencies))],
        "frequencies": frequencies,
        "rarest": rarest,
        "most_common": common,
        "occurrences": counts.sum(0)[:, 0].tolist(),
        "optimizers": optimizers,
        "pair": pair,
        "ranking": rank(
            {label: r["final_error"][rarest] if r["final_error"] else None for label, r in optimizers.items()},
            "the rarest token's error |w − w*| at the end",
            "min",
        ),
        "notes": NOTES,
        "lr_sweep": sweep,
    }
