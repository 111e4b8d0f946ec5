"""Why a curvature measurement costs more later in training: how much a warm start 100 steps old still helps.

The lm GPT in nanoGPT's CPU configuration trains with AdamW (lr 1e-3) on char-level Shakespeare; every
``--every`` steps, on the fixed 12 × 64 batch the overhead benchmark uses, the top ``--k`` eigenvalues of the
preconditioned Hessian are measured to residual 1e-3, warm-started from the previous measurement's top
eigenvector. Printed per measurement: |cos| between the previous and the new top eigenvector (how much of the
warm start is still the answer), λ₂/λ₁ (how crowded the top of the spectrum is: the closer to 1, the slower
Lanczos separates λ₁), and the products the monitor's default measurement (residual 1e-2) takes from that warm
start. Backs the README's explanation of ``benchmarks/curvature_overhead.py --warm-steps``.

    python benchmarks/curvature_warm_start.py [--steps 1000] [--every 100] [--k 4] [--threads 1]
"""

from __future__ import annotations

import torch

from common import Parser, corpus_ids, lm_shape, loss_fn, machine, text_file, whole_number
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
    args = parser.parse_args()
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
    print(f"{'step':>6}{'|cos| prev/new':>16}{'λ₂/λ₁':>8}  top {args.k} (residual 1e-3)   HVPs at 1e-2, warm")
    previous = None
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
            warm = sharpness(model, loss_fn, batch, opt, tol=1e-2, init=previous)["hvps"]
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{step:>6}{overlap:>16}{values[1] / values[0]:>8.3f}  {shown}   {warm}", flush=True)
        previous = vector


if __name__ == "__main__":
    main()
