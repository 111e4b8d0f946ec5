"""Where a measured step's time goes, in the training loop: the thread's CPU time inside each part of the monitor.

The loop of ``monitor_overhead.py`` (``small`` by default) trains with ``Monitor(every=1)``, in rounds of ``--steps``
steps that alternate with rounds of the same model trained without the monitor. Each part below is timed with the
thread's CPU clock each time it runs; the table gives its time per measured step, median and quartiles over the
rounds, beside the time of a step without the monitor. The parts nest (an indented one runs inside the one above
it). What the monitor costs beyond their sum, its hooks and the cache the training step loses to it, only
``monitor_overhead.py`` sees. A part takes two to four times here what the same calls take in a tight loop: the
training step between two measured steps leaves the monitor's data and code out of cache.

    python benchmarks/monitor_parts.py [--configs small] [--rounds 60] [--steps 10] [--text PATH]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from common import Parser, corpus_ids, machine, text_file, whole_number
from monitor_overhead import CONFIGS, seconds_per_step
from optiscope.data.batches import sample_batch
from optiscope.monitor import JSONLSink, Monitor, stats
from optiscope.monitor import monitor as monitor_module

#: (owner, attribute, depth): the parts timed, in the order a measured step runs them
PARTS = [
    (Monitor, "_read_gradients", 0),
    (monitor_module, "_copies", 1),
    (stats, "foreach_norms", 1),
    (stats, "zero_counts", 1),
    (Monitor, "_parameter_stats", 0),
    (stats, "update_norms", 1),
    (stats, "effective_lr_summaries", 1),
    (Monitor, "step", 0),
    (Monitor, "_write", 1),
]


def timed(owner: object, name: str, spent: dict[str, float]) -> None:
    """Replace ``owner.name`` by a wrapper adding the thread's CPU time inside it to ``spent[name]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - start

    setattr(owner, name, wrapper)


def measure(name: str, ids: torch.Tensor, rounds: int, steps: int, folder: Path) -> None:
    torch.manual_seed(0)
    model, make_optimizer, context, batch_size, clip = CONFIGS[name](int(ids.max()) + 1)
    optimizer = make_optimizer(model)
    monitor = Monitor(model, optimizer, every=1, sinks=[JSONLSink(folder / f"{name}.jsonl")])
    batch = partial(sample_batch, ids, context, batch_size, torch.Generator().manual_seed(1))
    spent = {attribute: 0.0 for _, attribute, _ in PARTS}
    for owner, attribute, _ in PARTS:
        timed(owner, attribute, spent)
    seconds_per_step(model, optimizer, monitor, batch, clip, steps)  # warm-up: the first measured step copies
    per_part: dict[str, list[float]] = {attribute: [] for attribute in spent}
    bare = []
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            if not on:
                bare.append(seconds_per_step(model, optimizer, None, batch, clip, steps))
                continue
            spent.update(dict.fromkeys(spent, 0.0))
            seconds_per_step(model, optimizer, monitor, batch, clip, steps)
            for attribute, seconds in spent.items():
                per_part[attribute].append(seconds / steps)
    monitor.close()
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: GPT of {params:,} parameters, {rounds} rounds of {steps} steps; ms per step, median (quartiles)")
    print(f"{'the step without the monitor':<32}{_quartiles(bare)}")
    for _, attribute, depth in PARTS:
        print(f"{'  ' * (depth + 1) + attribute:<32}{_quartiles(per_part[attribute])}")


def _quartiles(seconds: list[float]) -> str:
    low, mid, high = statistics.quantiles([s * 1e3 for s in seconds], n=4)
    return f"{mid:8.3f} ({low:.3f} … {high:.3f})"


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--configs", default="small", help="comma-separated: small, lm")
    parser.add_argument("--rounds", type=whole_number(4), default=60)
    parser.add_argument("--steps", type=whole_number(1), default=10)
    parser.add_argument("--text", type=text_file, default=None)
    args = parser.parse_args()
    names = [n for n in args.configs.split(",") if n]
    unknown = sorted(set(names) - {"small", "lm"})
    if unknown or not names:
        parser.error(f"--configs {args.configs!r}: give names from ['lm', 'small']")
    torch.set_num_threads(1)
    ids = corpus_ids(args.text)
    print(f"torch {torch.__version__}, {machine('cpu')}, CPU time of the thread")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            measure(name, ids, args.rounds, args.steps, Path(folder))


if __name__ == "__main__":
    main()
