"""Cost of ``curvature.sharpness`` on the lm GPT, in Hessian-vector products and in forward+backward units.

nanoGPT's CPU configuration (4 layers, 4 heads, 128 dims, context 64; char-level Shakespeare), AdamW
trained ``--warm-steps`` steps so that its preconditioner exists, a fixed 12 × 64 batch. Measured in one
process: the median time of one forward+backward (the unit), of the operator's linearisation (once per
measurement: a forward+backward that keeps its graph), of one HVP on that graph, and of one HVP by
``torch.func``'s forward-over-reverse ``jvp(grad)`` (the usual way, and the peer); the preconditioned
sharpness from a cold (random) start to relative residual 1e-3, and again after ``--between`` more
training steps warm-started from the previous top eigenvector, alone and with the update and the
gradient in its start block (as the monitor measures); all against a reference eigenvalue asked for at
residual 1e-6 (it stops where float32 products stall, and says where). Goals (issue 12): top-1 to 1e-3
relative in ≤ 20 HVPs warm, one HVP ≤ 2.5 forward+backward. ``--device cuda --size gpu`` measures nanoGPT's GPU
configuration (6 layers, 384 wide, context 256; 12 sequences).

    python benchmarks/curvature_cost.py [--warm-steps 30] [--between 10] [--repeats 5] [--device cpu|cuda]
        [--size cpu|gpu]
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from torch.func import functional_call, grad, jvp

from common import (
    LM_SIZES,
    Parser,
    corpus_ids,
    device,
    lm_shape,
    loss_fn,
    machine,
    synchronize,
    text_file,
    timed,
    whole_number,
)
from optiscope.curvature import HessianOperator, sharpness
from optiscope.curvature.hvp import evaluating
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.optim import AdamW


def forward_over_reverse(op: HessianOperator):
    """v ↦ H v by ``torch.func.jvp`` of ``torch.func.grad``: a forward and a backward pass each time."""

    def loss(theta):
        return functional_call(op.module, {**op.constants, **theta}, (op.batch,))

    def product(v: torch.Tensor) -> torch.Tensor:
        with evaluating(op.model):
            _, hv = jvp(grad(loss), (op.theta,), (op.split(v),))
        return op.flatten(hv)

    return product


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--warm-steps", type=whole_number(1), default=30)
    parser.add_argument("--between", type=whole_number(1), default=10)
    parser.add_argument("--repeats", type=whole_number(1), default=5)
    parser.add_argument("--text", type=text_file, default=None)
    parser.add_argument(
        "--threads", type=whole_number(1), default=1, help="torch threads (1: steadier on a shared machine)"
    )
    parser.add_argument("--device", type=device, default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--size", default="cpu", choices=tuple(LM_SIZES), help="nanoGPT's CPU or GPU configuration")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = corpus_ids(args.text)
    shape, context, _ = lm_shape(args.size)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, **shape)).to(args.device)
    opt = AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def draw(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.to(args.device) for t in sample_batch(ids, context, 12, generator))

    batch = draw(torch.Generator().manual_seed(2))

    def train(steps: int) -> dict[int, torch.Tensor]:
        """Trains ``steps`` steps; returns the last update (as the monitor measures it)."""
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss_fn(model, draw(gen)).backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
        return {id(p): p.detach() - b for p, b in zip(model.parameters(), before, strict=True)}

    train(args.warm_steps)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()

    op = HessianOperator(model, loss_fn, batch)
    v = torch.randn(op.size, device=args.device)
    peer_hvp = forward_over_reverse(op)
    times: dict[str, list[float]] = {"fb": [], "linearise": [], "first": [], "later": [], "peer": []}
    for _ in range(args.repeats + 1):  # the first of each warms caches up and is dropped; interleaved
        times["fb"].append(timed(forward_backward))
        fresh = HessianOperator(model, loss_fn, batch)
        times["linearise"].append(timed(fresh.gradient))
        times["first"].append(timed(partial(fresh, v)))
        times["later"].append(timed(partial(fresh, v)))
        times["peer"].append(timed(lambda: peer_hvp(v)))
    fb_s, lin_s, first_s, hvp_s, peer_s = (
        statistics.median(times[k][1:]) for k in ("fb", "linearise", "first", "later", "peer")
    )
    agreement = float((op(v) - peer_hvp(v)).norm() / peer_hvp(v).norm())

    def measured(init=None, tol=1e-3, max_hvps=100, along=None):
        synchronize()
        start = time.perf_counter()
        out = sharpness(model, loss_fn, batch, opt, tol=tol, max_hvps=max_hvps, init=init, along=along)
        synchronize()
        return out, time.perf_counter() - start

    cold, cold_s = measured()
    update = train(args.between)
    reference, _ = measured(init=cold["vector"], tol=1e-6, max_hvps=150)
    warm, warm_s = measured(init=cold["vector"])
    loose, loose_s = measured(init=cold["vector"], tol=1e-2)  # the monitor's default
    both, both_s = measured(init=cold["vector"], along={"update": update, "gradient": "gradient"})
    ref = reference["eigenvalues"][0]
    size = f"GPT {model.num_parameters() / 1e6:.2f}M params, batch 12 x {context}"
    print(f"torch {torch.__version__}, {machine(args.device)}, {size}")
    print(
        f"forward+backward {fb_s * 1e3:.1f} ms; linearisation {lin_s * 1e3:.1f} ms = {lin_s / fb_s:.2f} f+b "
        f"(once per measurement); HVP on its graph {hvp_s * 1e3:.1f} ms = {hvp_s / fb_s:.2f} f+b "
        f"(the first on a fresh graph {first_s * 1e3:.1f} ms = {first_s / fb_s:.2f} f+b)"
    )
    print(
        f"peer: torch.func forward-over-reverse HVP {peer_s * 1e3:.1f} ms = {peer_s / fb_s:.2f} f+b; "
        f"ours / peer {hvp_s / peer_s:.2f}; products agree to {agreement:.1e}"
    )
    stop = "converged" if reference["converged"] else "stalled at the float32 rounding floor"
    print(
        f"preconditioned sharpness (Adam, {warm['label']} threshold): reference {ref:.6g}, asked for residual "
        f"1e-6: {stop} at {reference['residuals'][0]:.1e} after {reference['hvps']} HVPs (at most 150)"
    )
    rows = (
        ("cold", cold, cold_s),
        ("warm", warm, warm_s),
        ("warm, tol 1e-2 (the monitor's)", loose, loose_s),
        ("warm + update, gradient", both, both_s),
    )
    for name, out, secs in rows:
        err = "" if name == "cold" else f", |λ − ref|/ref {abs(out['eigenvalues'][0] - ref) / abs(ref):.1e}"
        print(
            f"{name}: {out['hvps']} HVPs to residual {out['residuals'][0]:.1e}{err}; {secs:.2f} s = "
            f"{secs / fb_s:.1f} f+b, {(secs - lin_s) / fb_s / out['hvps']:.2f} f+b per HVP beyond the linearisation"
        )
    print(f"warm / cold HVPs: {warm['hvps'] / cold['hvps']:.2f}")
    along = both["along"]
    print(
        f"with the update and the gradient in the start block: curvature along them "
        f"{along['update']['ratio']:.3g}x and {along['gradient']['ratio']:.3g}x the threshold"
    )
    print("Goals: <= 20 HVPs warm to 1e-3; one HVP <= 2.5 forward+backward.")


if __name__ == "__main__":
    main()
