"""Helpers the benchmark scripts share: their command lines, corpus and model, timing and peak-memory
measurement."""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch

from optiscope.data.corpus import CorpusError, load_corpus, read_text_file
from optiscope.data.tokenizers import CharTokenizer
from optiscope.monitor import Monitor

#: char-level tinyshakespeare beside the repository: the benchmarks' corpus where present
SHARED_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"

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


class Parser(argparse.ArgumentParser):
    """argparse described by the first paragraph of a script's docstring, whose errors are one line on stderr
    naming the bad value and what would be valid (exit 2, as optiscope's own command line), not a usage block."""

    def __init__(self, doc: str) -> None:
        super().__init__(description=" ".join(doc.split("\n\n")[0].split()))

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= {minimum}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0."""
    return _number(text, lambda x: x > 0, "> 0")


def non_negative_number(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    return _number(text, lambda x: x >= 0, ">= 0")


def _number(text: str, valid: Callable[[float], bool], rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and valid(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number {rule}")
    return value


def device(text: str) -> str:
    """An argparse type for a ``--device`` whose choices are cpu and cuda: cuda only where torch sees a GPU."""
    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("'cuda': torch sees no CUDA device here; give cpu")
    return text


def text_file(text: str) -> str:
    """An argparse type: the path of a file optiscope reads as a corpus (UTF-8 text), read once here so that a
    missing or unreadable one is said before any work."""
    try:
        read_text_file(text)
    except CorpusError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def corpus_path(text: str | None) -> str | None:
    """The corpus a benchmark trains on: ``--text``, else ``SHARED_TEXT`` where present, else None (optiscope's
    packaged Shakespeare)."""
    return text or (str(SHARED_TEXT) if SHARED_TEXT.exists() else None)


def corpus_ids(text: str | None) -> torch.Tensor:
    """The char-level token ids of the corpus ``corpus_path(text)`` names."""
    corpus = load_corpus(text_path=corpus_path(text))
    return torch.tensor(CharTokenizer.from_text(corpus).encode(corpus), dtype=torch.long)


def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The GPT's loss on an (inputs, targets) batch, in the ``loss_fn(model, batch)`` form curvature and the probe
    take."""
    return model(*batch)[1]


def machine(device: str) -> str:
    """What a benchmark ran on, for its first line: the GPU's name, or torch's CPU threads."""
    return torch.cuda.get_device_name() if device == "cuda" else f"{torch.get_num_threads()} CPU threads"


def alternating_rounds(
    contenders: dict[str, Callable[[int], float]],
    rounds: int,
    steps: int,
    warmed_up: Callable[[], object] = lambda: None,
) -> dict[str, list[float]]:
    """Each contender's steps/s (what ``contenders[name](steps)`` returns) in each of ``rounds`` rounds of
    ``steps`` steps, after 5 warm-up steps each (the first steps allocate state and caches; ``warmed_up`` is
    called then). The contenders take turns within a round, in reverse order every other round, so that drift
    in the machine's speed hits them all alike."""
    for train in contenders.values():
        train(5)
    warmed_up()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        for name in list(contenders) if r % 2 == 0 else reversed(list(contenders)):
            rates[name].append(contenders[name](steps))
    return rates


def training_rate(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    monitor: Monitor | None,
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
) -> float:
    """Steps/s of ``steps`` training steps of the GPT ``model`` on the (inputs, targets) batches ``batch()`` draws,
    each followed by ``monitor.step(loss)`` where there is a monitor: a contender of ``alternating_rounds``."""
    start = time.perf_counter()
    for _ in range(steps):
        _, loss = model(*batch())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if monitor:
            monitor.step(loss)
    return steps / (time.perf_counter() - start)


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
