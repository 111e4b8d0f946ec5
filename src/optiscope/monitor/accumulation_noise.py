"""The micro-batches of an accumulated optimizer step as the small batches of the gradient noise scale."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .curvature import SmallBatchNorms
from .hooks import weak_hook
from .names import under_compile


@dataclass(frozen=True)
class Passes:
    """One parameter's passes so far in an accumulated step."""

    count: int
    square: Tensor  # Σ|c_i|²
    total: Tensor  # Σc_i: p.grad after the last pass, before clipping
    grad: weakref.ref[Tensor]  # p.grad as the last pass left it (weakly: zero_grad may free it)
    version: int  # its version counter then


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
        self.passes: dict[int, Passes] = {}  # by id(p), this step's so far
        # weakly: a parameter holding this (which holds the parameters) through its hook would be a cycle
        self.handles = [p.register_post_accumulate_grad_hook(weak_hook(self.hook)) for p in self.params]

    @torch.no_grad()
    def hook(self, p: Tensor) -> None:
        if p.grad is None or not self.due():
            return
        grad = p.grad
        last = self.passes.get(id(p))
        # a pass adds in place (version + 1); another tensor, or other changes, mean the gradient was reset since
        if last is not None and not (last.grad() is grad and grad._version == last.version + 1):
            last = None
        own = grad.detach() if last is None else grad.detach() - last.total
        square = own.double().square().sum()
        self.passes[id(p)] = Passes(
            count=1 if last is None else last.count + 1,
            square=square if last is None else last.square + square,
            total=grad.detach().clone(),
            grad=weakref.ref(grad),
            version=grad._version,
        )

    def gather(self) -> SmallBatchNorms | None:
        """The step's norms (None when it took fewer than 2 passes, e.g. no accumulation); starts over."""
        passes, self.passes = [self.passes.get(id(p)) for p in self.params], {}
        n = max((q.count for q in passes if q is not None), default=0)
        if n < 2:
            return None
        # the passes that did not reach a parameter added 0 to it; one that none reached has 0 in each
        small = [0.0 if q is None else n * float(q.square) for q in passes]
        big = [0.0 if q is None else float(q.total.double().square().sum()) for q in passes]
        return SmallBatchNorms(self.names, small, big, n, self.batch_size, self.source)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
