"""Cost of ``curvature.sharpness`` on the lm GPT, in Hessian-vector products and in forward+backward units.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64; char-level Shakespeare), AdamW
trained ``--warm-steps`` steps so that its preconditioner exists, a fixed 12 × 64 batch. Measured in one
process: the median time of one forward+backward (the peer unit) and of one HVP (forward-over-reverse);
the preconditioned sharpness from a cold (random) start to relative residual 1e-3, and again after
``--between`` more training steps warm-started from the previous top eigenvector; both against a
reference eigenvalue at residual 1e-6. Goals (issue 12): top-1 to 1e-3 relative in ≤ 20 HVPs warm,
one HVP ≤ 2.5 forward+backward.

    python benchmarks/curvature_cost.py [--warm-steps 30] [--between 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from monitor_overhead import corpus_ids
from optiscope.curvature import HessianOperator, sharpness
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.optim import AdamW


def loss_fn(net, batch):
    return net(*batch)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm-steps", type=int, default=30)
    parser.add_argument("--between", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--text", default=None)
    args = parser.parse_args()
    ids = corpus_ids(args.text)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, n_layer=4, n_head=4, n_embd=128, block_size=64))
    opt = AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    batch = sample_batch(ids, 64, 12, torch.Generator().manual_seed(2))

    def train(steps: int) -> None:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss_fn(model, sample_batch(ids, 64, 12, gen)).backward()
            opt.step()

    train(args.warm_steps)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()

    op = HessianOperator(model, loss_fn, batch)
    v = torch.randn(op.size)
    fb, hvp = [], []
    for _ in range(args.repeats + 1):  # the first of each warms caches up and is dropped
        start = time.perf_counter()
        forward_backward()
        fb.append(time.perf_counter() - start)
        start = time.perf_counter()
        op(v)
        hvp.append(time.perf_counter() - start)
    fb_s, hvp_s = statistics.median(fb[1:]), statistics.median(hvp[1:])

    def measured(init=None, tol=1e-3, max_hvps=100):
        start = time.perf_counter()
        out = sharpness(model, loss_fn, batch, opt, tol=tol, max_hvps=max_hvps, init=init)
        return out, time.perf_counter() - start

    cold, cold_s = measured()
    train(args.between)
    reference, _ = measured(init=cold["vector"], tol=1e-6, max_hvps=150)
    warm, warm_s = measured(init=cold["vector"])
    ref = reference["eigenvalues"][0]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPT {model.num_parameters() / 1e6:.2f}M params"
    )
    print(f"forward+backward {fb_s * 1e3:.1f} ms, HVP {hvp_s * 1e3:.1f} ms ({op.mode}): HVP = {hvp_s / fb_s:.2f} f+b")
    print(f"preconditioned sharpness (Adam, {warm['label']} threshold): reference {ref:.6g} at residual 1e-6")
    for name, out, secs in (("cold", cold, cold_s), ("warm", warm, warm_s)):
        err = "" if name == "cold" else f", |λ − ref|/ref {abs(out['eigenvalues'][0] - ref) / abs(ref):.1e}"
        print(
            f"{name}: {out['hvps']} HVPs to residual {out['residuals'][0]:.1e}{err}; {secs:.1f} s = "
            f"{secs / fb_s:.0f} f+b"
        )
    print(f"warm / cold HVPs: {warm['hvps'] / cold['hvps']:.2f}")
    print("Goals: <= 20 HVPs warm to 1e-3; one HVP <= 2.5 forward+backward.")


if __name__ == "__main__":
    main()
