"""The monitor's overhead under FSDP2 (fully_shard) against its overhead under DDP: 2 CPU processes, gloo.

nanoGPT's CPU configuration of the ``lm`` GPT (4 layers, 4 heads, 128 dims, context 64; each rank trains on
half of a batch of 12), char-level tinyshakespeare from ``../shared/data/tinyshakespeare.txt`` when present
(else ``--text`` or the packaged corpus), torch's AdamW, one thread a process. Six copies of the model train
side by side in one process group, DDP and FSDP2 (each block sharded, then the root), each with the monitor
off, at every=10 and at every=1, taking turns in many short rounds of ``--steps`` steps, in reverse order
every other round (FSDP2's step is a dozen collectives, each waiting for both processes: on a busy machine a
long round measures the machine, short ones alternate fast enough for the medians to hold). Prints rank 0's
steps/s and, for each wrapper, the monitor's overhead relative to the same wrapper without it. Goal: the
overhead under FSDP2 within 2 percentage points of that under DDP at every=10 (under FSDP a measured step
adds a few small collectives; DDP needs none).

    python benchmarks/monitor_fsdp_overhead.py [--rounds 60] [--steps 3] [--text PATH]
"""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (before the process group: see train.distributed._import_before_joining)
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import fully_shard

from common import Parser, alternating_rounds, corpus_ids, lm_shape, text_file, training_rate, whole_number
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Monitor
from optiscope.train.distributed import leave_job

WORLD = 2
SETTINGS = ("off", "every=10", "every=1")


def wrapped(base: nn.Module, wrapper: str) -> nn.Module:
    model = copy.deepcopy(base)
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def worker(rank: int, args: object, rendezvous: str) -> None:
    torch.set_num_threads(1)  # two processes on the machine's cores
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    ids = corpus_ids(args.text)
    shape, context, batch_size = lm_shape("cpu")
    torch.manual_seed(0)  # the same initial weights on every rank
    base = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, **shape))
    contenders = {}
    for wrapper in ("ddp", "fsdp2"):
        for setting in SETTINGS:
            model = wrapped(base, wrapper)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            every = None if setting == "off" else int(setting.split("=")[1])
            monitor = None if every is None else Monitor(model, opt, every=every, sinks=[], guard=None)
            batch = partial(sample_batch, ids, context, batch_size // WORLD, torch.Generator().manual_seed(1 + rank))
            contenders[f"{wrapper} {setting}"] = partial(training_rate, model, opt, monitor, batch)

    rates = alternating_rounds(contenders, args.rounds, args.steps)
    if rank == 0:
        print(
            f"torch {torch.__version__}, {WORLD} processes x 1 CPU thread, gloo, GPT {base.num_parameters() / 1e6:.2f}M"
        )
        print(f"{'wrapper':<8}{'monitor':<10}{'steps/s':>9}{'overhead':>10}")
        overhead = {}
        for name, values in rates.items():
            wrapper, setting = name.split()
            off = statistics.median(rates[f"{wrapper} off"])
            rate = statistics.median(values)
            overhead[name] = (off / rate - 1) * 100
            print(f"{wrapper:<8}{setting:<10}{rate:>9.2f}{overhead[name]:>9.1f}%")
        for setting in SETTINGS[1:]:
            gap = overhead[f"fsdp2 {setting}"] - overhead[f"ddp {setting}"]
            print(f"{setting}: FSDP2's overhead minus DDP's = {gap:+.1f} percentage points")
        print("Goal: within 2 percentage points at every=10.")
    contenders.clear()
    leave_job()


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=60)
    parser.add_argument("--steps", type=whole_number(1), default=3, help="steps per round")
    parser.add_argument("--text", type=text_file, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, f"{tmp}/rendezvous"), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
