"""Data-parallel training under ``torchrun``: joining the job, the device, and what every rank agrees on.

Every rank draws the same global batch (from a generator all ranks hold in the same state) and trains
on its slice of rows, so N processes reproduce the single-process run (not with dropout: each rank draws
its own masks from its own RNG stream); gradients are averaged by ``DistributedDataParallel``; only rank 0
writes files, and a checkpoint gathers every rank's RNG states (``gathered``). A job ends with ``leave_job``
once its runs (and their DDP wrappers) are released.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import runs
from ..collectives import all_reduce, collective_device
from ..errors import UserError


@dataclass(frozen=True)
class Processes:
    rank: int
    world: int
    device: torch.device

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size``."""
        return slice(self.rank * batch_size // self.world, (self.rank + 1) * batch_size // self.world)


def start_processes(device: str = "auto", batch_size: int | None = None) -> Processes:
    """Join the torchrun job if there is one (gloo on CPU, nccl on CUDA) and pick the device."""
    world = runs.world_size()
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available; use --device cpu")
    per_node, gpus = int(os.environ.get("LOCAL_WORLD_SIZE") or 1), torch.cuda.device_count() if cuda else 0
    if cuda and per_node > gpus:  # every rank sees the same numbers, so every rank stops here, before joining
        raise UserError(
            f"--device {device}: {per_node} processes on this machine but {gpus} CUDA device(s), one needed per "
            f"process; run torchrun --nproc_per_node={gpus}, or --device cpu"
        )
    if batch_size is not None and batch_size % world:
        raise UserError(f"--batch-size={batch_size} must be divisible by the number of processes ({world})")
    if world > 1 and not dist.is_initialized():
        _import_before_joining()
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    chosen = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(chosen)
    return Processes(rank, world, chosen)


def _import_before_joining() -> None:
    """Import ``torch.distributed.nn`` while there is no process group yet.

    Its functions take ``group=group.WORLD`` as a default argument, evaluated when the module is first
    imported; DistributedDataParallel imports it (through ``torch._dynamo``) when the first wrapper is built,
    after the job has joined, and those defaults would then hold the process group for good (torch 2.13).
    ``destroy_process_group`` could not free it, gloo's worker threads would outlive it, and one of them
    releasing a finished collective's tensors (which needs the GIL) while the interpreter shuts down aborts
    the process ("terminate called without an active exception", SIGABRT) after its work is done. Imported
    here, the defaults are None."""
    import torch.distributed.nn  # noqa: F401


#: how long ``leave_job`` waits for the process group to be freed (seconds)
LEAVE_SECONDS = 10.0


def leave_job(seconds: float = LEAVE_SECONDS) -> None:
    """Leave the torchrun job this process is in, if any: free its process groups, which joins gloo's worker
    threads while the interpreter is whole. Call it on every rank after the last collective, once every DDP
    wrapper is released (a wrapper holds the group; objects in reference cycles are collected here first): an
    experiment when its runs are done, and the command line as its last act on every path (finished,
    interrupted, refused, failed), once the command's frames and any error's traceback are gone. It waits
    ``seconds`` at most: a rank stopped at once in the middle of a collective (a second Ctrl-C) would otherwise
    wait for the peer that never joins it, until gloo's timeout (30 minutes by default)."""
    if not _joined():
        return
    gc.collect()
    leaving = threading.Thread(target=dist.destroy_process_group, name="optiscope-leave-job", daemon=True)
    leaving.start()
    leaving.join(seconds)


def wrap(model: nn.Module, procs: Processes, compile: bool = False) -> nn.Module:
    """What the loop calls forward on: DDP around ``model`` in a multi-process job, compiled if asked."""
    net: nn.Module = model
    if procs.world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[procs.device] if procs.device.type == "cuda" else None
        )
    return torch.compile(net) if compile else net


def gathered(obj: object) -> list[object]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` in a single process. A
    collective: every rank calls it."""
    if not _joined():
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _joined():
        dist.barrier()


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_mean(value: float) -> float:
    """The mean of ``value`` over all ranks (``value`` itself in a single process)."""
    if not _joined():
        return value
    total = all_reduce(torch.tensor(value, dtype=torch.float64, device=collective_device()))
    return float(total) / dist.get_world_size()


def any_rank(flag: bool) -> bool:
    """True on every rank if ``flag`` is true on any (so all ranks stop at the same step)."""
    if not _joined():
        return flag
    value = all_reduce(torch.tensor(float(flag), device=collective_device()))
    return bool(value > 0)
