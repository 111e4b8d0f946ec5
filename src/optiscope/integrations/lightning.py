"""optiscope's monitor inside a Lightning ``Trainer``: ``OptiscopeCallback``.

::

    from optiscope.integrations.lightning import OptiscopeCallback

    trainer = lightning.Trainer(max_steps=1000, callbacks=[OptiscopeCallback(every=10)])
    trainer.fit(module, data)   # every logger in trainer.loggers gets optiscope/u_over_w/total, …

The monitor's hooks sit on the optimizer Lightning steps, so u is the real update after gradient
accumulation and clipping, once per optimizer step, in automatic optimisation (where Lightning steps the
optimizer with a closure that runs forward and backward) and in manual optimisation (where the module
calls ``opt.step()`` itself, at most once per ``training_step``: the callback records once per batch).
The loss of a step is the mean of what ``training_step`` returned for the batches since the previous step
(in automatic optimisation Lightning divides each by ``accumulate_grad_batches``, which is undone).
With ``gradient_clip_val``, records in automatic optimisation also hold ``grad_norm_before_clip``.
A divergence sets ``trainer.should_stop``, logs the diagnosis as a warning,
writes it to ``metrics.jsonl`` and keeps ``ModelCheckpoint`` from saving the diverged model. Ranks other
than 0 measure but write nothing. The monitor's state (the divergence guard, the curvature warm start and
history) travels in Lightning's checkpoints as the callback's state, so ``trainer.fit(..., ckpt_path=...)``
resumes it exactly.

One optimizer per module (``configure_optimizers`` returning several is refused). Needs
``pip install 'optiscope[lightning]'``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback

from .attach import DEFAULT_PREFIX, MonitorCallback, check_passes, check_siblings

__all__ = ["OptiscopeCallback"]


class OptiscopeCallback(MonitorCallback, Callback):
    """A Lightning ``Callback`` that attaches an optiscope ``Monitor`` to the module and its optimizer.

    At ``on_train_start`` it builds a ``Monitor`` on the module and the optimizer Lightning steps, so
    u = θ_after − θ_before is the real update, after gradient accumulation and clipping, once per optimizer
    step, in automatic and in manual optimisation; one record on the first step and every ``every``-th, sent
    to every logger in ``trainer.loggers`` (flattened by ``optiscope.monitor.flat_metrics``, at the step
    ``self.log`` uses for the same batch) and, with a logger, written to
    ``trainer.default_root_dir/optiscope/metrics.jsonl``. A divergence stops the fit.

    Args:
        *args: the keyword arguments below, by position, in their order.
        **kwargs: the keyword arguments below.

    Keyword Args:
        out_dir (str | Path | None): the folder for ``metrics.jsonl`` and ``tensorboard/lightning``; None:
            ``default_root_dir/<prefix>/metrics.jsonl`` with a logger, no file with ``logger=False``. A new run
            into a folder holding records is refused.
        every (int): measure the first optimizer step and every ``every``-th; an integer ≥ 1. Default 10.
        sinks (list | None): the monitor's sinks instead of the default files (e.g. ``[ConsoleSink()]``); None
            for the files.
        curvature (Curvature | None): ``Curvature(batch, loss_fn, every=...)``: sharpness against the
            optimizer's threshold on a fixed batch every ``every`` steps, measured with the optimizer Lightning
            steps; the batch is cast and moved as Lightning does a training batch. None leaves it off. Not
            ``rank_batch_size`` (Lightning does not hand callbacks the DDP-wrapped model).
        guard (DivergenceGuard | None): the guard whose tripping stops the fit; default
            ``DivergenceGuard(warmup=0)``, judged from the 9th step; None: records as usual, never stops.
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
        monitor: the ``Monitor`` (its ``last_record``) once training has started, else None.
        diverged: the divergence record once the guard has tripped, else None.

    Raises:
        TypeError: ``out_dir`` is not a path; ``sinks``, ``curvature``, ``guard`` or ``early_warning`` of the
            wrong type.
        ValueError: ``out_dir`` is a file; ``every`` < 1; ``on_warning`` not a function or "reduce_lr", or
            without ``early_warning``; ``curvature.rank_batch_size`` given; a bad ``prefix``
            or ``per_parameter``; as the Trainer is built (before Lightning's own error about state keys), another
            optiscope callback in it with this ``prefix`` or ``out_dir``, or this one twice; at ``on_train_start``,
            a new run into a folder holding records; at
            ``on_train_start``, a module with several optimizers, or, in automatic optimisation,
            ``curvature.accumulation_batch_size`` with ``accumulate_grad_batches`` < 2 or in a job of several ranks.

    Examples:
        >>> import json
        >>> import lightning
        >>> import torch
        >>> from optiscope.integrations.lightning import OptiscopeCallback
        >>> class Regression(lightning.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return torch.nn.functional.mse_loss(self.net(x), y)
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.randn(16, 4)
        >>> dataset = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
        >>> data = torch.utils.data.DataLoader(dataset, batch_size=4)
        >>> callback = OptiscopeCallback(out_dir="run", every=2)  # logger=False: files only in out_dir
        >>> trainer = lightning.Trainer(
        ...     max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        ...     enable_model_summary=False, callbacks=[callback],
        ... )
        >>> trainer.fit(Regression(), data)
        >>> [record["step"] for record in map(json.loads, open("run/metrics.jsonl"))]
        [1, 2, 4]

    Notes:
        - The loss of a step is the mean of what ``training_step`` returned for its batches (in automatic
          optimisation Lightning divides each by ``accumulate_grad_batches``, also in an epoch's last, shorter
          window, which is undone). With ``gradient_clip_val``, records in automatic optimisation also hold
          ``grad_norm_before_clip``, the accumulated gradients' norm where Lightning is about to clip them
          (after a GradScaler's unscaling; on measured steps only; the whole model's under
          ``ModelParallelStrategy``, whose gradients are FSDP2's DTensors, while ``FSDPStrategy`` does not clip by
          norm); in manual optimisation the module clips out of the callback's sight.
        - Manual optimisation: the module calls ``opt.step()`` at most once per ``training_step``: the callback
          records once per batch, so of several steps in one batch only the last can have a record (a warning
          says so).
        - A divergence sets ``trainer.should_stop`` (again at each batch: Lightning trains on to ``min_steps``),
          logs the diagnosis as a warning, writes it to ``metrics.jsonl`` and keeps ``ModelCheckpoint`` from
          saving the diverged model (through its private ``_last_global_step_saved``, and ``save_last`` off
          at the end of training, both put back when the fit ends; a Lightning without that attribute saves as
          before). The loss is measured on the weights before each step, so the checkpoint of the step before
          may already hold bad weights: resume from an earlier one. The guard reads the losses on measured
          steps, every ``guard.read_every`` steps, when a checkpoint is built and at the end of training
          (``Monitor.flush``), so a divergence stops the fit at most ``read_every`` − 1 steps after the step it
          names; a checkpoint saved in between may hold the diverged model.
        - A step the GradScaler of ``precision="16-mixed"`` skips has no record and keeps the number Lightning
          gives it; a run whose every step is skipped stops diverged. Without a GradScaler, a step Lightning
          counts and the optimizer does not take (a module's own ``optimizer_step`` that leaves it out) uses up
          its number and is never judged.
        - Ranks other than 0 measure but write nothing. One optimizer per module. The monitor's state travels in
          Lightning's checkpoints as the callback's state, so ``trainer.fit(..., ckpt_path=...)`` resumes it
          exactly (from a checkpoint without it a warning says the monitor starts afresh); a second ``fit`` on
          the same Trainer goes on with the monitor it has.
    """

    label = "lightning"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._saved: dict[str, Any] | None = None  # the monitor's state from the checkpoint resumed, until attached
        # the ModelCheckpoints held from saving a diverged model, with what they held before (``_hold_checkpoints``)
        self._held: list[tuple[Any, Any, Any]] = []
        self._norm_before_clip: torch.Tensor | None = None  # of the step being taken, until it is recorded

    @property
    def state_key(self) -> str:
        # Lightning keeps each stateful callback's state under its key, one per callback: the prefix tells them
        # apart (the default's is the class's name, as before it, so that older checkpoints resume)
        validating = _validated_callbacks()
        if validating is not None:
            check_siblings(validating, self)
        return super().state_key if self.prefix == DEFAULT_PREFIX else self._generate_state_key(prefix=self.prefix)

    def state_dict(self) -> dict[str, Any]:
        # Lightning builds a checkpoint on every rank: the losses not read yet are judged first (a collective
        # under DDP), so that the state holds none and a resumed job averages nothing differently
        self.flushed()
        return {} if self.monitor is None else {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks before on_train_start, where the monitor is built
        self._saved = state_dict.get("monitor")

    def on_train_start(self, trainer, pl_module) -> None:
        self._release_checkpoints()  # a fit that raised did not reach on_fit_end
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"OptiscopeCallback: the module has {len(trainer.optimizers)} optimizers; it monitors exactly one"
            )
        if pl_module.automatic_optimization:  # in manual optimisation the module accumulates by itself
            check_passes(self.curvature, trainer.accumulate_grad_batches, "accumulate_grad_batches")
        check_siblings(trainer.callbacks, self)
        saved, self._saved = self._saved, None
        where = "the checkpoint's callback state"
        if saved is None and self.monitor is not None and self.monitor.step_count == trainer.global_step:
            saved, where = self.monitor.state_dict(), ""  # fit() again on the same Trainer: go on from the last
        # a step counted but not taken is a loss scaler's skip only in float16 precision (a GradScaler's, or
        # DeepSpeed's own); otherwise the module's own optimizer_step left it out on purpose: no divergence
        scaled = str(trainer.precision).startswith("16")

        def prepare(batch: Any) -> Any:
            # as Lightning's loop does to each training batch: "64-true" / "bf16-true" cast the weights, and
            # the batch's floats with them; the strategy moves it to the weights' device (the module's own
            # transfer hooks, which may augment data, are not run on the fixed batch)
            return move_data_to_device(trainer.precision_plugin.convert_input(batch), trainer.strategy.root_device)

        self.attach(
            pl_module,
            trainer.optimizers[0],
            to_loggers(trainer) if trainer.loggers else None,
            trainer.default_root_dir,
            trainer.global_step,
            trainer.is_global_zero,
            [saved],
            where,
            scaled,
            prepare,
        )

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # In automatic optimisation Lightning calls this after the backward passes (and a GradScaler's unscaling)
        # and before it clips: the norm here is the one that shows a gradient exploding (the monitor's grad_norm
        # is the clipped one the optimizer used). In manual optimisation the module has clipped already.
        if self.attachment is None or not pl_module.automatic_optimization or not trainer.gradient_clip_val:
            return
        monitor = self.attachment.monitor
        if not monitor.is_measured(monitor.step_count + 1):  # a pass over every gradient, for measured steps only
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:  # ‖g‖ = ‖(‖g_i‖)_i‖, as torch's clip_grad_norm_ computes it (its get_total_norm is torch ≥ 2.6)
            norms = [torch.linalg.vector_norm(g).to(grads[0].device) for g in grads]
            self._norm_before_clip = torch.linalg.vector_norm(torch.stack(norms))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.attachment is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None and pl_module.automatic_optimization:
            # Lightning divides each batch's loss by accumulate_grad_batches, also in an epoch's last, shorter
            # window: undone, so that a step's loss is the mean of its batches' however many there were
            loss = loss * trainer.accumulate_grad_batches
        self.attachment.add_loss(loss)
        norm, self._norm_before_clip = self._norm_before_clip, None
        # a tensor as it comes: the monitor reads it on measured steps only (float() here would wait for a GPU)
        scalars = {} if norm is None else {"grad_norm_before_clip": norm}
        # again at every batch: Lightning sets should_stop back to False while min_steps / min_epochs are not met
        stop = self.stepped("mean", trainer.global_step, trainer.is_global_zero, **scalars)
        if stop or self.diverged is not None:
            trainer.should_stop = True
        self._hold_checkpoints(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._hold_checkpoints(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._hold_checkpoints(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.flushed()  # the last steps, since the guard's last reading
        self._hold_checkpoints(trainer, at_end=True)
        self.detach()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._release_checkpoints()

    def on_exception(self, trainer, pl_module, exception) -> None:
        # a fit that raised reaches neither on_train_end nor on_fit_end: the optimizer must not keep the
        # monitor's hooks, nor the sinks their open files
        self.detach()
        self._release_checkpoints()

    def _hold_checkpoints(self, trainer, at_end: bool = False) -> None:
        """Once the run has diverged, keep Lightning's ``ModelCheckpoint`` callbacks from saving its model.

        They save after ``should_stop`` too, at the batch's end, the epoch's, validation's and training's (and
        Lightning trains on after it up to ``min_steps``): with ``save_top_k=1`` the diverged model replaced the
        last good checkpoint, and ``last.ckpt`` with it (Lightning 2.6.6). Lightning runs the ModelCheckpoints
        after the other callbacks at each of those points, so this runs first and tells each that the current
        step is saved already (its private ``_last_global_step_saved``: there is no public way to call a save
        off) and, at the end of training, turns its ``save_last`` off. ``on_fit_end`` puts both back, so the
        next fit on this Trainer saves as before. A Lightning without that attribute saves as it would."""
        if self.diverged is None:
            return
        held = {id(c) for c, _, _ in self._held}
        for c in trainer.checkpoint_callbacks:
            if not hasattr(c, "_last_global_step_saved"):
                continue
            if id(c) not in held:
                self._held.append((c, c._last_global_step_saved, c.save_last))
            c._last_global_step_saved = trainer.global_step
            if at_end:
                c.save_last = False

    def _release_checkpoints(self) -> None:
        for c, last_step, save_last in self._held:
            c._last_global_step_saved, c.save_last = last_step, save_last
        self._held = []


def _validated_callbacks() -> list[Any] | None:
    """The Trainer's callbacks while Lightning checks, as the Trainer is built, that no two stateful ones share a
    ``state_key`` (``_validate_callbacks_list``, found on the call stack; None elsewhere). Two optiscope callbacks
    with one prefix share one, and Lightning's own error ("Found more than one stateful callback …") names nothing
    a user can change: optiscope's, raised first from here, names ``prefix=``. A Lightning that checks otherwise
    says its own."""
    frame = sys._getframe(2)
    for _ in range(3):  # the property's caller, or one wrapper above
        if frame is None:
            return None
        if frame.f_code.co_name == "_validate_callbacks_list":
            callbacks = frame.f_locals.get("callbacks")
            return callbacks if isinstance(callbacks, list) else None
        frame = frame.f_back
    return None


def to_loggers(trainer: Any) -> Callable[[dict[str, float], int], None]:
    """A ``log(metrics, step)`` for ``LoggerSink`` that gives the metrics to every logger in ``trainer.loggers``
    at Lightning's step, as its ``LearningRateMonitor`` does: the one ``self.log`` in ``training_step`` uses for
    the same batch (the batches that stepped the optimizer before it; a record's own step counts this one too),
    so that optiscope's curves sit on the module's own."""

    def log(metrics: dict[str, float], step: int) -> None:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.fit_loop.epoch_loop._batches_that_stepped)

    return log
