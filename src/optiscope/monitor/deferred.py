"""Each step's values kept where they were computed until the monitor reads them: no wait, no collective between.

``float(loss)`` waits until the GPU has computed the loss, and so stops the CPU from queueing the next step's
kernels; under DDP the loss's mean over the ranks is moreover a collective that every rank waits in. The monitor
needs neither on the steps it does not measure. ``StepLog`` keeps each such step's loss on its device (a float64
copy: one small kernel, nothing waited for) with whether the step was skipped, and ``read`` turns everything kept
into numbers at once, on the steps the monitor chooses: one transfer from each device and, in a job of several
processes, one all-reduce for all of them. The divergence guard then judges the steps one by one, in order, as
it would have judged them as they came (``Monitor``). Another per-step signal can be kept and read beside the
loss in the same way, at no further wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import is_number
from ..collectives import all_reduce, collective_device


@dataclass(frozen=True)
class Kept:
    """A step not read yet: its ``loss`` (a float64 tensor on its device, a number, or None), the optimizer steps
    it ``skipped`` (0: one was taken; or a fused kernel's ``found_inf``, nonzero when it skipped, read with the
    loss), and whether a skip is a loss scaler's (``scaled``, judged; ``Monitor.skip``)."""

    step: int
    loss: Tensor | float | None
    skipped: Tensor | int = 0
    scaled: bool = True


@dataclass(frozen=True)
class Read:
    """A step's values as numbers: its loss (the mean over the ranks; None: none given) and the optimizer steps
    it skipped (0: one was taken)."""

    step: int
    loss: float | None
    skipped: int
    scaled: bool


def kept_loss(loss: Any) -> Tensor | float | None:
    """``loss`` as the log keeps it without reading it: a tensor as a float64 copy on its device (the mean of
    several elements, e.g. per-sample losses), a number as a float, None as None.

    A copy, because a tensor's memory may be reused before it is read (the outputs of a CUDA graph are
    overwritten by its next replay); float64, so that a float64 loss below float32's range is not read as 0.

    Raises:
        ValueError: ``loss`` is an empty tensor.
        TypeError: ``loss`` is neither a number, a tensor nor None.
    """
    if loss is None:
        return None
    if isinstance(loss, Tensor):
        if loss.numel() == 0:
            raise ValueError("Monitor.step: loss is an empty tensor; give the batch's loss (a number or a tensor)")
        loss = loss.detach()
        return loss.to(torch.float64, copy=True) if loss.numel() == 1 else loss.to(torch.float64).mean()
    if is_number(loss):
        return float(loss)
    raise TypeError(f"Monitor.step: loss={loss!r} must be a number or a tensor (the batch's loss), or None")


class StepLog:
    """The steps whose values the monitor has not read yet, oldest first."""

    def __init__(self) -> None:
        self.kept: list[Kept] = []

    def keep(self, step: int, loss: Tensor | float | None, skipped: Tensor | int = 0, scaled: bool = True) -> None:
        """Keep a step's values (``Kept``) without reading them."""
        self.kept.append(Kept(step, loss, skipped, scaled))

    def on_host(self) -> bool:
        """Whether everything kept is a number already, so that reading it in a single process waits for nothing."""
        return not any(isinstance(k.loss, Tensor) or isinstance(k.skipped, Tensor) for k in self.kept)

    def read(self) -> list[Read]:
        """Every kept step's values as numbers, in order, and forget them. In a job of several processes the loss
        is its mean over the ranks and this is a collective (one all-reduce), which every rank must reach at the
        same step: the monitor reads at steps every rank agrees on. Nothing kept: nothing read, no collective."""
        kept, self.kept = self.kept, []
        if not kept:
            return []
        values = _numbers(kept)
        if dist.is_available() and dist.is_initialized():
            # every rank judges the same losses; a skipped step is skipped on every rank (its mean is itself)
            vector = all_reduce(torch.tensor(values, dtype=torch.float64, device=collective_device()))
            values = (vector / dist.get_world_size()).tolist()
        return [
            Read(k.step, None if k.loss is None else values[2 * i], _skipped(values[2 * i + 1], k.skipped), k.scaled)
            for i, k in enumerate(kept)
        ]

    def state(self) -> list[tuple[int, float | None, int, bool]]:
        """This process's kept steps as numbers, without forgetting them and without a collective (a GPU's values
        are waited for): what ``Monitor.state_dict`` saves, so that a resumed run judges them where the whole one
        does."""
        if not self.kept:
            return []
        values = _numbers(self.kept)
        return [
            (k.step, None if k.loss is None else values[2 * i], _skipped(values[2 * i + 1], k.skipped), k.scaled)
            for i, k in enumerate(self.kept)
        ]

    def load(self, state: list[Any]) -> None:
        """Keep the steps of a saved ``state()`` (replacing what is kept)."""
        self.kept = [Kept(int(step), loss, int(skipped), bool(scaled)) for step, loss, skipped, scaled in state]


def _numbers(kept: list[Kept]) -> list[float]:
    """The kept values as numbers (loss, skipped, loss, skipped, …; a missing loss as 0): the tensors of each
    device stacked there and read in one transfer."""
    numbers = [0.0] * (2 * len(kept))
    on_devices: dict[torch.device, list[tuple[int, Tensor]]] = {}
    for i, k in enumerate(kept):
        for j, value in ((2 * i, k.loss), (2 * i + 1, k.skipped)):
            if isinstance(value, Tensor):
                on_devices.setdefault(value.device, []).append((j, value))
            elif value is not None:
                numbers[j] = float(value)
    for values in on_devices.values():
        if len(values) == 1:  # a measured step's own loss, read as the guard reads every measured step
            (j, v), *_ = values
            numbers[j] = float(v)
            continue
        read = torch.stack([v.reshape(()).to(torch.float64) for _, v in values]).tolist()
        for (j, _), x in zip(values, read, strict=True):
            numbers[j] = x
    return numbers


def _skipped(value: float, kept: Tensor | int) -> int:
    """The steps a kept step skipped: its count, or 1 where a fused kernel's flag was set."""
    if isinstance(kept, Tensor):
        return int(value != 0 and not math.isnan(value))
    return kept
