"""Training-step throughput with the monitor off, at every=10 and at every=1, measured alternately.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64, batch 12, char-level
tinyshakespeare from ``../shared/data/tinyshakespeare.txt`` when present, else ``--text`` or the
embedded Shakespeare corpus), AdamW. Three identical models train side by side, taking turns in rounds of
``--steps`` steps, in reverse order every other round, so that drift hits all three alike. Prints steps/s
and the overhead of each monitor setting relative to no monitor. Goal: ≤ 5 % at every=10 and ≤ 15 % at
every=1 (the published peer Cockpit reports about 1.5× the step time for its cheapest configuration when
tracking every step).

    python benchmarks/monitor_overhead.py [--rounds 7] [--steps 40] [--text PATH]
"""

from __future__ import annotations

import copy
import statistics
from functools import partial

import torch

from common import Parser, alternating_rounds, corpus_ids, lm_shape, machine, text_file, training_rate, whole_number
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Monitor
from optiscope.optim import AdamW


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=7)
    parser.add_argument("--steps", type=whole_number(1), default=40, help="steps per round")
    parser.add_argument("--text", type=text_file, default=None)
    args = parser.parse_args()
    ids = corpus_ids(args.text)
    shape, context, batch_size = lm_shape("cpu")
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, **shape))
    contenders = {}
    for setting in ("off", "every=10", "every=1"):
        model = copy.deepcopy(base)
        opt = AdamW(model.parameters(), lr=1e-3)
        every = None if setting == "off" else int(setting.split("=")[1])
        monitor = None if every is None else Monitor(model, opt, every=every, sinks=[], guard=None)
        batch = partial(sample_batch, ids, context, batch_size, torch.Generator().manual_seed(1))
        contenders[setting] = partial(training_rate, model, opt, monitor, batch)

    rates = alternating_rounds(contenders, args.rounds, args.steps)
    print(f"torch {torch.__version__}, {machine('cpu')}, GPT {base.num_parameters() / 1e6:.2f}M params")
    off = statistics.median(rates["off"])
    print(f"{'monitor':<10}{'steps/s':>9}{'overhead':>10}")
    for setting, values in rates.items():
        rate = statistics.median(values)
        print(f"{setting:<10}{rate:>9.2f}{(off / rate - 1) * 100:>9.1f}%")
    print("Goal: <= 5% at every=10, <= 15% at every=1.")


if __name__ == "__main__":
    main()
