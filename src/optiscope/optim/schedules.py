r"""Learning-rate schedules as pure functions of the step, and their adaptor to torch's schedulers.

A ``Schedule`` maps the step number t = 1, 2, … (the t-th call of ``optimizer.step()``, counted as
Adam counts t) to a learning rate:

    warmup      η_t = η_max · t / t_w                                          for t ≤ t_w
    cosine      η_t = η_min + ½ (η_max − η_min) (1 + cos(π (t − t_w) / (T − t_w)))   for t_w < t ≤ T
    after       η_t = η_min                                                    for t > T

Warmup counts *inside* the total: a run of T steps with t_w warmup steps decays over the last T − t_w.
Endpoints are exact: η_{t_w} = η_max and η_T = η_min. Without a total (``total_steps=None``) the rate
stays at η_max after warmup.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..checks import is_count, non_negative


@dataclass(frozen=True)
class Schedule:
    """η(t) with linear warmup over ``warmup_steps`` and, if ``total_steps`` is set, cosine decay to ``min_lr``."""

    lr_max: float
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        # Any real number or integer is taken (NumPy's too, as from a sweep's grid), but not a bool.
        if not non_negative(self.lr_max):
            raise ValueError(f"Schedule: lr_max={self.lr_max!r} must be a finite number >= 0")
        if not is_count(self.warmup_steps, least=0):
            raise ValueError(f"Schedule: warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        if self.total_steps is not None and not (
            is_count(self.total_steps, least=0) and self.total_steps > self.warmup_steps
        ):
            raise ValueError(
                f"Schedule: total_steps={self.total_steps!r} must be an integer > warmup_steps={self.warmup_steps}"
                " (warmup counts inside the total), or None for no decay"
            )
        if not (non_negative(self.min_lr) and self.min_lr <= self.lr_max):
            raise ValueError(f"Schedule: min_lr={self.min_lr!r} must be in [0, lr_max={self.lr_max}]")
        # Python numbers from here on, so that η(t) is computed in double precision whatever came in.
        for name, kind in (("lr_max", float), ("warmup_steps", int), ("total_steps", int), ("min_lr", float)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, kind(getattr(self, name)))

    def __call__(self, t: int) -> float:
        if t < 1:
            raise ValueError(f"Schedule: step t={t!r} must be >= 1 (t counts optimizer steps from 1)")
        if t <= self.warmup_steps:
            return self.lr_max * t / self.warmup_steps
        if self.total_steps is None:
            return self.lr_max
        if t >= self.total_steps:
            return self.min_lr
        progress = (t - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.min_lr + 0.5 * (self.lr_max - self.min_lr) * (1 + math.cos(math.pi * progress))


def constant(lr: float) -> Schedule:
    return Schedule(lr)


def linear_warmup(lr: float, warmup_steps: int) -> Schedule:
    return Schedule(lr, warmup_steps=warmup_steps)


def cosine(lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    return Schedule(lr, total_steps=total_steps, min_lr=min_lr)


def warmup_cosine(lr: float, total_steps: int, warmup_steps: int, min_lr: float = 0.0) -> Schedule:
    return Schedule(lr, warmup_steps=warmup_steps, total_steps=total_steps, min_lr=min_lr)


@dataclass(frozen=True)
class _Factor:
    """η(t)/η_max as a function of LambdaLR's epoch counter k = t − 1 (a picklable callable).

    It holds the schedule's fields as plain numbers, not the ``Schedule``: LambdaLR's ``state_dict()`` saves
    them, and ``torch.load`` (``weights_only=True`` by default) refuses classes it does not know.
    """

    lr_max: float
    warmup_steps: int
    total_steps: int | None
    min_lr: float

    def __call__(self, k: int) -> float:
        schedule = Schedule(self.lr_max, self.warmup_steps, self.total_steps, self.min_lr)
        return schedule(k + 1) / self.lr_max if self.lr_max > 0 else 0.0


def as_lambda_lr(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that follows ``schedule``'s shape; call ``scheduler.step()`` after ``optimizer.step()``.

    Each param group keeps its own peak: group lr = (its initial lr) × η(t)/η_max. For a single group
    whose lr equals ``schedule.lr_max`` the group's lr is exactly η(t) at the t-th step.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _Factor(**dataclasses.asdict(schedule)))
