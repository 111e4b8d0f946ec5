"""The ranks of a DDP job as the small batches of the gradient noise scale, at no extra backward pass."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..collectives import all_reduce
from .curvature import SmallBatchNorms
from .names import own_names, under_compile


class RankNoise:
    """The ranks of a DDP job as the small batches of the gradient noise scale, at no extra backward pass.

    DDP averages the ranks' gradients in place during backward, so the monitor never sees a rank's own
    gradient G_r. This registers a communication hook (``ddp.register_comm_hook``) that, on the steps
    ``due()`` says the curvature measures, keeps each parameter's local |G_r,p|² (float64) from the bucket
    before averaging it. The averaging is DDP's default, bit for bit: the bucket is multiplied by
    1/world size (what DDP's reducer does without a hook; torch's ``allreduce_hook`` divides instead, which
    rounds differently when the world size is not a power of two) and summed by an asynchronous all-reduce,
    whose completion keeps |G_big,p|² of the averaged bucket (the mean of the G_r, before any clipping the
    training loop applies afterwards). ``gather`` all-reduces the local squared norms (one float per
    parameter tensor) into their mean over ranks.

    A rank's G_r is the gradient of everything backward accumulated into the bucket: with gradient
    accumulation under ``ddp.no_sync()``, of all its micro-batches, hence ``batch_size`` = the training
    examples per rank per optimizer step.
    """

    source = "ranks"

    def __init__(self, model: nn.Module, batch_size: int, due: Callable[[], bool]) -> None:
        ddp = under_compile(model)
        usage = (
            f"Curvature(rank_batch_size={batch_size}) takes the ranks of a DistributedDataParallel job as the "
            "small batches of the noise scale"
        )
        instead = "or measure the noise scale on slices of the curvature batch with micro_batches >= 2 instead"
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            raise ValueError(
                f"Monitor: {usage}, but the model is a {type(ddp).__name__}; wrap it in "
                f"torch.nn.parallel.DistributedDataParallel with world size >= 2, {instead}"
            )
        self.group = ddp.process_group
        self.world = self.group.size()
        if self.world < 2:
            raise ValueError(
                f"Monitor: {usage}, but the DDP job has world size {self.world}; run >= 2 ranks, {instead}"
            )
        ignored = getattr(ddp, "parameters_to_ignore", set())  # not synchronised by DDP
        named = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored]
        own = own_names(ddp)
        self.names = [own[id(p)] for _, p in named]
        self.params = [p for _, p in named]
        self.batch_size, self.due, self.active = batch_size, due, True
        self.local: dict[int, Tensor] = {}  # |G_r,p|² of this rank
        self.averaged: dict[int, Tensor] = {}  # |G_big,p|²
        try:
            ddp.register_comm_hook(self.group, self.hook)
        except RuntimeError as error:  # DDP takes one hook (or built-in hook) per model, registered once
            raise ValueError(
                f"Monitor: {usage} through a DDP communication hook, but this model already has one and DDP "
                f"takes only one (DDP: {str(error).rstrip('.')}); leave rank_batch_size=None, {instead}"
            ) from error

    def hook(self, group, bucket):  # unannotated: DDP compares annotations with dist.GradBucket itself
        """DDP's default averaging of ``bucket``; on measured steps, the squared norms before and after."""
        buffer = bucket.buffer()
        measured = self.active and self.due()
        if measured:
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                self.local[id(p)] = g.detach().double().square().sum()
        buffer.mul_(1.0 / self.world)
        reduced = dist.all_reduce(buffer, group=group, async_op=True).get_future()

        def averaged(fut):
            result = fut.value()[0]
            if measured:  # the bucket's gradients are views of the reduced buffer
                for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                    self.averaged[id(p)] = g.detach().double().square().sum()
            return result

        return reduced.then(averaged)

    def gather(self) -> SmallBatchNorms:
        """The mean over ranks of the local squared norms (an all-reduce of one float per parameter tensor)
        and the averaged gradient's; NaN for a parameter whose gradient the hook did not see."""
        device = self.params[0].device if dist.get_backend(self.group) != "gloo" else torch.device("cpu")
        nan = torch.tensor(math.nan, dtype=torch.float64, device=device)
        local = all_reduce(torch.stack([self.local.get(id(p), nan).to(device) for p in self.params]), group=self.group)
        averaged = [float(self.averaged.get(id(p), nan)) for p in self.params]
        self.local, self.averaged = {}, {}
        return SmallBatchNorms(
            self.names, (local / self.world).tolist(), averaged, self.world, self.batch_size, self.source
        )

    def close(self) -> None:
        self.active = False  # DDP cannot unregister a communication hook: it goes on averaging only
