"""Collectives whose tensors are freed on the thread that made them, so that a job never aborts at exit.

gloo runs each collective on a worker thread of its own, which lets go of the collective's tensors a moment *after*
the caller's ``wait`` returns (on a loaded 2-core machine the worker still held the tensor when ``dist.all_reduce``
returned in about a fifth of 5,000 calls, and when ``dist.all_gather`` did in over a quarter). When the caller drops
its own reference first, the worker frees the tensor, which takes the GIL; if the interpreter is shutting down by
then, Python ends the worker thread and the C++ runtime aborts the process: "terminate called without an active
exception". A monitor's last reduction comes a few lines before a script's end, so a script that ends right after it
lost that race now and then (3 aborts in 22 FSDP1 jobs on a loaded machine; core dumps: a ``ProcessGroupGloo``
worker freeing an ``AsyncAllreduceWork``'s tensors inside ``Py_FinalizeEx``).

``all_reduce`` and ``all_gather`` here wait, after a gloo collective, until the worker has let go of the
tensors, so their last reference is always the caller's. Other backends run as ``torch.distributed`` runs them
(NCCL's works may keep their tensors until its watchdog thread sweeps them; not seen to abort, and no GPU here
to look).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

#: how long to wait for gloo's worker to let go of a tensor before going on without it (it takes microseconds)
PATIENCE = 10.0


def collective_device(group: Any = None) -> torch.device:
    """Where a collective's tensors must be: the GPU for nccl, the CPU for gloo (``group`` None: the default
    group's backend)."""
    return (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    )


def all_reduce(t: Tensor, op: Any = None, group: Any = None) -> Tensor:
    """``dist.all_reduce(t)`` in place (``op`` None: a sum); returns ``t`` once no other thread holds it."""
    held = _counts([t], group)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    _let_go([t], held)
    return t


def all_gather(t: Tensor, group: Any = None) -> list[Tensor]:
    """Every rank's ``t``, in rank order (``dist.all_gather``), once no other thread holds them."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    held = _counts([t, *out], group)
    dist.all_gather(out, t, group=group)
    _let_go([t, *out], held)
    return out


def _counts(tensors: list[Tensor], group: Any) -> list[int] | None:
    """How often each tensor is held before a gloo collective (None for another backend: nothing to wait for)."""
    return [t._use_count() for t in tensors] if dist.get_backend(group) == "gloo" else None


def _let_go(tensors: list[Tensor], counts: list[int] | None) -> None:
    """Wait until each tensor is held no more often than before the collective (or ``PATIENCE`` has passed)."""
    if counts is None:
        return
    deadline = time.monotonic() + PATIENCE
    for t, count in zip(tensors, counts, strict=True):
        while t._use_count() > count and time.monotonic() < deadline:
            time.sleep(0)  # hand the core to the worker thread
