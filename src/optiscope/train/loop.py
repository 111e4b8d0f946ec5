"""The training loop, written once for every experiment that trains.

Read ``train`` top to bottom: draw a batch, take one optimizer step (``optimizer_step``), let the task
evaluate, write a checkpoint. A ``Task`` says what is trained (the batches, the loss, the evaluation);
a ``Run`` holds what is being trained and everything recorded about it; a ``Plan`` says how long and
how often. Divergence is a result, not a crash: a loss or gradient that is not finite stops the run
*before* the step can write it into the weights, the monitor's guard stops it after a step that blew the
loss up, and either way the run's history says where and why, and its last good checkpoint is kept.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import runs
from ..checks import is_count, is_number
from ..monitor import Diverged, Monitor
from ..optim import clip_grad_norm
from . import checkpoint as checkpoints
from .distributed import any_rank, barrier, global_mean
from .progress import Progress
from .signals import Interrupted, stop_requests


def new_history(**extra: Any) -> dict[str, Any]:
    """The record a run starts with; a task adds its own entries (``extra``)."""
    return {
        "step": 0,
        "status": "running",
        "divergence": None,
        "train": {"step": [], "loss": [], "seconds": []},
        "seconds": {"train": 0.0, "total": 0.0, "cpu": 0.0},
        **extra,
    }


@dataclass
class Run:
    """One training run: what is trained, by what, and what has been recorded (``history``).

    ``net`` is what the forward pass is called on (``model`` itself, or a DDP / compiled wrapper of it);
    ``data`` is the generator every batch is drawn from, so its state is the position in the data.
    ``history["train"]`` holds, at every monitor record, the mean loss since the previous record.
    """

    label: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: torch.Generator
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    monitor: Monitor | None = None
    history: dict[str, Any] = field(default_factory=new_history)
    net: nn.Module | None = None
    running: dict[str, float] = field(default_factory=lambda: {"loss_sum": 0.0, "count": 0})

    @property
    def step(self) -> int:
        return self.history["step"]

    @property
    def forward(self) -> nn.Module:
        return self.net if self.net is not None else self.model


class Task(ABC):
    """What a run trains on. ``batch`` and ``loss`` are required; the rest are hooks."""

    @abstractmethod
    def batch(self, step: int, data: torch.Generator) -> Any:
        """The batch of optimizer step ``step`` (1, 2, …), drawn from ``data`` only."""

    @abstractmethod
    def loss(self, net: nn.Module, batch: Any) -> Tensor:
        """The loss of ``net`` (the model or its DDP / compiled wrapper) on ``batch``, to minimise."""

    def evaluate(self, run: Run) -> bool:
        """Evaluate at ``run.step`` into ``run.history``; True ends training early (a goal was reached)."""
        return False

    def evaluation_fault(self, run: Run) -> str | None:
        """Why the evaluation just made says the run diverged (a loss that is not finite), or None: the last
        step's harm shows in no training loss, only here and in the weights."""
        return None

    def on_record(self, run: Run, record: dict[str, Any]) -> None:  # noqa: B027 (an optional hook)
        """Called with every monitor record (a measured step), to keep what the task wants of it."""

    def finish(self, run: Run) -> None:  # noqa: B027 (an optional hook)
        """Called once when the run has ended (finished or diverged), before its outcome is saved."""

    def summary(self, run: Run) -> str:
        """One line about the finished run, for the console."""
        return f"{run.label}: {run.history['status']} after {run.step} steps"


@dataclass(frozen=True)
class Plan:
    """How long to train and how often to evaluate and checkpoint: every N steps and at the last step
    (``eval_every=None``: never evaluate; ``checkpoint_every=None``: only at the end)."""

    steps: int
    clip: float | None = None
    eval_every: int | None = None
    eval_at_start: bool = False
    checkpoint_every: int | None = None

    def __post_init__(self) -> None:
        every = "None or an integer >= 1"
        if not is_count(self.steps, 0):
            _refuse("steps", self.steps, "an integer >= 0", _is_integer(self.steps))
        if self.clip is not None and not (is_number(self.clip) and self.clip > 0):
            _refuse("clip", self.clip, "None or a number > 0 (the gradient norm cap)", is_number(self.clip))
        if self.eval_every is not None and not is_count(self.eval_every):
            _refuse("eval_every", self.eval_every, every, _is_integer(self.eval_every))
        if not isinstance(self.eval_at_start, bool):
            _refuse("eval_at_start", self.eval_at_start, "True or False", False)
        if self.checkpoint_every is not None and not is_count(self.checkpoint_every):
            what = f"{every} (None: only at the end)"
            _refuse("checkpoint_every", self.checkpoint_every, what, _is_integer(self.checkpoint_every))


def _is_integer(x: Any) -> bool:
    return is_count(x, -math.inf)


def _refuse(name: str, value: Any, what: str, right_type: bool) -> None:
    """A Plan's one-line refusal: a ValueError for a value of the right type, a TypeError for one of another."""
    raise (ValueError if right_type else TypeError)(f"Plan: {name}={value!r} must be {what}")


class _Clock:
    """Training seconds (without evaluations and checkpoints), total seconds and CPU seconds, carried
    across resumes in ``history["seconds"]``."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self._wall = self._mark = time.perf_counter()
        self._cpu = time.process_time()

    def lap(self, training: bool) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if training:
            self.seconds["train"] += now - self._mark
        self.seconds["total"] += now - self._wall
        self.seconds["cpu"] += cpu - self._cpu
        self._wall = self._mark = now
        self._cpu = cpu

    def skip(self) -> None:
        """Count nothing since the last lap (the time a checkpoint took to write, which it cannot hold)."""
        self._wall = self._mark = time.perf_counter()
        self._cpu = time.process_time()


def train(
    run: Run,
    task: Task,
    plan: Plan,
    checkpoint: Path | None = None,
    *,
    progress: Progress | None = None,
    writer: bool = True,
) -> dict[str, Any]:
    """Train ``run`` for ``plan.steps`` steps (fewer if the task reaches its goal or the run diverges).

    If ``checkpoint`` exists the run continues from it; a finished run's checkpoint returns its history
    as it is. Only the ``writer`` (rank 0) writes the checkpoint. Returns ``run.history``.
    """
    progress = progress or Progress(enabled=False)
    try:
        if checkpoint is not None and checkpoint.exists():
            checkpoints.restore(run, checkpoints.load(checkpoint, run.label), checkpoint)
        running = run.history["status"] == "running"
        if running and run.step > plan.steps:  # it would be called finished at a step the plan never reaches
            raise runs.CheckpointError(
                f"{checkpoint} holds run {run.label} interrupted at step {run.step}, past the plan's "
                f"steps={plan.steps}; resume it with steps >= {run.step}, or start it afresh elsewhere"
            )
        if run.monitor is not None and running:
            # what an interrupted attempt logged after the checkpoint is dropped; a run that ended is left whole (a
            # diverged run's last record is of the step it refused, run.step + 1)
            run.monitor.rewind_sinks(run.step)
            if run.monitor.guard is not None:
                run.monitor.guard = run.monitor.guard.within(plan.steps)
        if running:
            _loop(run, task, plan, checkpoint, progress, writer)
    finally:
        if run.monitor is not None:
            run.monitor.close()
        progress.stop()
    if progress.enabled:
        progress.finish(task.summary(run))
    return run.history


def _loop(run: Run, task: Task, plan: Plan, path: Path | None, progress: Progress, writer: bool) -> None:
    clock = _Clock(run.history["seconds"])

    def save() -> None:
        clock.lap(training=False)
        rng = checkpoints.rng_states() if path is not None else None  # every rank's, gathered by all
        if path is not None and writer:
            checkpoints.save(run, path, rng)
        barrier()
        clock.skip()

    progress.start(run.label, plan.steps, run.step)
    done = False
    with stop_requests() as stop:
        try:
            if run.step == 0 and plan.eval_at_start:
                done = task.evaluate(run)
                clock.lap(training=False)
                _check_evaluation(run, task)
            while run.step < plan.steps and not done:
                batch = task.batch(run.step + 1, run.data)
                loss = optimizer_step(run, task, batch, plan.clip)
                clock.lap(training=True)
                progress.update(run.step, loss)
                step = run.step
                if plan.eval_every and (step % plan.eval_every == 0 or step == plan.steps):
                    done = task.evaluate(run)
                    clock.lap(training=False)
                    _check_evaluation(run, task)
                stopping = any_rank(stop.requested)
                ending = done or step == plan.steps
                saving = ending or stopping or bool(plan.checkpoint_every and step % plan.checkpoint_every == 0)
                if saving:  # before the run is finished: a run that diverged in its last step is finished once
                    _check_finite_weights(run)
                if ending:
                    run.history["status"] = "ok"
                    task.finish(run)
                if saving:
                    save()
                if stopping:
                    raise Interrupted(run.label, step)
        except Diverged as diverged:
            clock.lap(training=False)
            run.history["status"] = "diverged"
            run.history["divergence"] = diverged.record
            task.finish(run)
            kept = checkpoints.keep_outcome(run, path) if path is not None and writer else None
            progress.note(f"{run.label}: {diverged}; {_kept(path, kept)}")
        if run.history["status"] == "running":  # the goal was reached before the first step (or steps=0)
            run.history["status"] = "ok"
            task.finish(run)
            save()  # as every finished run is: a resume returns this outcome instead of evaluating again
        # a request that came after the last step's check (while the run finished, saved or kept its divergence)
        # still stops the job here, with this run's outcome saved, rather than be forgotten when the next run starts
        if any_rank(stop.requested):
            raise Interrupted(run.label, run.step)


def optimizer_step(run: Run, task: Task, batch: Any, clip: float | None) -> float:
    """One optimizer step on ``batch``: zero_grad → forward → backward → clip → step → schedule → monitor
    (whose records then hold, with ``clip``, ``grad_norm_before_clip`` beside the clipped ``grad_norm``).

    Returns the loss (averaged over ranks). Raises ``Diverged`` before stepping if the loss or the
    gradients' norm is not finite, and after stepping if the monitor's guard trips.
    """
    run.optimizer.zero_grad(set_to_none=True)
    loss = task.loss(run.forward, batch)
    loss.backward()
    value = global_mean(float(loss.detach()))
    norm = None
    if clip is not None:
        trainable = [(n, p) for n, p in run.model.named_parameters() if p.requires_grad]
        norm = float(clip_grad_norm(trainable, clip, nonfinite="skip"))
    if not math.isfinite(value) or (norm is not None and not math.isfinite(norm)):
        reason = f"loss is {value}" if not math.isfinite(value) else f"the gradients' norm is {norm}"
        _diverge(run, value, f"{reason} before step {run.step + 1}; the step was not taken")
    run.optimizer.step()
    if run.scheduler is not None:
        run.scheduler.step()
    run.history["step"] += 1
    run.running["loss_sum"] += value
    run.running["count"] += 1
    if run.monitor is not None:
        mean = run.running["loss_sum"] / run.running["count"]
        # the monitor's grad_norm is of the gradient the optimizer used (clipped); the norm before clipping is
        # the one that shows a gradient exploding
        unclipped = {} if norm is None else {"grad_norm_before_clip": norm}
        try:
            record = run.monitor.step(value, mean_loss=mean, **unclipped)
        except Diverged as diverged:
            if diverged.measured is not None:  # the step's own record, written before the guard tripped
                _keep_record(run, task, diverged.measured, mean)
            raise
        if record is not None:
            _keep_record(run, task, record, mean)
    return value


def _keep_record(run: Run, task: Task, record: dict[str, Any], mean: float) -> None:
    """A monitor record into the run's history (the loss averaged since the last one) and to the task."""
    train = run.history["train"]
    train["step"].append(run.step)
    train["loss"].append(mean)
    train["seconds"].append(run.history["seconds"]["train"])
    run.running.update(loss_sum=0.0, count=0)
    task.on_record(run, record)


def _diverge(run: Run, loss: float, reason: str) -> None:
    if run.monitor is not None:
        run.monitor.diverge(run.step + 1, loss, reason)  # writes the record to the sinks and raises
    raise Diverged({"step": run.step + 1, "loss": loss, "reason": reason, "exploded_first": []})


def _check_finite_weights(run: Run) -> None:
    """A checkpoint must be a good state: weights that overflowed in the last step count as divergence."""
    bad = [n for n, p in run.model.named_parameters() if not torch.isfinite(p.detach()).all()]
    if bad:
        _diverged_after(run, f"non-finite weights after step {run.step} in {', '.join(bad[:5])}")


def _check_evaluation(run: Run, task: Task) -> None:
    """An evaluation whose loss is not finite (``Task.evaluation_fault``) is a divergence of the step before it."""
    reason = task.evaluation_fault(run)
    if reason is not None:
        _diverged_after(run, reason)


def _diverged_after(run: Run, reason: str) -> None:
    """The run diverged in the step it took last (``run.step``), found after it: in its weights or evaluation."""
    if run.monitor is not None:
        run.monitor.diverge(run.step, math.nan, reason)
    raise Diverged({"step": run.step, "loss": math.nan, "reason": reason, "exploded_first": []})


def _kept(path: Path | None, step: int | None) -> str:
    if path is None:
        return "no checkpoint is kept for this run"
    if step is None:
        return "it diverged before its first checkpoint, so there is none to keep"
    return f"its last good checkpoint (step {step}) is kept: {path}"
