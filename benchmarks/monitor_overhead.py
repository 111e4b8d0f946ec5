"""Training-step throughput with the monitor off, at every=10 and at every=1, measured alternately.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64, batch 12, char-level
tinyshakespeare from ``../shared/data/tinyshakespeare.txt`` when present, else ``--text`` or the
embedded Shakespeare corpus), AdamW. Three identical models train side by side; rounds of ``--steps``
steps rotate between them so drift hits all three alike. Prints steps/s and the overhead of each
monitor setting relative to no monitor. Goal: ≤ 5 % at every=10 and ≤ 15 % at every=1 (the published
peer Cockpit reports about 1.5× the step time for its cheapest configuration when tracking every step).

    python benchmarks/monitor_overhead.py [--rounds 7] [--steps 40] [--text PATH]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from optiscope.data.batches import sample_batch
from optiscope.data.corpus import load_corpus
from optiscope.data.tokenizers import CharTokenizer
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Monitor
from optiscope.optim import AdamW

SHARED_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def corpus_ids(text_path: str | None) -> torch.Tensor:
    path = text_path or (str(SHARED_TEXT) if SHARED_TEXT.exists() else None)
    text = load_corpus(text_path=path)
    return torch.tensor(CharTokenizer.from_text(text).encode(text), dtype=torch.long)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40, help="steps per round")
    parser.add_argument("--text", default=None)
    args = parser.parse_args()
    ids = corpus_ids(args.text)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=int(ids.max()) + 1, n_layer=4, n_head=4, n_embd=128, block_size=64)
    base = GPT(config)
    contenders = {}
    for setting in ("off", "every=10", "every=1"):
        model = copy.deepcopy(base)
        opt = AdamW(model.parameters(), lr=1e-3)
        monitor = None if setting == "off" else Monitor(model, opt, every=int(setting.split("=")[1]), guard=None)
        contenders[setting] = (model, opt, monitor, torch.Generator().manual_seed(1))

    def train(setting: str, steps: int) -> float:
        model, opt, monitor, gen = contenders[setting]
        start = time.perf_counter()
        for _ in range(steps):
            x, y = sample_batch(ids, 64, 12, gen)
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if monitor:
                monitor.step(loss)
        return steps / (time.perf_counter() - start)

    for setting in contenders:  # warm-up: first steps allocate state and caches
        train(setting, 5)
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for setting in contenders:
            rates[setting].append(train(setting, args.steps))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPT {base.num_parameters() / 1e6:.2f}M params"
    )
    off = statistics.median(rates["off"])
    print(f"{'monitor':<10}{'steps/s':>9}{'overhead':>10}")
    for setting, values in rates.items():
        rate = statistics.median(values)
        print(f"{setting:<10}{rate:>9.2f}{(off / rate - 1) * 100:>9.1f}%")
    print("Goal: <= 5% at every=10, <= 15% at every=1.")


if __name__ == "__main__":
    main()
