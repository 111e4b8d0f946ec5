"""The early-warning signals' cost per step, micro-measured against a training step with the monitor alone.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64, batch 12; char-level Shakespeare), AdamW,
``Monitor(model, opt, sinks=[])`` at its default setting (every=10): the peer. Each signal of
``optiscope.monitor.warning`` is timed on its own, on the model's real gradients, weights and Adam state, as
the monitor would compute it every step (the lag before the step, the step size after it, u/w with the copy of
the parameters it needs, the gradient norm, ``Signals.update``), and a Hessian-vector product (one directional
curvature) as a curvature signal would take it every k steps. Calls alternate with training steps in blocks, each
timed with the thread's CPU clock; the table gives each one's median and its spread (the middle half), as a
percentage of the median monitored step. Issue 48's budget: ≤ 3 % over the monitor alone. The side-by-side run
through the real ``Monitor(..., early_warning=True)`` comes when the monitor has it.

    python benchmarks/warning_overhead.py [--rounds 7] [--steps 20] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from common import Parser, corpus_ids, lm_shape, loss_fn, machine, whole_number
from optiscope.curvature import directional_curvature
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.monitor import Monitor
from optiscope.monitor.warning import Signals, adam_lag, adam_moments, adam_step_size, squared_norms
from optiscope.optim import AdamW


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=7)
    parser.add_argument("--steps", type=whole_number(1), default=20, help="training steps per round")
    parser.add_argument("--threads", type=whole_number(1), default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = corpus_ids(None)
    shape, context, batch_size = lm_shape("cpu")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, attention="math", **shape))
    opt = AdamW(model.parameters(), lr=1e-3)
    monitor = Monitor(model, opt, sinks=[])
    params = [p for g in opt.param_groups for p in g["params"]]
    data = torch.Generator().manual_seed(1)
    curvature_batch = sample_batch(ids, context, batch_size, torch.Generator().manual_seed(2))

    def step() -> None:
        _, loss = model(*sample_batch(ids, context, batch_size, data))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        monitor.step(loss)

    for _ in range(12):  # Adam's state exists, the monitor has measured
        step()

    def lag() -> object:
        moments = adam_moments(opt, params)
        return adam_lag([p.grad for p in params], moments.second, moments.bias_corrections2, moments.eps)

    def step_size() -> object:
        return adam_step_size(*adam_moments(opt, params))

    def update_ratio() -> object:  # the copy before the step, then u = θ′ − θ and the norms
        before = [p.detach().clone() for p in params]
        u = torch._foreach_sub([p.detach() for p in params], before)
        return squared_norms(u), squared_norms([p.detach() for p in params])

    def grad_norm() -> object:
        return squared_norms([p.grad for p in params]).sum().sqrt()

    u2, w2 = update_ratio()
    n = len(params)
    loss = torch.tensor(2.0)
    loss_only = Signals(("loss_z", "loss_unrest", "loss_cusum"))
    grad_only = Signals(("grad_norm_z", "grad_norm_unrest"))
    every_score = Signals()

    def loss_scores() -> object:
        return loss_only.update(loss)

    def grad_norm_scores() -> object:
        return grad_only.update(loss, grad_norm=grad_norm())

    def lag_sums() -> object:  # ‖g‖² and Σv̂ per tensor: a norm of g and a sum of v (|v|'s 1-norm)
        moments = adam_moments(opt, params)
        v_sums = torch.stack(torch._foreach_norm(moments.second, 1)) / torch.tensor(moments.bias_corrections2)
        return squared_norms([p.grad for p in params]), v_sums

    def all_scores() -> object:
        g2, v_sum = lag_sums()
        inputs = {"u2": u2, "w2": w2, "gu": torch.zeros(n), "gu_prev": torch.zeros(n), "upu": u2, "g2": g2}
        return every_score.update(
            loss,
            grad_norm=torch.tensor(1.0),
            lr_over_threshold=torch.tensor(1e-3 / 38),
            lag=lag(),
            step2=step_size(),
            v_sum=v_sum,
            **inputs,
        )

    def hvp() -> object:
        return directional_curvature(model, loss_fn, curvature_batch, "gradient", opt)

    contenders: dict[str, Callable[[], object]] = {
        "loss scores (z, unrest, CUSUM)": loss_scores,
        "gradient norm and its scores": grad_norm_scores,
        "Adam's lag (before the step)": lag,
        "‖g‖² and Σv̂ per tensor (lag_sums)": lag_sums,
        "Adam's step size (after it)": step_size,
        "u/w (a copy of θ, norms)": update_ratio,
        "every score (lag included)": all_scores,
        "one directional curvature (HVP)": hvp,
    }
    steps: list[float] = []
    timings: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        for _ in range(args.steps):
            start = time.thread_time()
            step()
            steps.append(time.thread_time() - start)
        names = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in names:
            for _ in range(5 if "HVP" in name else args.steps):
                start = time.thread_time()
                contenders[name]()
                timings[name].append(time.thread_time() - start)

    step_time = statistics.median(steps)
    print(
        f"torch {torch.__version__}, {machine('cpu')}, GPT {model.num_parameters() / 1e6:.2f}M params, "
        f"batch {batch_size} x {context}; a step with the monitor (every=10): {step_time * 1e3:.1f} ms CPU (median)"
    )
    print(f"{'signal':<36}{'ms':>8}{'% of a step':>13}{'middle half':>18}")
    for name, values in timings.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(
            f"{name:<36}{median * 1e3:>8.3f}{median / step_time * 100:>12.2f}%"
            f"{f'{q1 / step_time * 100:.2f} … {q3 / step_time * 100:.2f}%':>18}"
        )
    print("Budget: <= 3% of a step for what runs every step; a curvature every k steps costs its row / k.")


if __name__ == "__main__":
    main()
