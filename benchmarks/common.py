"""Helpers the benchmark scripts share: timing and peak-memory measurement."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from pathlib import Path

import torch

#: The lm GPT's shapes: nanoGPT's char-level Shakespeare configurations, its CPU one (the lm experiment's
#: default) and its GPU one (train_shakespeare_char.py: 6 layers, 6 heads, 384 wide, context 256, batch 64).
LM_SIZES = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64),
}


def lm_shape(size: str) -> tuple[dict[str, int], int, int]:
    """(the GPT's layer shapes, its context, the training batch) of the ``LM_SIZES`` configuration ``size``."""
    shape = dict(LM_SIZES[size])
    context, batch_size = shape.pop("block_size"), shape.pop("batch_size")
    return shape, context, batch_size


def machine(device: str) -> str:
    """What a benchmark ran on, for its first line: the GPU's name, or torch's CPU threads."""
    return torch.cuda.get_device_name() if device == "cuda" else f"{torch.get_num_threads()} CPU threads"


def synchronize() -> None:
    """Waits for the GPU's queued work, so that a clock read after it counts that work (no-op without CUDA)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes, its GPU work included."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def _status_kib(field: str) -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return None


def extra_peak_mib(fn: Callable[[], object], device: str = "cpu") -> float | None:
    """MiB of memory ``fn`` needs beyond what was resident before it: the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs) minus its resident set just before. Freed heap memory is
    first handed back to the system (glibc's malloc_trim), or reuse of it would hide the need. None off Linux.
    On ``device="cuda"``: the peak of CUDA memory allocated during ``fn`` minus that allocated before."""
    if device == "cuda":
        synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        synchronize()
        return max(torch.cuda.max_memory_allocated() - before, 0) / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    before = _status_kib("VmRSS:")
    fn()
    peak = _status_kib("VmHWM:")
    return None if before is None or peak is None else max(peak - before, 0) / 1024
