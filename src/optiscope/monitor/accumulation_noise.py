"""The micro-batches of an accumulated optimizer step as the small batches of the gradient noise scale."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .curvature import SmallBatchNorms
from .names import under_compile


class AccumulationNoise:
    """The n backward passes that one optimizer step accumulates, as n small batches, at no extra pass.

    A hook that runs after autograd has accumulated each backward pass into ``p.grad``
    (``Tensor.register_post_accumulate_grad_hook``) takes, on the steps ``due()`` says the curvature
    measures, the pass's own contribution c_i = p.grad − (p.grad after the pass before) and adds |c_i|²;
    the accumulated sum Σc_i is kept too, before any clipping changes ``p.grad``. With the usual
    accumulation, each pass's loss divided by n so that ``p.grad`` ends as the mean, the pass's own
    gradient is G_small,i = n·c_i and the step's is G_big = Σc_i, so

        ⟨|G_small|²⟩ = n Σ|c_i|²,   |G_big|² = |Σc_i|².

    B_simple and the SNR are ratios, the same whatever the passes were scaled by; |G|² and tr(Σ) take that
    division as given. A pass that does not reach a parameter (an unused head, an expert no example was
    routed to) adds nothing to its ``p.grad``: c_i = 0 there, counted among the n passes (the most any
    parameter saw); one that no pass reached has 0 in each (nothing to |G|² or tr Σ; its SNR is NaN).
    A new accumulation after ``zero_grad`` — also one whose optimizer step was skipped (non-finite gradients
    under a GradScaler) — is told by ``p.grad`` being another tensor, or having been changed in place since
    the last pass (its version counter), and starts the sums over. Costs one copy of each gradient, on
    measured steps only. Not under DDP, whose reducer overwrites ``p.grad`` with the ranks' mean at the last
    pass: take the ranks as the small batches there (``rank_batch_size``).
    """

    source = "accumulated micro-batches"

    def __init__(
        self, model: nn.Module, named: list[tuple[str, nn.Parameter]], batch_size: int, due: Callable[[], bool]
    ) -> None:
        if isinstance(under_compile(model), nn.parallel.DistributedDataParallel):
            raise ValueError(
                f"Monitor: Curvature(accumulation_batch_size={batch_size}) cannot see a pass's own gradient under "
                "DistributedDataParallel (it averages the ranks into p.grad); give rank_batch_size (examples per "
                "rank per step) instead"
            )
        self.batch_size = batch_size
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.due = due
        self.squares: dict[int, Tensor] = {}  # Σ|c_i|² per parameter
        self.counts: dict[int, int] = {}
        self.sums: dict[int, Tensor] = {}  # Σc_i: p.grad after the last pass, before clipping
        # p.grad as the last pass left it (weakly: zero_grad may free it) and its version counter
        self.seen: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        self.handles = [p.register_post_accumulate_grad_hook(self.hook) for p in self.params]

    @torch.no_grad()
    def hook(self, p: Tensor) -> None:
        if p.grad is None or not self.due():
            return
        grad = p.grad
        seen = self.seen.get(id(p))
        # a pass adds in place (version + 1); another tensor, or other changes, mean the gradient was reset since
        if seen is not None and not (seen[0]() is grad and grad._version == seen[1] + 1):
            self.squares.pop(id(p), None)
            self.counts.pop(id(p), None)
            self.sums.pop(id(p), None)
        self.seen[id(p)] = (weakref.ref(grad), grad._version)
        grad = grad.detach()
        before = self.sums.get(id(p))
        own = grad if before is None else grad - before
        square = own.double().square().sum()
        self.squares[id(p)] = square if before is None else self.squares[id(p)] + square
        self.counts[id(p)] = self.counts.get(id(p), 0) + 1
        self.sums[id(p)] = grad.clone()

    def gather(self) -> SmallBatchNorms | None:
        """The step's norms (None when it took fewer than 2 passes, e.g. no accumulation); starts over."""
        counts = [self.counts.get(id(p), 0) for p in self.params]
        n = max(counts, default=0)
        small, big = [], []
        for p, count in zip(self.params, counts, strict=True):
            if count and n >= 2:  # the passes that did not reach p added 0 to it
                small.append(n * float(self.squares[id(p)]))
                big.append(float(self.sums[id(p)].double().square().sum()))
            else:  # no pass reached p: 0 in each
                small.append(0.0)
                big.append(0.0)
        self.squares, self.counts, self.sums, self.seen = {}, {}, {}, {}
        return SmallBatchNorms(self.names, small, big, n, self.batch_size, self.source) if n >= 2 else None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
