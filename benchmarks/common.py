"""Helpers the benchmark scripts share: timing and peak-memory measurement."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from pathlib import Path


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _status_kib(field: str) -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return None


def extra_peak_mib(fn: Callable[[], object]) -> float | None:
    """MiB of memory ``fn`` needs beyond what was resident before it: the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs) minus its resident set just before. Freed heap memory is
    first handed back to the system (glibc's malloc_trim), or reuse of it would hide the need. None off Linux."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    before = _status_kib("VmRSS:")
    fn()
    peak = _status_kib("VmHWM:")
    return None if before is None or peak is None else max(peak - before, 0) / 1024
