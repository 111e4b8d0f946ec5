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
optimisation their mean. A divergence sets ``trainer.should_stop``, logs the diagnosis as a warning and
writes it to ``metrics.jsonl``. Ranks other than 0 measure but write nothing.

One optimizer per module (``configure_optimizers`` returning several is refused). Needs
``pip install 'optiscope[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from .attach import Attachment, build_monitor, diagnosis, log

__all__ = ["OptiscopeCallback"]


class OptiscopeCallback(Callback):
    """A Lightning ``Callback`` that attaches an optiscope ``Monitor`` to the module and its optimizer.

    Args:
        out_dir: where ``metrics.jsonl`` and ``tensorboard/lightning`` go (default: ``trainer.log_dir``).
        every: measure the first optimizer step and every ``every``-th.
        sinks: the monitor's sinks instead of the default files (e.g. ``[ConsoleSink()]``).
        curvature: a curvature schedule for ``Monitor(..., curvature=...)``; None leaves it off.

    ``callback.monitor`` holds the monitor and ``callback.diverged`` the divergence record, if any.
    """

    label = "lightning"

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

    @property
    def monitor(self):
        return None if self.attachment is None else self.attachment.monitor

    def on_train_start(self, trainer, pl_module) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"OptiscopeCallback: the module has {len(trainer.optimizers)} optimizers; it monitors exactly one"
            )
        out_dir = self.out_dir if self.out_dir is not None else trainer.log_dir  # log_dir is collective: all ranks
        monitor = build_monitor(
            pl_module,
            trainer.optimizers[0],
            out_dir=out_dir,
            every=self.every,
            sinks=self.sinks,
            curvature=self.curvature,
            start_step=trainer.global_step,
            rank_zero=trainer.is_global_zero,
            label=self.label,
        )
        self.attachment = Attachment(monitor)
        self.diverged = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.attachment is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        self.attachment.add_loss(loss)
        record = self.attachment.after_optimizer("sum" if pl_module.automatic_optimization else "mean")
        if record is not None:
            self.diverged = record
            if trainer.is_global_zero:
                log.warning(diagnosis(record))
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        if self.attachment is not None:
            self.attachment.close()
