"""Why a curvature measurement costs more later in training: how much a warm start 100 steps old still helps.

The lm GPT in nanoGPT's CPU configuration trains with AdamW (lr 1e-3) on char-level Shakespeare; every
``--every`` steps, on the fixed 12 × 64 batch the overhead benchmark uses, the top ``--k`` eigenvalues of the
preconditioned Hessian are measured to residual 1e-3, warm-started from the previous measurement's top
eigenvector. Printed per measurement: |cos| between the previous and the new top eigenvector (how much of the
warm start is still the answer), λ₂/λ₁ (how crowded the top of the spectrum is: the closer to 1, the slower
Lanczos separates λ₁), and the products the monitor's default measurement (residual 1e-2) takes from that warm
start. Backs the README's explanation of ``benchmarks/curvature_overhead.py --warm-steps``. With ``--tols``, the
same for each residual tolerance given (each warm-started from its own previous measurement, as a monitor with
that ``tol`` would be), with its top eigenvalue's relative error against the residual-1e-3 reference: what a
looser ``Curvature(tol=...)`` saves, and what it costs.

    python benchmarks/curvature_warm_start.py [--steps 1000] [--every 100] [--k 4] [--threads 1] [--tols 1e-2]
"""

from __future__ import annotations

import argparse

import torch

from common import Parser, corpus_ids, lm_shape, loss_fn, machine, positive_number, text_file, whole_number
from optiscope.curvature import sharpness
from optiscope.data.batches import sample_batch
from optiscope.models.gpt import GPT, GPTConfig
from optiscope.optim import AdamW


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--steps", type=whole_number(1), default=1000)
    parser.add_argument("--every", type=whole_number(1), default=100)
    parser.add_argument("--k", type=whole_number(2), default=4, help="eigenvalues measured (λ₂/λ₁ needs 2)")
    parser.add_argument("--text", type=text_file, default=None)
    parser.add_argument("--threads", type=whole_number(1), default=1)
    parser.add_argument(
        "--tols", default="1e-2", help="comma-separated residual tolerances of the warm measurement (default: 1e-2)"
    )
    args = parser.parse_args()
    try:
        tols = [positive_number(t) for t in args.tols.split(",")]
    except argparse.ArgumentTypeError:
        tols = []
    if not tols or any(t >= 1 for t in tols):
        parser.error(f"--tols {args.tols!r}: give comma-separated numbers in (0, 1), e.g. 1e-2,5e-2")
    if args.every > args.steps:
        parser.error(f"--every {args.every} exceeds --steps {args.steps}: nothing would be measured")
    torch.set_num_threads(args.threads)
    ids = corpus_ids(args.text)
    shape, context, batch_size = lm_shape("cpu")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, block_size=context, **shape))
    opt = AdamW(model.parameters(), lr=1e-3)
    batch = sample_batch(ids, context, 12, torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(1)
    print(f"torch {torch.__version__}, {machine('cpu')}, GPT {model.num_parameters() / 1e6:.2f}M params")
    warm_columns = "   ".join(f"HVPs at {t:g} (error)" for t in tols)
    print(f"{'step':>6}{'|cos| prev/new':>16}{'λ₂/λ₁':>8}  top {args.k} (residual 1e-3)   {warm_columns}, warm")
    previous = None
    carried = dict.fromkeys(tols)  # each tolerance's own previous top eigenvector
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, sample_batch(ids, context, batch_size, generator)).backward()
        opt.step()
        if step % args.every:
            continue
        top = sharpness(model, loss_fn, batch, opt, k=args.k, tol=1e-3, max_hvps=150, init=previous)
        values, vector = top["eigenvalues"], top["vector"]
        if previous is None:
            overlap, warm = "-", "-"
        else:
            overlap = f"{float(abs(previous @ vector) / (previous.norm() * vector.norm())):.3f}"
            said = []
            for tol in tols:
                at = sharpness(model, loss_fn, batch, opt, tol=tol, init=carried[tol])
                said.append(f"{at['hvps']} ({abs(at['eigenvalues'][0] - values[0]) / abs(values[0]):.1e})")
                carried[tol] = at["vector"]
            warm = "   ".join(said)
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{step:>6}{overlap:>16}{values[1] / values[0]:>8.3f}  {shown}   {warm}", flush=True)
        previous = vector
        carried = {tol: vector if v is None else v for tol, v in carried.items()}


if __name__ == "__main__":
    main()
