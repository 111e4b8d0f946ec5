"""Training throughput on the lm GPT without curvature and with ``Monitor(curvature=...)`` every 100 steps.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64, batch 12; char-level Shakespeare),
AdamW. Contenders train side by side from the same weights on the same batches, in alternating rounds of
``--steps`` steps so that drift in the machine's speed hits them alike: the monitor alone (every 10, no
curvature: the peer), and the monitor with curvature every 100 steps on a fixed 12 × 64 batch — as
configured by default (sharpness to residual 1e-3, warm-started, plus the curvature along the update and
the gradient) and a cheaper setting (residual 1e-2, no directions). Goal (issue 12): ≤ 10 % overhead.

    python benchmarks/curvature_overhead.py [--rounds 3] [--steps 100]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from monitor_overhead import corpus_ids
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Curvature, Monitor
from optiscope.optim import AdamW


def loss_fn(net, batch):
    return net(*batch)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="steps per round (a multiple of 100)")
    parser.add_argument("--text", default=None)
    args = parser.parse_args()
    ids = corpus_ids(args.text)
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, n_layer=4, n_head=4, n_embd=128, block_size=64))
    batch = sample_batch(ids, 64, 12, torch.Generator().manual_seed(2))
    settings = {
        "monitor only": None,
        "curvature/100": Curvature(batch, loss_fn, every=100),
        "curvature/100 cheap": Curvature(batch, loss_fn, every=100, tol=1e-2, directions=False),
    }
    contenders = {}
    for name, curvature in settings.items():
        model = copy.deepcopy(base)
        opt = AdamW(model.parameters(), lr=1e-3)
        monitor = Monitor(model, opt, every=10, guard=None, curvature=curvature)
        contenders[name] = (model, opt, monitor, torch.Generator().manual_seed(1), [])

    def train(name: str, steps: int) -> float:
        model, opt, monitor, gen, hvps = contenders[name]
        start = time.perf_counter()
        for _ in range(steps):
            _, loss = model(*sample_batch(ids, 64, 12, gen))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            record = monitor.step(loss)
            if record and "sharpness" in record:
                hvps.append(record["curvature"]["hvps"])
        return steps / (time.perf_counter() - start)

    for name in contenders:  # warm-up: state, caches
        train(name, 5)
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name in contenders:
            rates[name].append(train(name, args.steps))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPT {base.num_parameters() / 1e6:.2f}M params"
    )
    peer = statistics.median(rates["monitor only"])
    print(f"{'setting':<22}{'steps/s':>9}{'overhead':>10}  HVPs per measurement")
    for name, values in rates.items():
        rate = statistics.median(values)
        hvps = contenders[name][4]
        print(f"{name:<22}{rate:>9.2f}{(peer / rate - 1) * 100:>9.1f}%  {hvps if hvps else '-'}")
    print("Goal: <= 10% with curvature every 100 steps.")


if __name__ == "__main__":
    main()
