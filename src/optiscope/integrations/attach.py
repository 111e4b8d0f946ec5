"""What the callbacks for 🤗 Trainer and Lightning share: building the monitor, one record per real
optimizer step with the loss of the micro-batches it was taken on, and divergence as a stop signal.

A library's loop calls its callback around micro-batches and optimizer steps; ``Attachment`` turns
that into the monitor's contract (``monitor.step(loss)`` once after every real ``optimizer.step()``).
A step counts as taken when the optimizer's own step hooks ran, so a step the library skipped
(a mixed-precision step with non-finite gradients) has no record; its number is used up all the same, as the
library counts it, so that records carry the library's step numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import runs
from ..monitor import (
    Curvature,
    Diverged,
    DivergenceGuard,
    EarlyWarning,
    JSONLSink,
    LoggerSink,
    Monitor,
    run_directory_sinks,
)
from ..monitor.early_warning import checked_warning
from ..monitor.keys import check_prefix, parameter_filter
from ..monitor.monitor import STATE_KEYS, check_schedule
from ..monitor.sinks import checked_sinks

log = logging.getLogger("optiscope")

#: The callbacks' guard: judged from the first step with a median of ``window`` losses (the 9th), without the
#: further 20-step warm-up of ``DivergenceGuard()``: fine-tuning runs are often short. AdamW at η = 10 on a tiny
#: GPT-2 or Qwen2 (loss 4.5 → 3,900) ran on to step 21 before the guard tripped, and a run of 20 steps ended as
#: healthy. The median of 9 is the warm-up: 42 healthy runs with small, noisy batches (classifiers with 30–50 %
#: noisy labels on batches of 1–4, language models on batches of 1, six seeds each) were stopped at no warm-up
#: from 0 to 20. (Fine-tuning a classifier already at loss 0.007 on labels 20 % noisy trips the guard's rule
#: itself, loss rising far above its near-zero start: 28 of 36 runs at warm-up 0, 27 at 20.)
CALLBACK_GUARD = DivergenceGuard(warmup=0)

#: the first part of the callbacks' keys in the loggers, and their default folder's name
DEFAULT_PREFIX = "optiscope"


def build_monitor(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    sinks: list[Any],
    every: int,
    curvature: Curvature | None,
    guard: DivergenceGuard | None,
    start_step: int,
    rank_zero: bool,
    early_warning: bool | EarlyWarning = False,
    on_warning: Callable[[dict[str, Any]], Any] | str | None = None,
) -> Monitor:
    """A ``Monitor`` that records instead of raising, writing to ``sinks`` (none on ranks other than 0). Records
    this run logged after ``start_step`` before (the part of an interrupted run after its checkpoint) are
    dropped, so every step is written once."""
    monitor = Monitor(
        model,
        optimizer,
        every=every,
        sinks=sinks if rank_zero else [],
        guard=guard,
        on_divergence="record",
        start_step=start_step,
        curvature=curvature,
        early_warning=early_warning,
        on_warning=on_warning,
    )
    monitor.rewind_sinks(start_step)
    return monitor


def own_files(folder: Path | None, label: str, tensorboard: bool, fresh: bool) -> list[Any]:
    """optiscope's own files for a callback's run in ``folder`` (None: no file): ``metrics.jsonl`` and, with
    ``tensorboard`` and the extra, TensorBoard events in ``tensorboard/<label>``. A ``fresh`` run (one that starts
    at step 0, not the callback's own run started again, as 🤗 does with ``auto_find_batch_size``) into a folder
    holding records is refused: it would mix its records with another run's, or drop them."""
    if folder is None:
        return []
    if fresh and next(runs.iter_jsonl(folder / runs.METRICS), None) is not None:
        raise ValueError(
            f"OptiscopeCallback: {str(folder)!r} holds the records of an earlier run ({runs.METRICS}); give out_dir= "
            "a folder of its own to this run, or remove that one (a run resumed from its checkpoint goes on there)"
        )
    return run_directory_sinks(folder, label) if tensorboard else [JSONLSink(folder / runs.METRICS)]


def check_siblings(callbacks: Iterable[Any], callback: MonitorCallback) -> None:
    """A one-line error when another of the Trainer's optiscope callbacks (or this one, listed twice) has
    ``callback``'s prefix (its keys in the loggers and its default folder would be the same) or its ``out_dir``
    (their records would mix)."""
    itself = 0
    for other in callbacks:
        if other is callback:
            itself += 1
        if (other is callback and itself == 1) or not isinstance(other, MonitorCallback):
            continue
        if other.prefix == callback.prefix:
            raise ValueError(
                f"OptiscopeCallback: two callbacks in one Trainer with prefix={callback.prefix!r}; give each its own "
                "prefix= (the first part of its keys in the loggers, and its folder's name)"
            )
        if (
            None not in (callback.out_dir, other.out_dir)
            and Path(other.out_dir).resolve() == Path(callback.out_dir).resolve()
        ):
            raise ValueError(
                f"OptiscopeCallback: two callbacks in one Trainer with out_dir={str(callback.out_dir)!r}; give "
                "each a folder of its own"
            )


def check_options(out_dir: Any, every: Any, sinks: Any, curvature: Any, guard: Any) -> list[Any] | None:
    """The callback's arguments, checked when it is built rather than when training starts (where the
    ``Monitor`` would say the same, later); returns ``sinks`` as a list (an iterator would serve one fit only)."""
    if out_dir is not None:
        if not isinstance(out_dir, str | os.PathLike) or not str(out_dir).strip():
            raise TypeError(
                f"OptiscopeCallback: out_dir={out_dir!r} must be a folder's path (a str or Path), or None for the "
                "library's output directory"
            )
        if Path(out_dir).exists() and not Path(out_dir).is_dir():
            raise ValueError(f"OptiscopeCallback: out_dir={str(out_dir)!r} is a file; give a folder's path")
    check_schedule(every, curvature, guard, "OptiscopeCallback")
    if sinks is not None:
        sinks = checked_sinks(sinks, "OptiscopeCallback", absent="None for the default files")
    if curvature is not None and curvature.rank_batch_size is not None:
        # the noise scale over the ranks reads each rank's gradient inside DDP's all-reduce, and neither library
        # hands its callbacks the DDP-wrapped model (the Monitor's own advice, to wrap it, cannot be followed)
        raise ValueError(
            f"OptiscopeCallback: Curvature(rank_batch_size={curvature.rank_batch_size!r}) needs the DDP-wrapped "
            "model, which the library does not give its callbacks; for the noise scale give "
            "Curvature(micro_batches=...) or, with gradient accumulation in a run of one process, "
            "accumulation_batch_size=..."
        )
    return sinks


def check_passes(curvature: Curvature | None, passes: int, setting: str) -> None:
    """A one-line error when ``Curvature(accumulation_batch_size=...)`` is asked of a run whose every step takes
    ``passes`` < 2 backward passes (``setting`` names the library's option that sets them): the noise scale comes
    from the passes of an accumulated step, and each step would have none, leaving every record without it. Or
    of a job of several ranks: at an accumulated step's last pass DDP overwrites ``p.grad`` with the ranks'
    mean, so no pass's own gradient can be told (the monitor refuses a DDP model for this, but a library hands
    the callback the bare module)."""
    size = None if curvature is None else curvature.accumulation_batch_size
    if size is None:
        return
    ranks = runs.world_size()
    if ranks > 1:
        raise ValueError(
            f"OptiscopeCallback: Curvature(accumulation_batch_size={size}) cannot see a backward pass's own gradient "
            f"in a job of {ranks} ranks (DDP averages the ranks into p.grad at an accumulated step's last pass); "
            "give Curvature(micro_batches=...) for micro-batches of the curvature batch instead"
        )
    if passes < 2:
        raise ValueError(
            f"OptiscopeCallback: Curvature(accumulation_batch_size={size}) takes the noise scale from the backward "
            f"passes of an accumulated step, but {setting}={passes} takes one per step; set {setting} >= 2, or give "
            "Curvature(micro_batches=...) for micro-batches of the curvature batch"
        )


class MonitorCallback:
    """The options and state of both libraries' ``OptiscopeCallback`` (mixed into their callback classes).

    Args:
        out_dir: where ``metrics.jsonl`` and ``tensorboard/<label>`` go; None: ``metrics.jsonl`` in the library's
            folder ``/<prefix>`` when the run reports to a logger, no file when it does not.
        every: measure the first optimizer step and every ``every``-th.
        sinks: the monitor's sinks instead of optiscope's own files (e.g. ``[ConsoleSink()]``); the loggers
            get the metrics either way.
        curvature: ``optiscope.monitor.Curvature(batch, loss_fn, every=...)``: sharpness against the
            optimizer's threshold on a fixed batch every ``every`` steps; None leaves it off.
        guard: the ``DivergenceGuard`` whose tripping stops training (default ``CALLBACK_GUARD``, judged from the 9th
            step; e.g. ``DivergenceGuard(warmup=0, skipped=64)`` for a GradScaler that starts far above 2^16, or a
            ``warmup`` for a run whose loss may rise at first); None: records as usual, never stops.
        per_parameter: the per-parameter series for the loggers too (``flat_metrics``): True, or glob patterns
            of the parameters' names; False: the totals and the curvature.
        prefix: the first part of every key in the loggers, and the default folder's name; several callbacks in
            one Trainer each need their own.
        early_warning: ``Monitor``'s: True (or an ``EarlyWarning``) warns of a loss spike or divergence before it
            comes, in the records, the console and the loggers (``optiscope/warning_score``); default False.
        on_warning: ``Monitor``'s: a function of each warning, or ``"reduce_lr"`` (halve every group's lr).

    ``callback.monitor`` holds the monitor (its ``last_record``) and ``callback.diverged`` the divergence
    record, if any.
    """

    label = "monitor"

    def __init__(
        self,
        out_dir: Path | str | None = None,
        every: int = 10,
        sinks: Iterable[Any] | None = None,
        curvature: Curvature | None = None,
        guard: DivergenceGuard | None = CALLBACK_GUARD,
        per_parameter: bool | str | Iterable[str] = False,
        prefix: str = DEFAULT_PREFIX,
        early_warning: bool | EarlyWarning = False,
        on_warning: Callable[[dict[str, Any]], Any] | str | None = None,
    ) -> None:
        sinks = check_options(out_dir, every, sinks, curvature, guard)
        checked_warning(early_warning, on_warning, "OptiscopeCallback")
        self.early_warning, self.on_warning = early_warning, on_warning
        check_prefix(prefix, "OptiscopeCallback")
        parameter_filter(per_parameter, "OptiscopeCallback")
        self.out_dir, self.every, self.sinks, self.curvature, self.guard = out_dir, every, sinks, curvature, guard
        self.per_parameter, self.prefix = per_parameter, prefix
        self.folder: Path | None = None  # where this callback's files went, for a run it starts again
        self.attachment: Attachment | None = None
        self.diverged: dict[str, Any] | None = None
        self.rank_zero = True  # whether this process logs a divergence (set when the monitor is attached)

    @property
    def monitor(self) -> Monitor | None:
        return None if self.attachment is None else self.attachment.monitor

    def attach(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        log: Callable[[dict[str, float], int], Any] | None,
        root: Any,
        start_step: int,
        rank_zero: bool,
        saved: Sequence[Any] = (),
        where: str = "",
        scaled: bool = True,
        prepare: Callable[[Any], Any] | None = None,
    ) -> None:
        """Build the monitor for a run that starts at ``start_step``, handing each record, flattened, to ``log``,
        the library's loggers (None: it has none; then optiscope's files only go to ``out_dir``, else to
        ``root/<prefix>``, the library's folder). A resumed run (``start_step`` > 0) gets the
        first of ``saved`` (what was found where its checkpoint may be, None where nothing was; ``where`` says
        where they were looked for) that is a monitor's state of that step. ``scaled``: a loss scaler may skip
        steps (see ``Attachment``). ``prepare``: what the library does to each training batch before the model
        sees it (a cast to the weights' precision, a move to their device), done to the curvature batch too,
        which the user gave as the data comes; the user's ``Curvature`` is left as it was."""
        curvature = self.curvature
        if curvature is not None and prepare is not None:
            curvature = dataclasses.replace(curvature, batch=prepare(curvature.batch))
        sinks = self.sinks
        if sinks is None:
            # without out_dir, files only beside the loggers' (which have the metrics: no second TensorBoard)
            folder = None if log is None else Path(root) / self.prefix
            if self.out_dir is not None:
                folder = Path(self.out_dir)
            fresh = start_step == 0 and folder != self.folder
            sinks = own_files(folder, self.label, self.out_dir is not None, fresh)
            self.folder = folder
        if log is not None:
            sinks = [*sinks, LoggerSink(log, self.per_parameter, self.prefix)]
        monitor = build_monitor(
            model,
            optimizer,
            sinks=sinks,
            every=self.every,
            curvature=curvature,
            guard=self.guard,
            start_step=start_step,
            rank_zero=rank_zero,
            early_warning=self.early_warning,
            on_warning=self.on_warning,
        )
        if start_step > 0:
            resume(monitor, saved, start_step, where, rank_zero)
        self.attachment = Attachment(monitor, scaled)
        self.diverged = None
        self.rank_zero = rank_zero

    def stepped(self, reduce: str, counted: int, rank_zero: bool, **scalars: float) -> bool:
        """After the library may have stepped the optimizer (see ``Attachment.after_optimizer``): True when
        training must stop, having logged the diagnosis (on rank 0)."""
        if self.attachment is None:
            return False
        return self._stops(self.attachment.after_optimizer(reduce, counted, **scalars), rank_zero)

    def flushed(self) -> bool:
        """Have the guard judge the steps whose losses it has not read yet (``Monitor.flush``): before a checkpoint
        and at the end of training, on every rank (under DDP it is a collective). True when training must stop,
        having logged the diagnosis (on rank 0)."""
        if self.attachment is None or self.attachment.closed:
            return False
        return self._stops(self.attachment.flush(), self.rank_zero)

    def _stops(self, record: dict[str, Any] | None, rank_zero: bool) -> bool:
        if record is None:
            return False
        self.diverged = record
        if rank_zero:
            log.warning(diagnosis(record))
        return True

    def detach(self) -> None:
        """Remove the monitor's hooks and close its sinks; ``callback.monitor`` keeps its records."""
        if self.attachment is not None:
            self.attachment.close()


def resume(monitor: Monitor, saved: Sequence[Any], step: int, where: str, rank_zero: bool) -> None:
    """Give ``monitor``, built for a run resumed at ``step``, the first state in ``saved`` that is a monitor's
    of that step (one found elsewhere, e.g. a stale checkpoint, must not hide it): the divergence guard's
    reference losses and u/w history, the curvature warm start and the sharpness history the diagnosis
    reads, as if the run had not stopped. Without one (a checkpoint from before optiscope was attached, or
    one the callback could not find) a warning says that these start afresh."""
    found = [state for state in saved if state is not None]
    usable = [state for state in found if isinstance(state, dict) and state.keys() >= STATE_KEYS]
    of_step = next((state for state in usable if state["step_count"] == step), None)
    if of_step is not None:
        monitor.load_state_dict(of_step)
        return
    if rank_zero:
        if not found:
            why = "none was saved"
        elif not usable:
            unread = [f"{type(s).__name__}: {str(s).splitlines()[0][:120]}" for s in found if isinstance(s, Exception)]
            why = "what was found is not a monitor's state" + (f" ({unread[0]})" if unread else "")
        else:
            why = f"the one found is from step {usable[0]['step_count']}"
        log.warning(
            "optiscope: resuming at step %d without the monitor's state from that checkpoint (%s%s): the "
            "divergence guard, the curvature warm start and the sharpness history start afresh",
            step,
            why,
            f"; looked in {where}" if where else "",
        )


class Attachment:
    """A monitor fed by a library's callbacks: micro-batch losses in, one ``monitor.step`` per real step.
    ``scaled``: a loss scaler is at work, so a step the library counts and the optimizer does not take is one it
    skipped (judged: ``Monitor.skip``); without one the training code left it out on purpose (never judged)."""

    def __init__(self, monitor: Monitor, scaled: bool = True) -> None:
        self.monitor, self.scaled = monitor, scaled
        self.losses: list[Tensor] = []
        self.seen_steps = monitor.step_count
        self.diverged: dict[str, Any] | None = None
        self.closed = False
        self.warned = False  # about several optimizer steps in one batch

    def add_loss(self, loss: Tensor | float | None) -> None:
        """The loss of one micro-batch (ignored when the library gives none)."""
        if loss is not None:
            self.losses.append(torch.as_tensor(loss).detach().float().mean())

    def after_optimizer(self, reduce: str, counted: int, **scalars: float) -> dict[str, Any] | None:
        """Call after the library may have stepped the optimizer, with ``counted``, the library's own count of
        optimizer steps by now. When the optimizer stepped, send the step's loss — the ``reduce`` ("sum" or
        "mean") of its micro-batch losses — and ``scalars`` (``grad_norm_before_clip``) to the monitor; returns
        the divergence record the first time the monitor's guard trips, else None. When the library counted a
        step the optimizer did not take (a GradScaler skipped it: the libraries count it, the optimizer's hooks
        do not see it), its micro-batch losses are dropped, not carried into the next step's, and its number is
        used up (``Monitor.skip``, which judges a run that skips every step diverged, where a loss scaler is at
        work)."""
        if self.monitor.step_count == self.seen_steps:
            if counted > self.seen_steps:
                skipped, self.seen_steps = counted - self.seen_steps, counted
                self.monitor.skip(skipped, self._step_loss(reduce), scaled=self.scaled)  # judged while not diverged
                return None if self.diverged is not None else self._newly_diverged()
            return None  # no real optimizer step since the last call: an accumulation micro-batch, or a skipped step
        if self.monitor.step_count > self.seen_steps + 1 and not self.warned:
            self.warned = True
            log.warning(
                "optiscope: %d optimizer steps in one batch; the callback records once per batch, so the steps "
                "before the last have no record (step the optimizer at most once per training_step)",
                self.monitor.step_count - self.seen_steps,
            )
        self.seen_steps = self.monitor.step_count
        loss = self._step_loss(reduce)
        if self.diverged is not None:
            return None
        self.monitor.step(loss, **scalars)
        return self._newly_diverged()

    def flush(self) -> dict[str, Any] | None:
        """Judge the steps whose losses the monitor has not read yet; the divergence record the first time the
        guard trips, else None."""
        if self.diverged is not None:
            return None
        self.monitor.flush()
        return self._newly_diverged()

    def _step_loss(self, reduce: str) -> Tensor | None:
        """The ``reduce`` of the step's micro-batch losses (None without any); starts the next step's."""
        losses, self.losses = self.losses, []
        if not losses:
            return None
        stacked = torch.stack([x.to(losses[0].device) for x in losses])
        return stacked.sum() if reduce == "sum" else stacked.mean()

    def _newly_diverged(self) -> dict[str, Any] | None:
        if self.monitor.diverged is not None:
            self.diverged = self.monitor.diverged
            return self.diverged
        return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.monitor.close()


def diagnosis(record: dict[str, Any]) -> str:
    """One line for the library's log: the step, the reason and the parameters whose u/w exploded first."""
    return f"optiscope: {Diverged(record)}; training stops here"
