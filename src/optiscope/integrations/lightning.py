"""optiscope's monitor inside a Lightning ``Trainer``: ``OptiscopeCallback``.

::

    from optiscope.integrations.lightning import OptiscopeCallback

    trainer = lightning.Trainer(max_steps=1000, callbacks=[OptiscopeCallback(every=10)])
    trainer.fit(module, data)   # writes trainer.log_dir/metrics.jsonl (and TensorBoard events with the extra)

The monitor's hooks sit on the optimizer Lightning steps, so u is the real update after gradient
accumulation and clipping, once per optimizer step, in automatic optimisation (where Lightning steps the
optimizer with a closure that runs forward and backward) and in manual optimisation (where the module
calls ``opt.step()`` itself, as often as it likes). The loss of a step is taken from what
``training_step`` returned for the batches since the previous step: in automatic optimisation their sum,
since Lightning divides each by ``accumulate_grad_batches`` (the loss it backpropagates); in manual
optimisation their mean. A divergence sets ``trainer.should_stop``, logs the diagnosis as a warning,
writes it to ``metrics.jsonl`` and keeps ``ModelCheckpoint`` from saving the diverged model. Ranks other
than 0 measure but write nothing. The monitor's state (the divergence guard, the curvature warm start and
history) travels in Lightning's checkpoints as the callback's state, so ``trainer.fit(..., ckpt_path=...)``
resumes it exactly.

One optimizer per module (``configure_optimizers`` returning several is refused). Needs
``pip install 'optiscope[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.callbacks import Callback

from .attach import MonitorCallback

__all__ = ["OptiscopeCallback"]


class OptiscopeCallback(MonitorCallback, Callback):
    """A Lightning ``Callback`` that attaches an optiscope ``Monitor`` to the module and its optimizer.
    Its arguments are ``MonitorCallback``'s; ``out_dir`` defaults to ``trainer.log_dir``."""

    label = "lightning"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._saved: dict[str, Any] | None = None  # the monitor's state from the checkpoint resumed, until attached

    def state_dict(self) -> dict[str, Any]:
        return {} if self.monitor is None else {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks before on_train_start, where the monitor is built
        self._saved = state_dict.get("monitor")

    def on_train_start(self, trainer, pl_module) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"OptiscopeCallback: the module has {len(trainer.optimizers)} optimizers; it monitors exactly one"
            )
        log_dir = trainer.log_dir  # collective: every rank must ask
        saved, self._saved = self._saved, None
        where = "the checkpoint's callback state"
        if saved is None and self.monitor is not None and self.monitor.step_count == trainer.global_step:
            saved, where = self.monitor.state_dict(), ""  # fit() again on the same Trainer: go on from the last
        self.attach(
            pl_module, trainer.optimizers[0], log_dir, trainer.global_step, trainer.is_global_zero, saved, where
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.attachment is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None and pl_module.automatic_optimization:
            # Lightning divides each batch's loss by accumulate_grad_batches, also in an epoch's last, shorter
            # window: undone, so that a step's loss is the mean of its batches' however many there were
            loss = loss * trainer.accumulate_grad_batches
        self.attachment.add_loss(loss)
        if self.stepped("mean", trainer.global_step, trainer.is_global_zero):
            trainer.should_stop = True
            _no_checkpoint_of_this_step(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.detach()


#: what ModelCheckpoint's ``_last_checkpoint_saved`` holds once a run has diverged before its first checkpoint
DIVERGED_UNSAVED = "(optiscope: the run diverged; its model is not saved)"


def _no_checkpoint_of_this_step(trainer) -> None:
    """Keep Lightning's ``ModelCheckpoint`` callbacks from saving the diverged model. They save after
    ``should_stop`` too (at this batch's end, the epoch's and training's), and with ``save_top_k=1`` the
    diverged model replaced the last good checkpoint, and ``last.ckpt`` with it (Lightning 2.6.6). A
    ModelCheckpoint skips a step it has saved, and ``save_last`` at the end of training once it has saved
    anything: both are told so, through its private ``_last_global_step_saved`` and ``_last_checkpoint_saved``
    (there is no public way; a Lightning without them saves as before)."""
    for callback in trainer.checkpoint_callbacks:
        if hasattr(callback, "_last_global_step_saved"):
            callback._last_global_step_saved = trainer.global_step
        if hasattr(callback, "_last_checkpoint_saved") and not callback._last_checkpoint_saved:
            callback._last_checkpoint_saved = DIVERGED_UNSAVED
