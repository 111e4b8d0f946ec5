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

    The optimizer updates the parameters θ of ``model``; every batch is drawn from ``data``; ``history`` is the
    run's JSON-able record. ``train`` changes all of it in place and writes all of it into the checkpoint, so the
    run resumes exactly.

    Args:
        label: the run's name, e.g. ``"adam@0.001"``; a checkpoint of another label is refused.
        model: the module whose parameters θ are trained and checkpointed.
        optimizer: any ``torch.optim.Optimizer`` over ``model``'s parameters (ours or torch's).
        data: the ``torch.Generator`` every batch is drawn from, so its state is the position in the data.
        scheduler: a ``torch.optim.lr_scheduler`` scheduler, stepped after every optimizer step (it sets η);
            None: η stays as the optimizer has it.
        monitor: a [`Monitor`][optiscope.monitor.Monitor] of ``model`` and ``optimizer``: records every ``every``
            steps and guards against divergence; None: no records, no guard.
        history: the record; by default a new one (``step`` 0, ``status`` ``"running"``, ``divergence`` None,
            ``train`` with empty ``step``, ``loss`` and ``seconds`` lists, ``seconds`` with ``train``, ``total``
            and ``cpu`` at 0). A task adds its own entries.
        net: what the forward pass is called on: a DDP or compiled wrapper of ``model``; None: ``model`` itself.
        running: the sum of the losses and their count since the last monitor record (``{"loss_sum": 0.0,
            "count": 0}`` to start with).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from optiscope.train import Run
        >>> model = nn.Linear(3, 1)
        >>> run = Run("sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(0))
        >>> run.step, run.history["status"], run.forward is model
        (0, 'running', True)

    Notes:
        ``history["train"]`` holds, at every monitor record, the step, the mean loss since the previous record
        and the training seconds so far; without a monitor it stays empty. ``history["seconds"]`` counts the
        training seconds (without evaluations and checkpoints), the total and the CPU seconds, carried across
        resumes. ``history["status"]`` goes from ``"running"`` to ``"ok"`` or ``"diverged"``;
        ``history["divergence"]`` is then the divergence record (``step``, ``loss``, ``reason``,
        ``exploded_first``; with a checkpoint, ``checkpoint_step``: the last good one's step, None if none).
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
        """Optimizer steps taken so far (``history["step"]``)."""
        return self.history["step"]

    @property
    def forward(self) -> nn.Module:
        """What the forward pass is called on: ``net`` if given, else ``model``."""
        return self.net if self.net is not None else self.model


class Task(ABC):
    """What a run trains on: how to draw a batch, the loss to minimise, what to evaluate.

    Subclass it with ``batch`` and ``loss``; the rest are hooks with defaults. At each step ``train`` draws
    ``batch(step, run.data)``, takes L = ``loss(run.forward, batch)`` and g = ∇θ L, and lets the optimizer update
    θ; it calls ``evaluate`` at the plan's evaluation steps, ``on_record`` with every monitor record, ``finish``
    once when the run has ended and ``summary`` for the console line.

    Examples:
        A linear model learns y = x₁ + x₂ + x₃, and stops once its evaluation loss is below 10⁻³:

        >>> import torch
        >>> from torch import nn
        >>> from optiscope.train import Plan, Run, Task, train
        >>> class Sum(Task):
        ...     def batch(self, step, data):
        ...         x = torch.randn(32, 3, generator=data)
        ...         return x, x.sum(1, keepdim=True)
        ...     def loss(self, net, batch):
        ...         x, y = batch
        ...         return nn.functional.mse_loss(net(x), y)
        ...     def evaluate(self, run):
        ...         with torch.no_grad():
        ...             loss = float(self.loss(run.model, self.batch(0, torch.Generator().manual_seed(1))))
        ...         run.history.setdefault("eval_loss", []).append(loss)
        ...         return loss < 1e-3  # the goal: training ends early
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Linear(3, 1)
        >>> run = Run("sgd", model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(0))
        >>> history = train(run, Sum(), Plan(steps=1000, eval_every=10))
        >>> history["status"], history["step"] < 1000, history["eval_loss"][-1] < 1e-3
        ('ok', True, True)
    """

    @abstractmethod
    def batch(self, step: int, data: torch.Generator) -> Any:
        """The batch of optimizer step ``step``, drawn from ``data`` only.

        Args:
            step: the optimizer step the batch is for: 1, 2, …
            data: the run's generator (``Run.data``); drawing from it alone makes the checkpoint hold the
                position in the data.

        Returns:
            Whatever ``loss`` takes.
        """

    @abstractmethod
    def loss(self, net: nn.Module, batch: Any) -> Tensor:
        """The loss L of ``net`` on ``batch``, to minimise.

        Args:
            net: the model or its DDP / compiled wrapper (``Run.forward``).
            batch: what ``batch`` returned.

        Returns:
            A scalar tensor; ``train`` calls ``backward`` on it.
        """

    def evaluate(self, run: Run) -> bool:
        """Evaluate at ``run.step`` into ``run.history``.

        Args:
            run: the run, after its step ``run.step``.

        Returns:
            True to end training early (a goal was reached); the default never does.
        """
        return False

    def evaluation_fault(self, run: Run) -> str | None:
        """Why the evaluation just made says the run diverged (a loss that is not finite), or None.

        The last step's harm shows in no training loss, only here and in the weights; a reason given here makes
        ``train`` count the run as diverged at ``run.step``.

        Args:
            run: the run, just evaluated.

        Returns:
            The reason, one line; None (the default) when the evaluation is fine.
        """
        return None

    def on_record(self, run: Run, record: dict[str, Any]) -> None:  # noqa: B027 (an optional hook)
        """Called with every monitor record (a measured step), to keep what the task wants of it.

        Args:
            run: the run, after the measured step.
            record: the monitor's record of that step.
        """

    def finish(self, run: Run) -> None:  # noqa: B027 (an optional hook)
        """Called once when the run has ended (finished or diverged), before its outcome is saved.

        Args:
            run: the run, its ``history["status"]`` set to ``"ok"`` or ``"diverged"``.
        """

    def summary(self, run: Run) -> str:
        """One line about the finished run, for the console.

        Args:
            run: the finished run.

        Returns:
            By default ``"<label>: <status> after <step> steps"``.
        """
        return f"{run.label}: {run.history['status']} after {run.step} steps"


@dataclass(frozen=True)
class Plan:
    """How long to train, whether to clip, and how often to evaluate and checkpoint.

    Evaluations and checkpoints come every N steps and at the last step. With ``clip`` = c, the gradient g of all
    trainable parameters is scaled before each step to g · min(1, c / ‖g‖), ‖g‖ its global L2 norm.

    Args:
        steps: optimizer steps in all, an integer >= 0 (a resumed run counts the steps it took before).
        clip: the cap c on the gradient's global norm, a number > 0; None: no clipping.
        eval_every: evaluate (``Task.evaluate``) every this many steps and at the last, an integer >= 1;
            None: never during training.
        eval_at_start: also evaluate before the first step (of a run at step 0).
        checkpoint_every: write the checkpoint every this many steps, an integer >= 1; None: only at the end.

    Raises:
        ValueError: a value of the right type out of its range (``steps=-1``, ``clip=0``); the message names it.
        TypeError: a value of another type (``steps=1.5``, ``eval_at_start=1``; a bool is no count).

    Examples:
        >>> from optiscope.train import Plan
        >>> Plan(steps=1000, clip=1.0, eval_every=100)
        Plan(steps=1000, clip=1.0, eval_every=100, eval_at_start=False, checkpoint_every=None)
        >>> Plan(steps=-1)
        Traceback (most recent call last):
        ValueError: Plan: steps=-1 must be an integer >= 0

    Notes:
        Whatever ``checkpoint_every`` says, the checkpoint is also written when the run finishes and when a stop
        is requested (Ctrl-C, SIGTERM); a run that diverges has its outcome recorded in its last good checkpoint.
    """

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

    Each step is zero_grad → forward → backward → clip → step → schedule → monitor: the task's batch and loss L,
    g = ∇θ L, g clipped to ‖g‖ ≤ ``plan.clip``, the optimizer's update of θ, the scheduler's η, the monitor's
    record. Then the task evaluates (every ``plan.eval_every`` steps) and the checkpoint is written (every
    ``plan.checkpoint_every`` steps and at the end). If ``checkpoint`` exists the run continues from it.

    Args:
        run: what is trained (model, optimizer, data generator, …); changed in place.
        task: the batches, the loss, the evaluation.
        plan: how many steps, the clipping, how often to evaluate and checkpoint.
        checkpoint: the checkpoint file to resume from and write (atomically); None: none, the run cannot resume.
        progress: the console's progress line (``optiscope.train.progress.Progress``); None: nothing printed.
        writer: whether this process writes the checkpoint: under torchrun, True on rank 0 only.

    Returns:
        ``run.history``: ``step`` (steps taken), ``status`` (``"ok"`` or ``"diverged"``), ``divergence`` (None, or
            where and why), ``train`` (``step``, ``loss`` and ``seconds`` at each monitor record), ``seconds``
            (``train``, ``total``, ``cpu``) and whatever the task added.

    Raises:
        CheckpointError: ``checkpoint`` is unreadable, damaged, not an optiscope training checkpoint, another
            run's, shaped for another model or optimizer (nothing is changed), or holds this run interrupted at a
            step past ``plan.steps`` (resume it with steps >= that step).
        Interrupted: a Ctrl-C or SIGTERM came; the run stopped after a complete step, its checkpoint written.
        KeyboardInterrupt: a second signal of a kind that came before: stopped at once, from the last checkpoint.
        WriteError: the machine would not let the checkpoint be written (a full disk, a read-only folder).

    Examples:
        >>> from pathlib import Path
        >>> import torch
        >>> from torch import nn
        >>> from optiscope.train import Plan, Run, Task, train
        >>> class Sum(Task):
        ...     def batch(self, step, data):
        ...         x = torch.randn(32, 3, generator=data)
        ...         return x, x.sum(1, keepdim=True)
        ...     def loss(self, net, batch):
        ...         x, y = batch
        ...         return nn.functional.mse_loss(net(x), y)
        >>> def new_run():
        ...     torch.manual_seed(0)
        ...     model = nn.Linear(3, 1)
        ...     optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ...     return Run("sgd", model, optimizer, torch.Generator().manual_seed(0))
        >>> run = new_run()
        >>> history = train(run, Sum(), Plan(steps=100), Path("sgd.pt"))
        >>> history["status"], history["step"], round(run.model.weight.sum().item(), 3)
        ('ok', 100, 3.0)
        >>> train(new_run(), Sum(), Plan(steps=100), Path("sgd.pt"))["step"]  # finished: its history as it is
        100

    Notes:
        Divergence is a result, not a crash. A loss or gradient norm that is not finite stops the run *before*
        the step can write it into the weights (the step is not taken); the monitor's guard stops it after a step
        that blew the loss up; weights that are not finite at a checkpoint, or an evaluation the task calls a
        divergence (``Task.evaluation_fault``), are a divergence of the step taken last. Either way the history
        says where and why, ``Task.finish`` runs, and the last good checkpoint is kept with the outcome recorded
        in it (``divergence["checkpoint_step"]``); the progress line says which.

        A finished or diverged run's checkpoint returns its history as it is, so resuming a job of several runs
        skips the finished ones and continues the interrupted one. A run that reaches its goal before its first
        step (or ``steps=0``) is finished and saved too: a resume returns that outcome instead of evaluating
        again. A stop requested while the run was ending (its last evaluation, its checkpoint, its divergence)
        still raises ``Interrupted`` once the outcome is saved, rather than be forgotten when the next run starts.
        Outside the main thread, where Python cannot install signal handlers, signals keep their defaults.

        Before a run trains, the monitor's sinks drop what an interrupted attempt logged after the checkpoint (a
        run that ended is left whole: a diverged run's last record is of the step it refused), and its guard's
        warm-up is cut to at most a tenth of ``plan.steps`` (or a short run would never be judged). The monitor
        is closed when ``train`` returns or raises. With ``plan.clip`` its records hold ``grad_norm_before_clip``
        beside the clipped ``grad_norm``.

        Under torchrun every rank calls ``train``: the loss is averaged over ranks, every rank's RNG states are
        gathered into the checkpoint, and only the ``writer`` writes it.
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
                done = evaluate(run, task)
                clock.lap(training=False)
                _check_evaluation(run, task)
            while run.step < plan.steps and not done:
                batch = task.batch(run.step + 1, run.data)
                loss = optimizer_step(run, task, batch, plan.clip)
                clock.lap(training=True)
                progress.update(run.step, loss)
                step = run.step
                if plan.eval_every and (step % plan.eval_every == 0 or step == plan.steps):
                    done = evaluate(run, task)
                    clock.lap(training=False)
                    _check_evaluation(run, task)
                stopping = any_rank(stop.requested)
                ending = done or step == plan.steps
                saving = ending or stopping or bool(plan.checkpoint_every and step % plan.checkpoint_every == 0)
                if saving:  # before the run is finished: a run that diverged in its last step is finished once
                    if run.monitor is not None:
                        run.monitor.flush()  # the losses the guard has not read yet (under torchrun), judged first
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


def evaluate(run: Run, task: Task) -> bool:
    """``task.evaluate(run)``, at the weights the optimizer means to be evaluated.

    A schedule-free optimizer (Defazio et al. 2024, "The Road Less Scheduled": pytorch-optimizer's
    ``ScheduleFreeAdamW``, the ``schedulefree`` package) trains at an interpolation y of its iterates and is
    evaluated at their average x; its ``eval()`` moves the weights to x and ``train()`` back to y. An optimizer
    with both methods is switched to x for the evaluation and back before the next step, so a schedule-free run
    is judged by the weights it would be deployed with. Every other optimizer is evaluated as it is.

    Args:
        run: the run, after its step ``run.step``.
        task: the task whose evaluation is made.

    Returns:
        What ``task.evaluate`` returned: True to end training early.
    """
    switches = all(callable(getattr(run.optimizer, name, None)) for name in ("eval", "train"))
    if not switches:
        return task.evaluate(run)
    run.optimizer.eval()
    try:
        return task.evaluate(run)
    finally:
        run.optimizer.train()


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
