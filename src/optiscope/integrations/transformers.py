"""optiscope's monitor inside 🤗 ``Trainer``: ``OptiscopeCallback``.

::

    from optiscope.integrations.transformers import OptiscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[OptiscopeCallback(every=10)])
    trainer.train()   # writes args.output_dir/metrics.jsonl (and TensorBoard events with the extra)

The monitor's hooks sit on the optimizer the Trainer steps (unwrapped from Accelerate's wrapper), so u
is the real update: after gradient accumulation and gradient clipping, once per update step, whatever
the optimizer (the Trainer's own, ``optimizers=(optiscope.optim.AdamW(...), None)``, or
``optimizer_cls_and_kwargs=(optiscope.optim.AdamW, {...})``). The loss of an update step is the one the
Trainer logs: the model's loss of each micro-batch, combined as the Trainer combines them. A divergence
sets ``control.should_training_stop`` (and ``should_save`` off, so a good checkpoint is not replaced by
a diverged one), logs the diagnosis as a warning and writes it to ``metrics.jsonl``. Ranks other than 0
measure (the loss is averaged over ranks, so all stop together) but write nothing.

Needs ``pip install 'optiscope[hf]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .attach import Attachment, build_monitor, diagnosis, log

__all__ = ["OptiscopeCallback"]


class OptiscopeCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that attaches an optiscope ``Monitor`` to the Trainer's run.

    Args:
        out_dir: where ``metrics.jsonl`` and ``tensorboard/trainer`` go (default: ``args.output_dir``).
        every: measure the first update step and every ``every``-th.
        sinks: the monitor's sinks instead of the default files (e.g. ``[ConsoleSink()]``).
        curvature: a curvature schedule for ``Monitor(..., curvature=...)``; None leaves it off.

    After training, ``callback.monitor`` holds the monitor (its ``last_record``) and ``callback.diverged``
    the divergence record, if any.
    """

    label = "trainer"

    def __init__(
        self,
        out_dir: Path | str | None = None,
        every: int = 10,
        sinks: Iterable[Any] | None = None,
        curvature: Any = None,
    ) -> None:
        self.out_dir, self.every, self.sinks, self.curvature = out_dir, every, sinks, curvature
        self.attachment: Attachment | None = None
        self.diverged: dict[str, Any] | None = None
        self._loss_hook = None
        self._items_given = False

    @property
    def monitor(self):
        return None if self.attachment is None else self.attachment.monitor

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps the real one
        monitor = build_monitor(
            model,
            inner,
            out_dir=self.out_dir if self.out_dir is not None else args.output_dir,
            every=self.every,
            sinks=self.sinks,
            curvature=self.curvature,
            start_step=state.global_step,
            rank_zero=state.is_world_process_zero,
            label=self.label,
        )
        self.attachment = Attachment(monitor)
        self.diverged = None
        self._loss_hook = model.register_forward_hook(self._record_loss, with_kwargs=True)

    def _record_loss(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        """The loss of each training micro-batch, as the model computed it (evaluation passes are skipped)."""
        if not (module.training and torch.is_grad_enabled()):
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        self._items_given = kwargs.get("num_items_in_batch") is not None
        self.attachment.add_loss(loss)

    def on_optimizer_step(self, args, state, control, **kwargs):
        # Right after optimizer.step(), before the scheduler moves the learning rate on. With
        # num_items_in_batch the model normalises each micro-batch by the whole step's token count, so the
        # step's loss is their sum (times the ranks when the Trainer averages tokens across devices, as it
        # then does); otherwise the Trainer averages the micro-batch means.
        if self.attachment is None:
            return
        if self._items_given and self.attachment.losses and getattr(args, "average_tokens_across_devices", False):
            scale = args.world_size
            self.attachment.losses = [loss * scale for loss in self.attachment.losses]
        record = self.attachment.after_optimizer("sum" if self._items_given else "mean")
        if record is not None:
            self.diverged = record
            if state.is_world_process_zero:
                log.warning(diagnosis(record))
            control.should_training_stop = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.diverged is not None:  # runs after the Trainer's flow callback has decided to save
            control.should_save = False
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        if self.attachment is not None:
            self.attachment.close()
