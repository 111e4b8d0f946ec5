"""Time per optimizer.step() on 25M float32 parameters in 100 tensors, optiscope vs torch.optim.

For each optimizer, optiscope (default path, which is the fused kernel where torch has one; plus our
for-loop and foreach paths for honesty) and torch.optim's fastest path (fused where torch has it,
else foreach) are timed alternately in one process; the table prints median ms per step, the ratio
ours/torch, the bytes a step must move as a share of the measured in-place stream bandwidth, and the peak memory
a step allocates beyond its state (Linux: VmHWM after resetting it through /proc/self/clear_refs; on a GPU,
torch.cuda's peak allocated). ``--device cuda`` runs it on the GPU, where torch.optim's peer is its fused kernel
too.

    python benchmarks/optim_step.py [--numel 25000000] [--tensors 100] [--reps 15] [--device cpu|cuda]
"""

from __future__ import annotations

import statistics

import torch

from common import Parser, device, extra_peak_mib, machine, timed, whole_number
from optiscope import optim as ours

# bytes per element a step must read + write at the least (params, grads, state), float32
MIN_TRAFFIC = {"sgd-momentum": 5 * 4, "adam": 7 * 4, "adamw": 7 * 4, "lion": 5 * 4}

CASES = {
    "sgd-momentum": (
        lambda ps, **kw: ours.SGD(ps, lr=1e-3, momentum=0.9, **kw),
        lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True),
        "torch fused",
    ),
    "adam": (
        lambda ps, **kw: ours.Adam(ps, lr=1e-3, **kw),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
        "torch fused",
    ),
    "adamw": (
        lambda ps, **kw: ours.AdamW(ps, lr=1e-3, **kw),
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
        "torch fused",
    ),
    "lion": (lambda ps, **kw: ours.Lion(ps, lr=1e-4, **kw), None, "no torch.optim Lion"),
}


def make_params(numel: int, tensors: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(numel // tensors, generator=g).to(device).requires_grad_() for _ in range(tensors)]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device)
    return params


def stream_bandwidth(numel: int, device: str) -> float:
    """Bytes/s of the cheapest full pass over memory: x ← c·x in place on one flat buffer of ``numel``
    floats (read + write), best of 7. The fastest a memory-bound update could hope to stream."""
    x = torch.ones(numel, device=device)
    x.mul_(1.0000001)
    best = min(timed(lambda: x.mul_(1.0000001)) for _ in range(7))
    return 2 * 4 * numel / best


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--numel", type=whole_number(1), default=25_000_000)
    parser.add_argument("--tensors", type=whole_number(1), default=100)
    parser.add_argument("--reps", type=whole_number(1), default=15)
    parser.add_argument("--device", type=device, default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    if args.tensors > args.numel:
        parser.error(f"--tensors {args.tensors} exceeds --numel {args.numel}: give at most one tensor per element")
    size = f"{args.numel / 1e6:.3g}M float32 params in {args.tensors} tensors"
    print(f"torch {torch.__version__}, {machine(args.device)}, {size}")
    params = make_params(args.numel, args.tensors, args.device)
    bandwidth = stream_bandwidth(args.numel, args.device)
    print(
        f"in-place stream bandwidth: {bandwidth / 1e9:.1f} GB/s; "
        f"a parameter-sized buffer: {4 * args.numel / 2**20:.0f} MiB"
    )
    columns = ["optimizer", "path", "ms/step", "torch ms", "ours/torch", "GB/s", "% of stream", "extra MiB"]
    widths = [14, 10, 9, 10, 12, 8, 13, 11]

    def row(values, note=""):
        cells = [f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        print("".join(cells) + note)

    print()
    row(columns)
    print("-" * sum(widths))
    for name, (make_ours, make_torch, peer) in CASES.items():
        impls = {"default": {}, "forloop": dict(foreach=False), "foreach": dict(foreach=True)}
        opts = {impl: make_ours(params, **kw) for impl, kw in impls.items()}
        if make_torch:
            opts["torch"] = make_torch(params)
        for opt in opts.values():
            opt.step()  # create state outside the timing
        times: dict[str, list[float]] = {k: [] for k in opts}
        for _ in range(args.reps):  # alternate, so drift and noise hit every contender alike
            for impl, opt in opts.items():
                times[impl].append(timed(opt.step))
        torch_ms = statistics.median(times["torch"]) * 1e3 if "torch" in times else None
        for impl, opt in opts.items():
            ms = statistics.median(times[impl]) * 1e3
            moved = MIN_TRAFFIC[name] * args.numel / (ms / 1e3)
            extra = extra_peak_mib(opt.step, args.device)
            row(
                [
                    name,
                    impl,
                    f"{ms:.1f}",
                    f"{torch_ms:.1f}" if torch_ms else "-",
                    f"{ms / torch_ms:.2f}" if torch_ms else "-",
                    f"{moved / 1e9:.1f}",
                    f"{100 * moved / bandwidth:.0f}%",
                    f"{extra:.0f}" if extra is not None else "n/a",
                ],
                f"   ({peer})" if impl == "torch" or not torch_ms and impl == "default" else "",
            )
        del opts
    print(
        "\nGoal: AdamW and SGD-momentum default path <= 1.1x torch fused; extra memory <= one parameter-sized buffer."
    )


if __name__ == "__main__":
    main()
