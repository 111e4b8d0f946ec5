"""Why coupled weight decay belongs in the sharpness: the threshold ratio with λ in the Hessian and without.

The ``edge-of-stability`` student (full batch, its defaults) trains with ``adaml2`` (Adam with λθ added to the
gradient). Every ``--every`` steps the preconditioned sharpness is measured twice on the same state: as the
step sees it, λ₁(P⁻¹(H + λI)) (what ``sharpness`` reports), and for the loss alone, λ₁(P⁻¹H) (the groups'
``weight_decay`` set to 0 for that one call). Printed: the loss and both ratios to 38/η. P⁻¹λ is large where
v̂ is small, so the loss's H alone can read far from the edge a run is at. Backs the README's numbers.

    python benchmarks/curvature_weight_decay.py [--lr 1e-3] [--weight-decay 0.1] [--steps 2000] [--every 500]
"""

from __future__ import annotations

import torch

from common import Parser, non_negative_number, positive_number, whole_number
from optiscope.curvature import sharpness
from optiscope.experiments.edge_of_stability import Config, square_loss, student, teacher_data
from optiscope.optim import build_optimizer


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--lr", type=positive_number, default=1e-3)
    parser.add_argument("--weight-decay", type=non_negative_number, default=0.1)
    parser.add_argument("--steps", type=whole_number(1), default=2000)
    parser.add_argument("--every", type=whole_number(1), default=500)
    args = parser.parse_args()
    if args.every > args.steps:
        parser.error(f"--every {args.every} exceeds --steps {args.steps}: nothing would be measured")
    torch.manual_seed(0)
    config = Config(quiet=True)
    data = teacher_data(config)
    model = student(config)
    opt = build_optimizer("adaml2", model, args.lr, weight_decay=args.weight_decay)
    print(
        f"torch {torch.__version__}; adaml2 at η = {args.lr}, λ = {args.weight_decay}, on the edge-of-stability student"
    )
    print(f"{'step':>6}{'loss':>10}{'ratio with λ':>14}{'loss H alone':>14}")
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        square_loss(model, data).backward()
        opt.step()
        if step % args.every:
            continue
        with_decay = sharpness(model, square_loss, data, opt, tol=1e-4)["ratio"]
        decays = [g["weight_decay"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["weight_decay"] = 0.0
        try:
            alone = sharpness(model, square_loss, data, opt, tol=1e-4)["ratio"]
        finally:
            for g, decay in zip(opt.param_groups, decays, strict=True):
                g["weight_decay"] = decay
        with torch.no_grad():
            loss = float(square_loss(model, data))
        print(f"{step:>6}{loss:>10.4f}{with_decay:>14.3f}{alone:>14.3f}", flush=True)


if __name__ == "__main__":
    main()
