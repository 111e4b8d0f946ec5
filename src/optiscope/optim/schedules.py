r"""Learning-rate schedules as pure functions of the step, and their adaptor to torch's schedulers.

``Schedule`` is the one shape (linear warmup, then cosine decay; its docstring has the formula);
``constant``, ``linear_warmup``, ``cosine`` and ``warmup_cosine`` name its common cases, and
``as_lambda_lr`` drives an optimizer with one through ``torch.optim.lr_scheduler.LambdaLR``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..checks import is_count, non_negative


@dataclass(frozen=True)
class Schedule:
    """η(t) with linear warmup over ``warmup_steps`` and, if ``total_steps`` is set, cosine decay to ``min_lr``.

    A schedule maps the step number t = 1, 2, … (the t-th call of ``optimizer.step()``, counted as Adam
    counts t) to a learning rate; call it: ``schedule(t)``. With t_w = ``warmup_steps`` and T = ``total_steps``:

    ```text
    warmup      η_t = η_max · t / t_w                                                for t ≤ t_w
    cosine      η_t = η_min + ½ (η_max − η_min) (1 + cos(π (t − t_w) / (T − t_w)))   for t_w < t ≤ T
    after       η_t = η_min                                                          for t > T
    ```

    Warmup counts *inside* the total: a run of T steps with t_w warmup steps decays over the last T − t_w.
    Endpoints are exact: η_{t_w} = η_max and η_T = η_min. Without a total (``total_steps=None``) the rate
    stays at η_max after warmup. A frozen dataclass; ``as_lambda_lr`` makes it drive an optimizer.

    Args:
        lr_max: η_max, a finite number ≥ 0.
        warmup_steps: t_w, an integer ≥ 0 (0: no warmup).
        total_steps: T, an integer > ``warmup_steps``, or None for no decay.
        min_lr: η_min in [0, ``lr_max``], the rate at and after T.

    Raises:
        ValueError: a field out of its range (at construction), or calling it with t < 1.

    Examples:
        >>> from optiscope.optim import Schedule
        >>> schedule = Schedule(1.0, warmup_steps=2, total_steps=10, min_lr=0.1)
        >>> [round(schedule(t), 3) for t in range(1, 12)]
        [0.5, 1.0, 0.966, 0.868, 0.722, 0.55, 0.378, 0.232, 0.134, 0.1, 0.1]

    Notes:
        Any real number or integer is taken for the fields (NumPy's too, as from a sweep's grid), but not a
        bool; they are kept as Python ``float`` and ``int``, so η(t) is computed in double precision.
    """

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
        """η at step ``t`` ≥ 1 (the formula above); ValueError for t < 1."""
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
    """The constant schedule η_t = η at every step.

    Args:
        lr: η, a finite number ≥ 0.

    Returns:
        ``Schedule(lr)``.

    Raises:
        ValueError: ``lr`` is negative or not finite.

    Examples:
        >>> from optiscope.optim import constant
        >>> schedule = constant(0.1)
        >>> schedule(1), schedule(1000)
        (0.1, 0.1)
    """
    return Schedule(lr)


def linear_warmup(lr: float, warmup_steps: int) -> Schedule:
    """Linear warmup η_t = η · t / t_w over t_w steps, then η for ever.

    Args:
        lr: η, the rate reached at step t_w; a finite number ≥ 0.
        warmup_steps: t_w, an integer ≥ 0.

    Returns:
        ``Schedule(lr, warmup_steps=warmup_steps)``.

    Raises:
        ValueError: ``lr`` or ``warmup_steps`` out of range.

    Examples:
        >>> from optiscope.optim import linear_warmup
        >>> schedule = linear_warmup(0.1, warmup_steps=4)
        >>> [round(schedule(t), 3) for t in range(1, 7)]
        [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    """
    return Schedule(lr, warmup_steps=warmup_steps)


def cosine(lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """Cosine decay η_t = η_min + ½ (η − η_min)(1 + cos(π t / T)) from η to η_min over T steps, no warmup.

    Args:
        lr: η, the peak: the rate at t = 0 (so the first step already takes η_1 < η).
        total_steps: T, an integer > 0; η_T = η_min exactly, and η_min after.
        min_lr: η_min in [0, ``lr``].

    Returns:
        ``Schedule(lr, total_steps=total_steps, min_lr=min_lr)``.

    Raises:
        ValueError: an argument out of range.

    Examples:
        >>> from optiscope.optim import cosine
        >>> schedule = cosine(1.0, total_steps=4)
        >>> [round(schedule(t), 3) for t in range(1, 6)]
        [0.854, 0.5, 0.146, 0.0, 0.0]
    """
    return Schedule(lr, total_steps=total_steps, min_lr=min_lr)


def warmup_cosine(lr: float, total_steps: int, warmup_steps: int, min_lr: float = 0.0) -> Schedule:
    """Linear warmup to η over t_w steps, then cosine decay to η_min at step T (the ``Schedule`` formula).

    Warmup counts inside the total: the decay takes the last T − t_w steps.

    Args:
        lr: η, the peak, reached exactly at step t_w.
        total_steps: T, an integer > ``warmup_steps``.
        warmup_steps: t_w, an integer ≥ 0.
        min_lr: η_min in [0, ``lr``], reached exactly at step T.

    Returns:
        ``Schedule(lr, warmup_steps=warmup_steps, total_steps=total_steps, min_lr=min_lr)``.

    Raises:
        ValueError: an argument out of range (``total_steps <= warmup_steps``, ``min_lr > lr``, …).

    Examples:
        >>> from optiscope.optim import warmup_cosine
        >>> schedule = warmup_cosine(1.0, total_steps=6, warmup_steps=2, min_lr=0.1)
        >>> [round(schedule(t), 3) for t in range(1, 8)]
        [0.5, 1.0, 0.868, 0.55, 0.232, 0.1, 0.1]
    """
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
    """A ``torch.optim.lr_scheduler.LambdaLR`` that follows ``schedule``'s shape.

    Call ``scheduler.step()`` after ``optimizer.step()``. Each param group keeps its own peak: at the t-th
    step the group's lr is (its initial lr) × η(t)/η_max, so for a single group whose lr equals
    ``schedule.lr_max`` it is exactly η(t).

    Args:
        optimizer: any ``torch.optim.Optimizer``; its groups' ``lr`` (``initial_lr`` where a scheduler set one)
            become their peaks.
        schedule: the shape to follow.

    Returns:
        The scheduler, already set to step 1's rate (η(1)/η_max of each group's peak).

    Examples:
        >>> import torch
        >>> from optiscope.optim import SGD, as_lambda_lr, warmup_cosine
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> optimizer = SGD([w], lr=0.1)
        >>> scheduler = as_lambda_lr(optimizer, warmup_cosine(0.1, total_steps=4, warmup_steps=2))
        >>> rates = []
        >>> for _ in range(5):
        ...     rates.append(optimizer.param_groups[0]["lr"])
        ...     w.grad = torch.ones(1)
        ...     optimizer.step()
        ...     scheduler.step()
        >>> [round(lr, 4) for lr in rates]
        [0.05, 0.1, 0.05, 0.0, 0.0]

    Notes:
        The scheduler's ``state_dict()`` holds the schedule as plain numbers, not the ``Schedule``, so a
        checkpoint of it loads with ``torch.load``'s default ``weights_only=True``. With ``lr_max = 0`` every
        group's lr is 0.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _Factor(**dataclasses.asdict(schedule)))
