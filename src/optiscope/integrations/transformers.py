"""optiscope's monitor inside 🤗 ``Trainer``: ``OptiscopeCallback``.

::

    from optiscope.integrations.transformers import OptiscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[OptiscopeCallback(every=10)])
    trainer.train()   # every report_to logger gets optiscope/u_over_w/total, … at the Trainer's step

The monitor's hooks sit on the optimizer the Trainer steps (unwrapped from Accelerate's wrapper), so u
is the real update: after gradient accumulation and gradient clipping, once per update step, whatever
the optimizer (the Trainer's own, ``optimizers=(optiscope.optim.AdamW(...), None)``, or
``optimizer_cls_and_kwargs=(optiscope.optim.AdamW, {...})``); with ``max_grad_norm`` records also hold
``grad_norm_before_clip``, the ``grad_norm`` the Trainer logs. The loss of an update step is the one the
Trainer logs: the model's loss of each micro-batch, combined as the Trainer combines them. A divergence
sets ``control.should_training_stop`` (and ``should_save`` off, so a good checkpoint is not replaced by
a diverged one), logs the diagnosis as a warning and writes it to ``metrics.jsonl``. Ranks other than 0
measure (the loss is averaged over ranks, so all stop together) but write nothing. The monitor's state (the
divergence guard, the curvature warm start and history) is saved beside each checkpoint, as
``checkpoint-N/optiscope_monitor.pt``, and read back when the Trainer resumes from
``args.output_dir/checkpoint-N`` (where it saves them), so ``trainer.train(resume_from_checkpoint=True)``
resumes it exactly, or from the checkpoint ``args.resume_from_checkpoint`` names (as the 🤗 example scripts
pass it to ``train()``); the Trainer does not tell its callbacks which checkpoint it resumes from, so from
one elsewhere the monitor starts afresh, and says so.

Needs ``pip install 'optiscope[hf]'``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..runs import save_checkpoint
from .attach import MonitorCallback, check_passes, check_siblings, log

#: The monitor's state in each checkpoint directory the Trainer writes, for the callback with this prefix.
MONITOR_STATE = "{prefix}_monitor.pt"

__all__ = ["OptiscopeCallback"]


class OptiscopeCallback(MonitorCallback, TrainerCallback):
    """A 🤗 ``TrainerCallback`` that attaches an optiscope ``Monitor`` to the optimizer the ``Trainer`` steps.

    At ``on_train_begin`` it builds a ``Monitor`` on the Trainer's model and optimizer (unwrapped from
    Accelerate's), so u = θ_after − θ_before is the real update step, after gradient accumulation and clipping,
    whatever the optimizer; one record on the first update step and every ``every``-th, never one per
    micro-batch, sent through ``Trainer.log`` (every ``report_to`` integration gets them, flattened by
    ``optiscope.monitor.flat_metrics``, at the Trainer's step) and, when it reports to one, written to
    ``args.output_dir/optiscope/metrics.jsonl``. A divergence stops training.

    Args:
        *args: the keyword arguments below, by position, in their order.
        **kwargs: the keyword arguments below.

    Keyword Args:
        out_dir (str | Path | None): the folder for ``metrics.jsonl`` and ``tensorboard/trainer``; None:
            ``args.output_dir/<prefix>/metrics.jsonl`` when the Trainer reports to a logger, no file when
            ``report_to="none"``. A new run into a folder holding records is refused.
        every (int): measure the first optimizer step and every ``every``-th; an integer ≥ 1. Default 10.
        sinks (list | None): the monitor's sinks instead of the default files (e.g. ``[ConsoleSink()]``); None
            for the files.
        curvature (Curvature | None): ``Curvature(batch, loss_fn, every=...)``: sharpness against the
            optimizer's threshold on a fixed batch every ``every`` steps; None leaves it off. Not
            ``rank_batch_size`` (the Trainer does not hand callbacks the DDP-wrapped model).
        guard (DivergenceGuard | None): the guard whose tripping stops training; default
            ``DivergenceGuard(warmup=0)``, judged from the 9th step (e.g. ``DivergenceGuard(warmup=0,
            skipped=64)`` for a GradScaler that starts far above 2^16, or a ``warmup`` for a run whose loss
            may rise at first); None: records as usual, never stops.
        per_parameter (bool | str | list): the loggers get each parameter's series too: True, or glob patterns
            of the parameters' names (``"*attn*"``); default False: the totals and the curvature.
        prefix (str): the first part of every key in the loggers and the default folder's name (default
            ``"optiscope"``); several callbacks in one Trainer each need their own.
        early_warning (bool | EarlyWarning): warn of a loss spike or divergence before it comes (``Monitor``'s
            ``early_warning``: in the records, the console and the loggers as ``optiscope/warning_score``);
            default False.
        on_warning (Callable | str | None): a function of each warning, or ``"reduce_lr"`` (halve every param
            group's lr); needs ``early_warning``.

    Attributes:
        monitor: the ``Monitor`` (its ``last_record``) once training has begun, else None.
        diverged: the divergence record once the guard has tripped, else None.

    Raises:
        TypeError: ``out_dir`` is not a path; ``sinks``, ``curvature``, ``guard`` or ``early_warning`` of the
            wrong type.
        ValueError: ``out_dir`` is a file; ``every`` < 1; ``on_warning`` not a function or "reduce_lr", or
            without ``early_warning``; ``curvature.rank_batch_size`` given; a bad ``prefix``
            or ``per_parameter``; at ``on_train_begin``, another optiscope callback in the Trainer with this ``prefix``
            or ``out_dir``, or a new run into a folder holding records; at
            ``on_train_begin``, ``curvature.accumulation_batch_size`` with ``gradient_accumulation_steps`` < 2
            or in a job of several ranks.

    Examples:
        >>> import torch
        >>> from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
        >>> from optiscope.integrations.transformers import OptiscopeCallback
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=8, n_layer=1, n_head=2))
        >>> data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (8, 8))]
        >>> args = TrainingArguments(output_dir="run", max_steps=20, report_to="none", use_cpu=True)
        >>> callback = OptiscopeCallback(every=10)  # report_to="none": the records stay in callback.monitor
        >>> trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
        >>> callback in trainer.callback_handler.callbacks
        True
        >>> callback.monitor is None  # built when trainer.train() begins
        True

    Notes:
        - The loss of an update step is the one the Trainer logs: each micro-batch's model loss, summed when the
          model normalises by ``num_items_in_batch``, else averaged; from a model that returns a tuple, its
          first item. Where the Trainer computes the loss outside the model (``label_smoothing_factor``,
          ``compute_loss_func``) records carry ``loss`` None, the guard judges the weights alone, and a warning
          says so once; a Trainer subclass that overrides ``compute_loss`` (TRL's ``SFTTrainer``) gets a
          warning that records carry the model's loss.
        - With ``max_grad_norm`` > 0 records also hold ``grad_norm_before_clip``, the ``grad_norm`` the Trainer
          logs, read off ``trainer.accelerator.clip_grad_norm_`` while training (put back after); not under
          DeepSpeed, which clips inside its engine.
        - A divergence sets ``control.should_training_stop`` and ``should_save`` off (also for the end-of-epoch
          save), logs the diagnosis on the ``optiscope`` logger and writes it to ``metrics.jsonl``. The loss is
          measured on the weights before each step, so the checkpoint of the step before may already hold
          weights whose loss is NaN: resume from an earlier one. The guard reads the losses on measured steps,
          every ``guard.read_every`` steps and before each save (``Monitor.flush``; a divergence found there
          calls the save off), so a divergence stops training at most ``read_every`` − 1 steps after the step
          it names.
        - Ranks other than 0 measure (the loss is averaged over ranks, so all stop together) but write nothing.
          A step a GradScaler skips has no record and keeps its number, and its loss is not carried into the
          next step's; a run whose every step is skipped stops diverged at the guard's ``skipped``-th.
        - Resume: the monitor's state is saved beside each checkpoint as ``checkpoint-N/optiscope_monitor.pt``
          (where the Trainer writes: ``args.should_save``) and read back, with ``weights_only=True``, when the
          Trainer resumes from ``args.output_dir/checkpoint-N`` or from the checkpoint
          ``args.resume_from_checkpoint`` names; the Trainer does not tell callbacks which checkpoint it
          resumes from, so from one elsewhere the monitor starts afresh, and a warning says so. Re-running into
          the same ``output_dir`` rewrites this run's records after the starting step, so each step is written
          once: give each run you want to keep its own folder.
    """

    label = "trainer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loss_hook = None
        self._items_given = False
        self._said_no_loss = False  # warned that the model's forward gives no loss
        self._unwrap_clip = None  # takes the wrapper off the accelerator's clip_grad_norm_ (``noting_norms``)
        self._norm_before_clip: Any = None  # the norm the Trainer's clipping returned at this step
        self._trainer: Trainer | None = None  # whose log the records go through, while it trains with loggers
        self._held: dict[str, float] = {}  # the flat metrics of the step just taken, until the Trainer counts it

    @property
    def state_file(self) -> str:
        """The monitor's state in each checkpoint: ``optiscope_monitor.pt``, with another prefix its own."""
        return MONITOR_STATE.format(prefix=self.prefix)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._release()  # a Trainer trained again (or after an exception) gets a fresh monitor and hook
        check_passes(self.curvature, args.gradient_accumulation_steps, "gradient_accumulation_steps")
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps the real one
        places = [place / self.state_file for place in resumed_from(args, state)] if state.global_step > 0 else []
        saved, where = [saved_state(path) for path in places], " or ".join(map(str, places))
        trainer = calling_trainer()
        check_siblings(trainer.callback_handler.callbacks if trainer is not None else (), self)
        # through the Trainer's own log, at its step, so that every report_to integration gets the records
        self._trainer = trainer if trainer is not None and args.report_to else None
        self.attach(
            model,
            inner,
            None if self._trainer is None else self._hold,
            args.output_dir,
            state.global_step,
            state.is_world_process_zero,
            saved,
            where,
        )
        self._loss_hook = model.register_forward_hook(self._record_loss, with_kwargs=True)
        # DeepSpeed clips inside its engine's step, after this one's clip_grad_norm_ call, which returns the norm
        # the engine computed at the step before
        if trainer is not None and args.max_grad_norm > 0 and not getattr(trainer, "is_deepspeed_enabled", False):
            self._unwrap_clip = noting_norms(trainer.accelerator, self._note_norm)
        if (
            trainer is not None
            and type(trainer).compute_loss is not Trainer.compute_loss
            and state.is_world_process_zero
        ):
            # the model's loss is kept (TRL's SFTTrainer, for one, overrides compute_loss and trains on it)
            log.warning(
                "optiscope: %s overrides the Trainer's compute_loss: records carry the loss the model returns; "
                "the loss it trains on and logs may differ",
                type(trainer).__name__,
            )

    def _record_loss(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        """The loss of each training micro-batch, as the model computed it (evaluation passes are skipped)."""
        if not (module.training and torch.is_grad_enabled()) or self.attachment is None:
            return
        if isinstance(output, dict):
            loss = output.get("loss")
        elif isinstance(output, tuple | list) and output:  # the Trainer takes a tuple's first item as the loss
            first = output[0]
            loss = first if isinstance(first, torch.Tensor) and first.numel() == 1 else None
        else:
            loss = getattr(output, "loss", None)
        self._items_given = kwargs.get("num_items_in_batch") is not None
        if loss is None and not self._said_no_loss:
            self._said_no_loss = True
            log.warning(
                "optiscope: the model's forward gave no loss (the Trainer computes it itself with "
                "label_smoothing_factor, compute_loss_func, or an overridden compute_loss that calls the model "
                "without labels): records carry loss None, and divergence is judged by the weights alone"
            )
        self.attachment.add_loss(loss)

    def _note_norm(self, norm: Any) -> None:
        self._norm_before_clip = norm

    def on_optimizer_step(self, args, state, control, **kwargs):
        # Right after optimizer.step(), before the scheduler moves the learning rate on. With
        # num_items_in_batch the model normalises each micro-batch by the whole step's token count, so the
        # step's loss is their sum (times the ranks when the Trainer averages tokens across devices, as it
        # then does); otherwise the Trainer averages the micro-batch means.
        if self.attachment is None:
            return control
        if self._items_given and getattr(args, "average_tokens_across_devices", False):
            self.attachment.losses = [loss * args.world_size for loss in self.attachment.losses]
        # the norm before clipping is the one that shows a gradient exploding (the monitor's grad_norm is the
        # clipped one the optimizer used)
        norm, self._norm_before_clip = self._norm_before_clip, None
        # a tensor as it comes: the monitor reads it on measured steps only (float() here would wait for a GPU)
        scalars = {} if norm is None else {"grad_norm_before_clip": norm}
        # the Trainer counts this update step (global_step + 1 once this hook returns), taken or skipped
        reduce = "sum" if self._items_given else "mean"
        if self.stepped(reduce, state.global_step + 1, state.is_world_process_zero, **scalars):
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        # right after the Trainer wrote checkpoint-N for the step the monitor has just recorded (judged already
        # at on_step_end, unless the save was asked for elsewhere)
        self.flushed()
        if self.monitor is not None and args.should_save:  # where the Trainer writes (each node's main process too)
            save_checkpoint(checkpoint_dir(args, state) / self.state_file, self.monitor.state_dict())
        return control

    def _hold(self, metrics: dict[str, float], step: int) -> None:
        """A record's flat metrics, kept until ``on_step_end``, when the Trainer's step counts this one."""
        self._held.update(metrics)  # a divergence at a measured step: one log with both

    def on_step_end(self, args, state, control, **kwargs):
        # the steps the guard has not read yet are judged before the Trainer saves (every rank gets here alike)
        if control.should_save and self.flushed():
            control.should_training_stop = True
        if self._held and self._trainer is not None:
            held, self._held = self._held, {}
            # Trainer.log calls every callback's on_log, and the handler sets should_log off before: the
            # Trainer's own log of this step, which its flow callback has just asked for, must still happen
            should_log = control.should_log
            self._trainer.log(held)
            control.should_log = should_log
        if self.diverged is not None:  # runs after the Trainer's flow callback has decided to save
            control.should_save = False
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        # the stop cuts the epoch short, and the flow callback asks for its end-of-epoch save (save_strategy
        # "epoch") after the step's was called off: a diverged model must not become the checkpoint to resume
        return self.on_step_end(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        self.flushed()  # the last steps, since the guard's last reading
        self._release()

    def _release(self) -> None:
        self._trainer, self._held = None, {}
        if self._unwrap_clip is not None:
            self._unwrap_clip()
            self._unwrap_clip = None
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        self.detach()


def calling_trainer() -> Trainer | None:
    """The Trainer whose ``train()`` is calling this callback back, found on the call stack: 🤗 hands callbacks
    its args, state, model and optimizer but not itself, and whether the model's loss is the one it trains on
    depends on its class (a subclass may override ``compute_loss``)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        with contextlib.suppress(Exception):  # a lazy proxy may raise when asked its class: not the Trainer
            if isinstance(candidate, Trainer):
                return candidate
        frame = frame.f_back
    return None


def noting_norms(accelerator: Any, note: Callable[[Any], None]) -> Callable[[], None]:
    """Have ``accelerator.clip_grad_norm_`` hand ``note`` the norm it returns, and return what undoes that. The
    Trainer clips through it and keeps the returned norm, the gradients' total norm before clipping, for its
    log (``grad_norm``) only: no callback is given it, and none runs between the last backward pass and the
    clipping. (A path that does not clip through it — SageMaker's, gradients on several device meshes — leaves
    the records without it.)

    Undone, the wrapper notes nothing more and, while it is the accelerator's attribute, gives way to what it
    wrapped, passing over wrappers of this kind undone already: callbacks may undo theirs in any order (two on
    one Trainer are released in the order they were added) and leave the accelerator as they found it. One
    left on the accelerator by a training that raised (🤗 calls no callback then) goes on noting until the
    callback's next ``on_train_begin`` undoes it."""
    below = vars(accelerator).get("clip_grad_norm_")  # another wrapper, or None: the class's own method
    clip = accelerator.clip_grad_norm_

    def clipping(*args: Any, **kwargs: Any) -> Any:
        norm = clip(*args, **kwargs)
        if clipping.live:
            note(norm)
        return norm

    clipping.live, clipping.below = True, below
    accelerator.clip_grad_norm_ = clipping

    def undo() -> None:
        clipping.live = False
        if vars(accelerator).get("clip_grad_norm_") is not clipping:
            return  # wrapped again since: the wrapper above passes over this one when it is undone
        restore = clipping.below
        while restore is not None and getattr(restore, "live", True) is False:
            restore = restore.below
        if restore is None:
            vars(accelerator).pop("clip_grad_norm_", None)
        else:
            accelerator.clip_grad_norm_ = restore

    return undo


def checkpoint_dir(args: Any, state: Any) -> Path:
    """Where the Trainer saves (and, by default, resumes) the checkpoint of ``state.global_step``."""
    return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


def resumed_from(args: Any, state: Any) -> list[Path]:
    """Where the checkpoint the Trainer resumes from may be, in that order: the callbacks are not told. A
    path in ``args.resume_from_checkpoint``, which the Trainer does not read itself but the 🤗 example
    scripts pass to ``train()``; then where ``train(resume_from_checkpoint=True)`` finds it, the
    Trainer's own ``checkpoint_dir``. (The resume takes the first state of the step resumed.)"""
    named = args.resume_from_checkpoint
    own = checkpoint_dir(args, state)
    return [Path(named), own] if isinstance(named, str) and named and Path(named) != own else [own]


def saved_state(path: Path) -> Any:
    """What is saved at ``path``: None when there is no file; else what it holds, or the error that reading it
    raised (the resume then says that what it found is not a monitor's state, and starts the monitor afresh).
    Read with ``weights_only=True``, as the Trainer reads the rest of a checkpoint: a checkpoint from elsewhere
    runs no code."""
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — torch raises RuntimeError, EOFError, UnpicklingError, ... for a bad file
        return e
