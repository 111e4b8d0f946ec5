"""Divergence as a diagnosis, not a crash.

The seed's training log ends in ``OverflowError: math range error`` from ``math.exp(train_loss)``
when Adam gets SGD's learning rate. Here a loss that leaves the sane range is *detected*, reported
with the step and the parameters whose update-to-weight ratio blew up first, and the run stops cleanly.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import is_count, is_number

# exp(x) overflows a float64 above this
_MAX_EXP = math.log(1.7976931348623157e308)


def safe_perplexity(loss: float) -> float:
    """exp(loss), or inf where that would overflow (nan stays nan). Never raises."""
    loss = float(loss)
    if math.isnan(loss):
        return math.nan
    return math.exp(loss) if loss < _MAX_EXP else math.inf


class Diverged(RuntimeError):
    """Training diverged: raised by ``Monitor.step`` with ``on_divergence="raise"``, carrying the diagnosis.

    Its message names the step, the reason, the loss, the parameters whose update-to-weight ratio u/w exploded
    first (or that none did, and which grew the most) and, with curvature measured, what the sharpness did.

    Args:
        record: the divergence record: ``step``, ``loss``, ``reason``, ``exploded_first`` (the parameters whose
            u/w exploded, earliest first), ``grew_most`` (the others whose u/w grew most), ``first_measured_step``
            and ``last_measured_step`` (the measured steps their growth spans) and, with curvature measured,
            ``curvature_diagnosis``; only ``step``, ``loss`` and ``reason`` are required.
        measured: the record of the step at which the guard tripped when that step was a measured one (written
            to the sinks already; a training loop keeps it as it keeps any other), else None.

    Attributes:
        record: the divergence record.
        measured: the measured step's record, or None.

    Examples:
        >>> import torch
        >>> from optiscope.monitor import Diverged, Monitor
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> try:
        ...     monitor.step(float("nan"))
        ... except Diverged as e:
        ...     print(e.record["step"], e.record["reason"], e.measured is not None)
        1 loss is nan True
        >>> print(Diverged({"step": 7, "loss": float("inf"), "reason": "loss is inf"}))
        diverged at step 7: loss is inf (loss inf); u/w: none measured
        >>> calm = {"step": 30, "loss": float("nan"), "reason": "loss is nan", "exploded_first": []}
        >>> calm["grew_most"] = [{"name": "0.weight", "growth": 1.3}, {"name": "0.bias", "growth": 0.9}]
        >>> str(Diverged({**calm, "first_measured_step": 1, "last_measured_step": 26})).split("; ")[-1]
        "no parameter's u/w exploded between the measured steps 1 and 26 (the most: 0.weight, 1.3x)"
        >>> str(Diverged({**calm, "first_measured_step": 1, "last_measured_step": 1})).split("; ")[-1]
        "no parameter's u/w exploded: only step 1 was measured, no growth to compare"
    """

    def __init__(self, record: dict[str, Any], measured: dict[str, Any] | None = None) -> None:
        self.record, self.measured = record, measured
        diagnosis = curvature_finding(record)
        super().__init__(
            f"diverged at step {record['step']}: {record['reason']} (loss {record['loss']}); "
            f"{exploded_summary(record)}{f'; {diagnosis}' if diagnosis else ''}"
        )


def curvature_finding(record: dict[str, Any]) -> str:
    """A divergence record's curvature diagnosis without its opening ("diverged at step N; "), for a sentence
    that has said the step already ("" without one)."""
    return (record.get("curvature_diagnosis") or "").removeprefix(_diverged_at(record.get("step")))


def exploded_summary(record: dict[str, Any]) -> str:
    """Which parameters' u/w exploded first (a divergence record's ``exploded_first``), or that none did between
    which measured steps (its ``first_measured_step`` and ``last_measured_step``, where it has them) and which
    grew the most (its ``grew_most``); a single measured step has no growth to compare, and says so."""
    exploded = [r["name"] for r in record.get("exploded_first", [])]
    if exploded:
        return f"u/w exploded first in: {', '.join(exploded[:3])}"
    grew = record.get("grew_most", [])
    if not grew:
        return "u/w: none measured"
    first, last = record.get("first_measured_step"), record.get("last_measured_step")
    if first is not None and first == last:
        return f"no parameter's u/w exploded: only step {first} was measured, no growth to compare"
    between = f" between the measured steps {first} and {last}" if first is not None and last is not None else ""
    top = grew[0]
    growth = top.get("growth")
    most = f" (the most: {top['name']}, {growth:.2g}x)" if isinstance(growth, int | float) else ""
    return f"no parameter's u/w exploded{between}{most}"


@dataclass(frozen=True)
class DivergenceGuard:
    """When a run counts as diverged: a non-finite loss, a loss far above its lowest, or too many skipped steps.

    With L̃ the median loss of the last ``window`` steps, L̃_min its lowest value so far (the first loss counts
    as one) and L₁ the run's first loss, a step trips the guard when its loss is not finite, or when, after
    ``warmup`` steps,

        L̃ > factor · L̃_min   and   L̃ > first_factor · L₁,

    or when it makes ``skipped`` optimizer steps in a row skipped for non-finite gradients (a GradScaler's,
    whose skipped steps' losses it does not judge). The monitor also trips on non-finite weights, checked on
    measured steps.

    The monitor keeps each step's loss on its device and reads the losses together on measured steps and every
    ``read_every`` steps, so that the steps between cost no wait for the GPU (and, under DDP, no collective):
    the guard judges every step, in order, as it would one at a time, and a divergence is raised (or recorded)
    with the step it happened at, at most ``read_every − 1`` steps later.

    Args:
        factor: how far above its lowest value the median loss may rise; a number > 1
            (``math.inf``: judge only non-finite losses and skipped steps).
        warmup: steps before the loss is compared with its lowest (a non-finite loss trips at any step);
            an integer ≥ 0.
        first_factor: how far above the first loss the median loss must also be; a number ≥ 1 (e.g. 10 for
            models that spike and recover).
        skipped: how many optimizer steps skipped in a row count as divergence; an integer ≥ 1.
        window: how many recent losses the median takes; an integer ≥ 1 (1 judges each step's loss).
        read_every: how many steps at most a loss waits on its device before the guard reads it (measured steps
            are read at once); an integer ≥ 1 (1 reads each step's loss as it comes: a GPU sync a step).

    Raises:
        ValueError: a field outside its range.

    Examples:
        >>> import torch
        >>> from optiscope.monitor import DivergenceGuard, Monitor
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer, guard=DivergenceGuard(first_factor=10))
        >>> guard = DivergenceGuard(warmup=0, window=1)
        >>> guard.reason(step=5, loss=9.0, level=9.0, lowest=2.0, first=3.0)
        'loss 9 > 4 x its lowest value 2 and above the first loss 3'
        >>> guard.reason(step=5, loss=7.0, level=7.0, lowest=2.0, first=3.0) is None  # below 4 x 2
        True

    Notes:
        Why the median, not one batch's loss: a small batch's loss is noisy, and a lucky easy batch followed by
        a hard one differs by 4× in a healthy run. With batches of 16 and 20 % label noise one batch's loss
        tripped a factor of 4 in all of six healthy classifiers, the median of 9 in none, nor under heavy-tailed
        noise (Student's t with 2 degrees of freedom); a loss that explodes is caught ``window // 2`` steps
        later.

        Why the first loss too: it keeps a run near a loss of ~0 from counting as divergence: diverging means
        doing worse than at the start; ``first_factor`` > 1 lets a model that spikes and recovers spike.
        The rule is relative to the run's own losses, so a run that starts near a loss of 0 can still trip it
        without blowing up (fine-tuning a classifier already at loss 0.007 on labels 20 % noisy); for such runs
        give a ``first_factor`` above the rise you expect, or no guard.

        Why ``skipped``: a scaler lowers its scale at each skipped step, so a healthy start skips a few
        (torch's GradScaler starts at 2^16 and halves it, reaching 1 in 16 skips); gradients still not finite
        32 halvings on are not a matter of scale, and such a run would otherwise skip steps for ever without a
        word.

        Why ``read_every``: reading a loss (``float(loss)``) waits until the GPU has computed it, which stops the
        CPU from queueing the next step's kernels; nanoGPT reads its loss once per log interval for that reason.
        Read every 10 steps, the losses cost one wait per 10 steps, where the monitor's default ``every=10``
        measures anyway; a loss given as a number in a single process is judged at once (reading it costs
        nothing).

        The 🤗 and Lightning callbacks' default is ``DivergenceGuard(warmup=0)``; ``optiscope.train`` cuts the
        warm-up to a tenth of a shorter run (``within``).
    """

    factor: float = 4.0
    warmup: int = 20
    first_factor: float = 1.0
    skipped: int = 32
    window: int = 9
    read_every: int = 10

    def __post_init__(self) -> None:
        if not (is_number(self.factor) and self.factor > 1):
            raise ValueError(f"DivergenceGuard: factor={self.factor!r} must be a number > 1")
        if not (is_number(self.first_factor) and self.first_factor >= 1):
            raise ValueError(f"DivergenceGuard: first_factor={self.first_factor!r} must be a number >= 1")
        if not is_count(self.warmup, 0):
            raise ValueError(f"DivergenceGuard: warmup={self.warmup!r} must be an integer >= 0")
        if not is_count(self.skipped, 1):
            raise ValueError(f"DivergenceGuard: skipped={self.skipped!r} must be an integer >= 1")
        if not is_count(self.window, 1):
            raise ValueError(f"DivergenceGuard: window={self.window!r} must be an integer >= 1")
        if not is_count(self.read_every, 1):
            raise ValueError(f"DivergenceGuard: read_every={self.read_every!r} must be an integer >= 1")

    def within(self, steps: int) -> DivergenceGuard:
        """This guard for a run of ``steps`` steps: a warm-up longer than a tenth of the run cut to that tenth.

        Otherwise a short run would never be judged (adam@10 over 20 steps ended "ok" at 4,700× its first loss).

        Args:
            steps: the run's length in optimizer steps.

        Returns:
            A copy with ``warmup = min(warmup, steps // 10)``.
        """
        return dataclasses.replace(self, warmup=min(self.warmup, steps // 10))

    def level(self, recent: Sequence[float]) -> float | None:
        """The loss judged: the median of the last ``window`` finite losses.

        Args:
            recent: the recent finite losses, oldest first.

        Returns:
            Their median over the last ``window``, or None while there are fewer.
        """
        return statistics.median(recent[-self.window :]) if len(recent) >= self.window else None

    def reason(self, step: int, loss: float, level: float | None, lowest: float, first: float) -> str | None:
        """Why this step's loss counts as divergence, or None when it does not.

        Args:
            step: the step number (judged by level only after ``warmup``).
            loss: this step's loss.
            level: the median the last ``window`` losses come to with it (``level()``), or None.
            lowest: the lowest level so far (the first loss counts as one).
            first: the run's first loss.

        Returns:
            A one-line reason (e.g. ``"loss is nan"``), or None.
        """
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if level is None or step <= self.warmup:
            return None
        # lowest ≥ 0: a factor of a negative lowest loss (a log-likelihood's) means nothing; at 0, any loss above
        # the first is worse than the start
        if lowest >= 0 and level > self.factor * lowest and level > self.first_factor * first:
            what = "loss" if self.window == 1 else f"loss (median of the last {self.window} steps)"
            above = "above the first loss" if self.first_factor == 1 else f"> {self.first_factor:g} x the first loss"
            return f"{what} {level:.4g} > {self.factor:g} x its lowest value {lowest:.4g} and {above} {first:.4g}"
        return None

    def skipped_reason(self, before: int, now: int) -> str | None:
        """Why a streak of skipped steps counts as divergence: once per streak, when it reaches ``skipped``.

        Args:
            before: the steps skipped in a row before this call.
            now: the steps skipped in a row now.

        Returns:
            A one-line reason when the streak passes ``skipped`` between ``before`` and ``now``, else None.
        """
        if before < self.skipped <= now:
            return (
                f"{now} steps in a row skipped for non-finite gradients: lowering the loss scale has not made "
                "them finite"
            )
        return None


@dataclass
class GuardState:
    """What the guard has seen of a run so far, one step at a time: the run's first finite loss, the lowest level
    (the median of ``window`` recent losses; the first loss counts as one), those recent finite losses and the
    optimizer steps skipped in a row. ``Monitor.state_dict`` saves it under its old names (``first_loss``,
    ``lowest_loss``, ``recent_losses``, ``skipped_in_a_row``), so that a resumed run judges as the whole one."""

    first: float = math.nan
    lowest: float = math.inf
    recent: list[float] = field(default_factory=list)
    skipped_in_a_row: int = 0

    def judge(self, guard: DivergenceGuard | None, step: int, loss: float | None) -> str | None:
        """A step the optimizer took, with its loss (None: none given): into the state; why it counts as
        divergence, or None (always None without a guard, which still keeps the first and lowest loss)."""
        self.skipped_in_a_row = 0
        if loss is None:
            return None
        level = None
        if math.isfinite(loss):
            if math.isnan(self.first):
                # the start is a level too: a run whose loss rises at once (Adam at SGD's η) sets no lower median
                self.first = self.lowest = loss
            self.recent = [*self.recent, loss][-(guard.window if guard is not None else 1) :]
            level = guard.level(self.recent) if guard is not None else loss
            if level is not None:
                self.lowest = min(self.lowest, level)
        return None if guard is None else guard.reason(step, loss, level, self.lowest, self.first)

    def skip(self, guard: DivergenceGuard | None, steps: int, judged: bool) -> str | None:
        """``steps`` optimizer steps skipped (a GradScaler's): why the streak now counts as divergence, when
        ``judged`` (a loss scaler is at work), else None."""
        before, self.skipped_in_a_row = self.skipped_in_a_row, self.skipped_in_a_row + steps
        return guard.skipped_reason(before, self.skipped_in_a_row) if judged and guard is not None else None


def check_guard(guard: Any, who: str) -> None:
    """A one-line error unless ``guard`` is a ``DivergenceGuard`` or None (divergence detection off)."""
    if guard is not None and not isinstance(guard, DivergenceGuard):
        raise TypeError(
            f"{who}: guard={guard!r} must be a DivergenceGuard(factor=..., warmup=..., skipped=...) or None "
            "(no divergence detection)"
        )


def curvature_diagnosis(step: int, history: list[tuple[int, float | None, str, bool]]) -> str | None:
    """What the curvature measurements say about a divergence at ``step``, in one sentence.

    ``history`` holds (step, sharpness/threshold, threshold label, preconditioned) per measurement. With the
    last finite ratio above 1 the sentence gives it and the first step of the streak above 1 that ran up to
    it ("preconditioned sharpness 3.1× its 38/η threshold since step 180"), and the streak's highest where that
    is higher ("… since step 4 (at most 4.3e+07× at step 4)"). Below 1 at the end, it says
    how often the sharpness was above its threshold before ("above its 3.8/η threshold at 16 of 18
    measurements, at most 5.57× at step 75; 0.808× at step 90": a measurement at parameters that are
    already blowing up need not be large), or that it stayed below throughout (the cause is then
    elsewhere: a spike of the gradient, a bad batch). A last measurement that is not finite is said. None
    when nothing with a threshold was measured.
    """
    measured = [(s, r, label, pre) for s, r, label, pre in history if r is not None]
    known = [(s, r, label, pre) for s, r, label, pre in measured if math.isfinite(r)]
    if not known:
        return None
    last_step, last, label, pre = known[-1]
    what = "preconditioned sharpness" if pre else "sharpness"
    lost = f"; not finite at step {measured[-1][0]}" if not math.isfinite(measured[-1][1]) else ""
    if last > 1:
        streak = []
        for s, r, _, _ in reversed(known):
            if r <= 1:
                break
            streak.append((s, r))
        since = streak[-1][0]
        peak_step, peak = max(streak, key=lambda sr: sr[1])
        # the last measurement may be taken where the blow-up has already turned the curvature around
        highest = f" (at most {peak:.3g}× at step {peak_step})" if peak > last else ""
        return f"{_diverged_at(step)}{what} {last:.3g}× its {label} threshold since step {since}{highest}{lost}"
    worst_step, worst = max(((s, r) for s, r, _, _ in known), key=lambda sr: sr[1])
    above = sum(r > 1 for _, r, _, _ in known)
    if above:
        return (
            f"{_diverged_at(step)}{what} above its {label} threshold at {above} of {len(known)} measurements "
            f"(at most {worst:.3g}× at step {worst_step}; {last:.3g}× at step {last_step}){lost}"
        )
    return (
        f"{_diverged_at(step)}{what} stayed below its {label} threshold "
        f"({last:.3g}× at step {last_step}, at most {worst:.3g}× at step {worst_step}){lost}"
    )


def _diverged_at(step: int | None) -> str:
    """How a curvature diagnosis opens (and what ``Diverged`` drops from it, having said the step)."""
    return f"diverged at step {step}; "
