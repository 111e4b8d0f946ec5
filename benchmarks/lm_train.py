"""nanoGPT's CPU Shakespeare run, with optiscope's training loop and each optimizer.

The configuration of nanoGPT's README for a CPU (``config/train_shakespeare_char.py`` with
``--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
--lr_decay_iters=2000 --dropout=0.0``: AdamW lr 1e-3, β2 0.99, 100 warmup steps, cosine to 1e-4,
weight decay 0.1, clip 1.0), which the README reports reaching a validation loss of about 1.88, on
char-level tinyshakespeare (``../shared/data/tinyshakespeare.txt`` beside the repository, or --text).
optiscope's ``adamw`` recipe keeps torch's β2 = 0.999 (one name, one recipe in every experiment); the
peer below uses the same β2, so the two loops compute the same update.

1. Throughput: optiscope's training step (``optiscope.train.loop.optimizer_step``: our AdamW, schedule and
   clipping, the monitor at every=10, the finiteness checks) against a bare loop with
   ``torch.optim.AdamW(fused=True)`` and no instruments — nanoGPT's loop in all that costs time —
   alternating rounds of 50 steps.
2. Quality: full runs through the ``lm`` experiment for each configuration below, evaluated every 100
   steps on 240 validation windows (nanoGPT: 20 batches of 12); prints the final validation loss and the
   first evaluated step at which it is ≤ 1.89. The first row, ``torch-adamw``, is the peer: the bare loop
   above trained from the same weights on the same batches and scored on the same windows (its evaluation
   time counts in its steps/s).

    python benchmarks/lm_train.py [--rounds 6] [--configs adamw,muon+adamw] [--steps 2000] [--seed 1337] [--text PATH]
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from common import Parser, alternating_rounds, corpus_path, machine, text_file, whole_number
from optiscope import train
from optiscope.data import sample_batch
from optiscope.errors import ConfigError
from optiscope.experiments import lm
from optiscope.models import GPT
from optiscope.monitor import Monitor
from optiscope.optim import as_lambda_lr, build_optimizer
from optiscope.optim.recipes import RunSpec
from optiscope.train.distributed import start_processes
from optiscope.train.loop import new_history, optimizer_step

TARGET = 1.89
#: the lm experiment's adamw run, which the peer is measured against
ADAMW = RunSpec("adamw", "adamw", lm.DEFAULTS["adamw"][0])


def torch_adamw(model: GPT, config: lm.Config) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """nanoGPT's optimizer with our recipe's β2: torch's fused AdamW (decay 0.1 on matrices), on the schedule of
    the lm experiment's adamw run (warmup + cosine; the warmup follows ``config.steps``)."""
    decay = [
        {"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(decay, lr=ADAMW.lr, betas=(0.9, 0.999), fused=True)
    return optimizer, as_lambda_lr(optimizer, lm.build_schedule(ADAMW, config))


def bare_step(model: GPT, optimizer, scheduler, x: torch.Tensor, y: torch.Tensor, clip: float) -> None:
    """nanoGPT's training step, with nothing measured."""
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()


def throughput(config: lm.Config, rounds: int) -> tuple[float, float]:
    """(optiscope steps/s, bare-loop steps/s), medians over alternating rounds of 50 steps."""
    data = lm.load_data(config)
    torch.manual_seed(0)
    base = GPT(lm.model_config(config, data.tokenizer.vocab_size))
    ours = copy.deepcopy(base)
    ours_opt = build_optimizer("adamw", ours, ADAMW.lr, config.weight_decay, decay_vectors=False)
    monitor = Monitor(ours, ours_opt, every=config.log_every, sinks=[], guard=None)
    run = train.Run(
        "adamw",
        ours,
        ours_opt,
        torch.Generator().manual_seed(1),
        as_lambda_lr(ours_opt, lm.build_schedule(ADAMW, config)),
        monitor,
        new_history(update_ratio={"step": [], "layers": {}}),
    )
    task = lm.LanguageModelling(data, config, start_processes("cpu", config.batch_size))
    bare = copy.deepcopy(base)
    bare_opt, bare_sched = torch_adamw(bare, config)
    g2 = torch.Generator().manual_seed(1)

    def run_ours(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            optimizer_step(run, task, task.batch(run.step, run.data), config.clip)
        return n / (time.perf_counter() - start)

    def run_bare(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            x, y = sample_batch(data.train, config.block_size, config.batch_size, g2)
            bare_step(bare, bare_opt, bare_sched, x, y, config.clip)
        return n / (time.perf_counter() - start)

    rates = alternating_rounds({"ours": run_ours, "bare": run_bare}, rounds, 50)
    return statistics.median(rates["ours"]), statistics.median(rates["bare"])


def quality(config: lm.Config, label: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = lm.run(replace(config, optimizers=label), Path(tmp))["runs"][label]
    ev = result["eval"]
    hit = next((s for s, v in zip(ev["step"], ev["val_loss"], strict=True) if v <= TARGET), None)
    return {
        "final": ev["val_loss"][-1],
        "steps_to_target": hit,
        "steps_per_s": result["final"]["steps_per_s"],
        "status": result["status"],
    }


def peer_quality(config: lm.Config) -> dict:
    """The bare torch loop trained like the ``lm`` experiment's adamw run (same initial weights, same
    batches, same evaluation windows): the side-by-side peer for the quality numbers."""
    data = lm.load_data(config)
    torch.manual_seed(config.seed)
    model = GPT(lm.model_config(config, data.tokenizer.vocab_size))
    optimizer, scheduler = torch_adamw(model, config)
    batches = torch.Generator().manual_seed(config.seed)
    hit = None
    start = time.perf_counter()
    for step in range(1, config.steps + 1):
        x, y = sample_batch(data.train, config.block_size, config.batch_size, batches)
        bare_step(model, optimizer, scheduler, x, y, config.clip)
        if step % config.eval_every == 0 and hit is None:
            hit = step if lm.evaluate(model, data.val, config, torch.device("cpu")) <= TARGET else None
    seconds = time.perf_counter() - start
    final = lm.evaluate(model, data.val, config, torch.device("cpu"))
    return {"final": final, "steps_to_target": hit, "steps_per_s": config.steps / seconds, "status": "ok"}


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=6)
    parser.add_argument("--configs", default="adamw,adam,muon+adamw,lion,sgd,momentum")
    parser.add_argument("--steps", type=whole_number(1), default=2000)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--text", type=text_file, default=None)
    args = parser.parse_args()
    text = corpus_path(args.text)
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    try:  # up front, as `optiscope run lm` would: the configurations run only after the throughput part
        config = lm.Config(
            optimizers=",".join(labels),
            text=text,
            steps=args.steps,
            eval_every=100,
            eval_batches=20,
            checkpoint_every=args.steps,
            quiet=True,
            prompts=("ROMEO:",),
            sample_tokens=20,
            seed=args.seed,
        )
    except ConfigError as e:
        parser.error(str(e).replace("--optimizers", "--configs"))  # the experiment's name for this script's option
    print(f"torch {torch.__version__}, {machine('cpu')}; corpus: {text or 'packaged Shakespeare'}")
    ours, bare = throughput(config, args.rounds)
    print(
        f"throughput: optiscope loop {ours:.2f} steps/s, bare torch loop {bare:.2f} steps/s, "
        f"ratio ours/bare {ours / bare:.3f} (higher is better)"
    )
    print(f"\n{'config':<14}{'final val':>10}{'steps to <= 1.89':>18}{'steps/s':>9}  status")
    for label in ["torch-adamw", *labels]:
        r = peer_quality(config) if label == "torch-adamw" else quality(config, label)
        hit = str(r["steps_to_target"]) if r["steps_to_target"] else "not reached"
        print(f"{label:<14}{r['final']:>10.3f}{hit:>18}{r['steps_per_s']:>9.2f}  {r['status']}", flush=True)
    print(
        f"\nGoals: AdamW <= {TARGET} in {args.steps} steps at >= 0.95x the bare loop's steps/s; "
        f"best <= {TARGET} in <= 1400 steps."
    )


if __name__ == "__main__":
    main()
