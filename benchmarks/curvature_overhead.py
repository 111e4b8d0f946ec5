"""Training throughput on the lm GPT without curvature and with ``Monitor(curvature=...)`` every N steps.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64, batch 12; char-level Shakespeare),
AdamW. Contenders train side by side from the same weights on the same batches, in alternating rounds of
``--steps`` steps so that drift in the machine's speed hits them alike: the monitor alone (every 10, no
curvature: the peer), and the monitor with curvature every ``--every`` steps (100) on a fixed 12 × 64 batch — as
configured by default (sharpness to residual 1e-2, warm-started, plus the curvature along the update),
with the gradient direction too, and the sharpness alone. Every step is timed, so the overhead is given
two ways: from whole rounds' throughput, and from the measuring steps' extra time (robust to a machine
whose speed drifts between rounds). Goal (issue 12): ≤ 10 % overhead. ``--warm-steps N`` first trains the
shared model and optimizer N steps, so that the measurements fall later in training, where the top eigenvector
moves further between measurements and the spectrum's top is more crowded (more products per measurement).
``--device cuda --size gpu`` measures nanoGPT's GPU configuration (6 layers, 384 wide, context 256, batch 64;
curvature on 12 of its sequences).

    python benchmarks/curvature_overhead.py [--rounds 5] [--steps 100] [--every 100] [--warm-steps 0]
        [--threads 1] [--device cpu|cuda] [--size cpu|gpu]
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import torch

from common import (
    LM_SIZES,
    Parser,
    alternating_rounds,
    corpus_ids,
    device,
    lm_shape,
    loss_fn,
    machine,
    synchronize,
    text_file,
    whole_number,
)
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Curvature, Monitor
from optiscope.optim import AdamW


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=5)
    parser.add_argument("--steps", type=whole_number(1), default=100, help="steps per round (a multiple of --every)")
    parser.add_argument("--every", type=whole_number(1), default=100, help="steps between curvature measurements")
    parser.add_argument(
        "--warm-steps", type=whole_number(0), default=0, help="steps trained before the contenders part"
    )
    parser.add_argument("--text", type=text_file, default=None)
    parser.add_argument(
        "--threads", type=whole_number(1), default=1, help="torch threads (1: steadier on a shared machine)"
    )
    parser.add_argument("--device", type=device, default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--size", default="cpu", choices=tuple(LM_SIZES), help="nanoGPT's CPU or GPU configuration")
    args = parser.parse_args()
    if args.steps % args.every:  # every round then measures as often, at the same steps of it
        parser.error(f"--steps {args.steps} is not a multiple of --every {args.every}; give e.g. --steps {args.every}")
    torch.set_num_threads(args.threads)
    ids = corpus_ids(args.text)
    shape, context, batch_size = lm_shape(args.size)
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, **shape)).to(args.device)
    base_opt = AdamW(base.parameters(), lr=1e-3)

    def draw(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.to(args.device) for t in sample_batch(ids, context, rows, generator))

    warm_generator = torch.Generator().manual_seed(3)
    for _ in range(args.warm_steps):
        base_opt.zero_grad(set_to_none=True)
        loss_fn(base, draw(batch_size, warm_generator)).backward()
        base_opt.step()

    batch = draw(12, torch.Generator().manual_seed(2))
    settings = {
        "monitor only": None,
        f"curvature/{args.every}": Curvature(batch, loss_fn, every=args.every),
        "+ gradient direction": Curvature(batch, loss_fn, every=args.every, directions=("update", "gradient")),
        "sharpness only": Curvature(batch, loss_fn, every=args.every, directions=()),
    }
    contenders = {}
    for name, curvature in settings.items():
        model, opt = copy.deepcopy((base, base_opt))  # together: the copy's state is keyed by the copy's parameters
        monitor = Monitor(model, opt, every=10, sinks=[], guard=None, curvature=curvature)
        contenders[name] = Contender(model, opt, monitor, torch.Generator().manual_seed(1))

    def train(c: Contender, steps: int) -> float:
        """Trains ``steps`` steps, each timed; returns steps/s."""
        synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            begin = time.perf_counter()
            _, loss = c.model(*draw(batch_size, c.generator))
            c.opt.zero_grad(set_to_none=True)
            loss.backward()
            c.opt.step()
            record = c.monitor.step(loss)
            synchronize()
            seconds = time.perf_counter() - begin
            if record and "sharpness" in record:
                c.measured.append((seconds, record["curvature"]["hvps"]))
            else:
                c.plain.append(seconds)
        return steps / (time.perf_counter() - start)

    def warmed_up() -> None:  # the per-step medians count the rounds' steps only
        for c in contenders.values():
            c.plain.clear()

    rates = alternating_rounds(
        {name: partial(train, c) for name, c in contenders.items()}, args.rounds, args.steps, warmed_up
    )
    print(
        f"torch {torch.__version__}, {machine(args.device)}, GPT {base.num_parameters() / 1e6:.2f}M params, "
        f"batch {batch_size} x {context}, curvature batch 12 x {context}, measured after {args.warm_steps} steps"
    )
    peer_rate = statistics.median(rates["monitor only"])
    peer_step = statistics.median(contenders["monitor only"].plain)
    print(
        "overhead two ways: from the throughput of whole rounds (medians), and per measurement: a measuring "
        f"step's time above the same contender's median plain step, over {args.every} of the peer's median steps "
        "(the median over the warm measurements, the first being cold)"
    )
    print(f"{'setting':<22}{'steps/s':>9}{'throughput':>11}{'per measurement':>16}  HVPs per measurement")
    for name, c in contenders.items():
        rate = statistics.median(rates[name])
        direct = "-"
        if c.measured:
            plain = statistics.median(c.plain)
            extra = [seconds - plain for seconds, _ in c.measured[1:]] or [c.measured[0][0] - plain]
            direct = f"{statistics.median(extra) / (args.every * peer_step) * 100:.1f}%"
        hvps = [h for _, h in c.measured] or "-"
        print(f"{name:<22}{rate:>9.2f}{(peer_rate / rate - 1) * 100:>10.1f}%{direct:>16}  {hvps}")
    print("Goal: <= 10% with curvature every 100 steps.")


@dataclass
class Contender:
    model: GPT
    opt: AdamW
    monitor: Monitor
    generator: torch.Generator
    plain: list[float] = field(default_factory=list)  # seconds of each step without a curvature measurement
    measured: list[tuple[float, int]] = field(default_factory=list)  # (seconds, HVPs) of each measuring step


if __name__ == "__main__":
    main()
