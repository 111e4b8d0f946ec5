"""Cost of the full entropy probe in units of one forward + backward pass over the same E sequences.

E = 512 sequences of 64 tokens on the ``lm`` experiment's GPT (4 layers, 4 heads, 128 dims, vocabulary
65, math attention). The probe: the AdamW step direction on those sequences, the linear and quadratic
terms (one nested forward-mode pass), and the true change at 5 step sizes. The natural floor is
1 (direction) + 1–2 (linear) + 2–3 (Hessian-vector product) + 5 × ⅓ (forwards) ≈ 5.7–7.7 units; the
goal is ≤ 1.3× the low end, with peak memory ≤ 3× that of one forward + backward. Also timed, for the
choice of method: the reverse-mode alternative (gradient·v plus a forward-over-reverse Hessian-vector
product), which gives only totals, not per-sequence terms.

    python benchmarks/probe_cost.py [--E 512] [--precision model|float64] [--reps 3]
"""

from __future__ import annotations

import statistics

import torch
from torch.func import functional_call

from common import Parser, extra_peak_mib, lm_shape, loss_fn, machine, timed, whole_number
from optiscope.models import GPT, GPTConfig
from optiscope.optim import AdamW
from optiscope.probe import probe_step, update_direction
from optiscope.probe.functionals import entropy_per_sequence
from optiscope.probe.terms import gradient_dot, hessian_quadratic

FLOOR_LOW = 1 + 1 + 2 + 5 / 3


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--E", type=whole_number(1), default=512)
    parser.add_argument("--T", type=whole_number(1), default=64)
    parser.add_argument("--precision", default="model", choices=("model", "float64"))
    parser.add_argument("--reps", type=whole_number(1), default=3)
    args = parser.parse_args()
    shape, context, _ = lm_shape("cpu")
    if context < args.T:
        parser.error(f"--T {args.T} exceeds the GPT's context of {context} tokens; give at most {context}")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=context, attention="math", **shape))
    if args.precision == "float64":
        model = model.double()
    data = torch.randint(0, 65, (args.E, args.T + 1))
    batch = (data[:, :-1], data[:, 1:])
    optimizer = AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):  # give AdamW a state
        optimizer.zero_grad()
        model(*batch)[1].backward()
        optimizer.step()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        model(*batch)[1].backward()

    def full_probe() -> None:
        v = update_direction(model, optimizer, loss_fn, batch)
        probe_step(model, v, data, [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], precision="model", chunk_size=args.E)

    v = update_direction(model, optimizer, loss_fn, batch)
    names = dict(model.named_parameters())

    def total(params):
        logits = functional_call(model, {**{k: p.detach() for k, p in names.items()}, **params}, (batch[0],))
        return entropy_per_sequence(logits).sum() / batch[0].numel()

    def reverse_terms() -> None:
        gradient_dot(model, v, total)
        hessian_quadratic(model, v, total)

    forward_backward(), full_probe(), reverse_terms()  # warm-up
    unit = statistics.median(timed(forward_backward) for _ in range(args.reps))
    probe = statistics.median(timed(full_probe) for _ in range(args.reps))
    reverse = statistics.median(timed(reverse_terms) for _ in range(args.reps))
    fb_mem, probe_mem = extra_peak_mib(forward_backward), extra_peak_mib(full_probe)
    print(f"torch {torch.__version__}, {machine('cpu')}, E={args.E} x {args.T} tokens, {args.precision}")
    print(f"one forward+backward over E: {unit:.2f} s")
    print(
        f"full probe (direction, linear + quadratic, 5 η): {probe:.2f} s = {probe / unit:.2f} units; "
        f"floor {FLOOR_LOW:.2f} units, ratio to floor {probe / unit / FLOOR_LOW:.2f} (goal <= 1.3)"
    )
    print(f"reverse-mode totals alone (∇H·v and the Hessian-vector product): {reverse / unit:.2f} units")
    if fb_mem is not None and probe_mem is not None:
        print(
            f"peak extra memory: forward+backward {fb_mem:.0f} MiB, probe {probe_mem:.0f} MiB, "
            f"ratio {probe_mem / fb_mem:.2f} (goal <= 3)"
        )


if __name__ == "__main__":
    main()
