"""A probe session: a copy of the user's model trained and measured for a few steps, within a budget of passes.

The copy is trained by a fresh optimizer built at a reference learning rate of 1, so that η for a step is set by
scaling every group's lr (groups keep their ratios), and the stability threshold read at the reference is its
coefficient c (c/η at η = 1). Everything the session spends is counted in forward+backward passes on one batch: a
step costs one, a Hessian-vector product two (``HVP_COST``), a curvature measurement also one for the gradient graph
its products differentiate. The caller's model, its gradients and the global random state are never touched
(``untouched``): torch's, CUDA's, Python's and NumPy's generators are put back as they were.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..checks import is_number, is_optimizer
from ..curvature import directional_curvature, noise_scale_from_norms, sharpness, stability_threshold
from ..curvature.hvp import map_tensors
from ..curvature.thresholds import adam_family, inner_optimizer, inverse_preconditioner, rule
from ..errors import SuggestionError
from ..optim import build_optimizer

#: forward+backward passes that one Hessian-vector product costs (reverse over reverse: ``curvature.hvp``)
HVP_COST = 2
#: Lanczos's relative residual for a probe's sharpness: the suggestion is read to a factor, not a digit
TOLERANCE = 0.05

OptimizerSpec = str | Callable[[list[Tensor], float], torch.optim.Optimizer]


@contextlib.contextmanager
def untouched(model: nn.Module) -> Iterator[None]:
    """The global random state as it was after the block: torch's (the CPU's and the CUDA devices of ``model``),
    Python's ``random`` and NumPy's; a DataLoader that shuffles draws from torch's."""
    devices = sorted({t.get_device() for t in [*model.parameters(), *model.buffers()] if t.is_cuda})
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


class Batches:
    """Batches drawn one at a time from any iterable, cycled when it runs out: an iterable that gives a new iterator
    each time (a list, a DataLoader) is iterated again; a one-shot iterator (a generator) is replayed from the
    batches it gave. Tensors are moved to ``device``."""

    def __init__(self, batches: Iterable[Any], device: torch.device) -> None:
        if isinstance(batches, str | bytes) or not isinstance(batches, Iterable):
            raise TypeError(
                f"suggest_lr: batches is a {type(batches).__name__}; give an iterable of batches (a DataLoader, a list)"
            )
        self.source, self.device = batches, device
        self.iterator = iter(batches)
        self.again = self.iterator is not batches  # iter() gives a fresh pass
        self.kept: list[Any] = []  # a one-shot iterator's batches, to replay
        self.drawn = 0

    def next(self) -> Any:
        batch = next(self.iterator, _END)
        if batch is _END and self.again and self.drawn:
            self.iterator = iter(self.source)
            batch = next(self.iterator, _END)
        if batch is _END:
            if not self.kept:
                raise SuggestionError(
                    "suggest_lr: batches gave no batch; give an iterable with at least one batch (a DataLoader, a "
                    "list of batches)"
                )
            batch = self.kept[self.drawn % len(self.kept)]
        elif not self.again:
            self.kept.append(batch)
        self.drawn += 1
        return map_tensors(lambda t: t.to(self.device), batch)


#: what ``next`` gives at the end of an iterator
_END = object()


def gain(optimizer: torch.optim.Optimizer) -> float:
    """How many times the gradient a steady stream of equal gradients moves the weights by, per unit η: 1 for SGD
    and the Adam family (m̂ → g), (1 − τ)/(1 − β) for heavy ball with dampening τ, 1 + β(1 − τ)/(1 − β) for
    Nesterov; 1 for an optimizer without a known rule."""
    optimizer = inner_optimizer(optimizer)
    if rule(optimizer) != "sgd":
        return 1.0
    group = optimizer.param_groups[0]
    beta, tau = float(group.get("momentum", 0.0)), float(group.get("dampening", 0.0))
    if beta == 0:
        return 1.0
    steady = (1 - tau) / (1 - beta)
    return 1 + beta * steady if group.get("nesterov") else steady


def build(spec: OptimizerSpec, model: nn.Module, weight_decay: float, decay_vectors: bool) -> torch.optim.Optimizer:
    """The optimizer of ``spec`` over ``model`` at η = 1: a recipe name or class path (``optim.build_optimizer``), or
    ``spec(params, 1.0)`` with the model's parameters that require grad."""
    if isinstance(spec, str):
        return build_optimizer(spec, model, 1.0, weight_decay, decay_vectors=decay_vectors)
    if not callable(spec):
        raise TypeError(
            f"suggest_lr: optimizer is a {type(spec).__name__}; give a recipe name ('adamw'), a class path "
            "('torch.optim.NAdam') or a function (params, lr) -> torch.optim.Optimizer"
        )
    optimizer = spec([p for p in model.parameters() if p.requires_grad], 1.0)
    if not is_optimizer(optimizer):
        raise TypeError(f"suggest_lr: optimizer(params, lr) returned a {type(optimizer).__name__}, not an optimizer")
    return optimizer


class Session:
    """One probe: a copy of the model, its optimizer at the reference η = 1, the batches, and the passes spent.

    Args:
        model: the caller's model (copied; the copy keeps its train/eval mode).
        spec: the optimizer (``build``).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``.
        batches: the caller's batches.
        steps: the passes the session may spend.
        weight_decay: λ for a recipe name's recipes that decay.
        decay_vectors: ``build_optimizer``'s, for a recipe name.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: OptimizerSpec,
        loss_fn: Callable[[nn.Module, Any], Tensor],
        batches: Iterable[Any],
        steps: int,
        weight_decay: float = 0.0,
        decay_vectors: bool = True,
    ) -> None:
        self.model = copy.deepcopy(model)
        self.loss_fn, self.steps = loss_fn, steps
        self.optimizer = build(spec, self.model, weight_decay, decay_vectors)
        lrs = [g.get("lr") for g in self.optimizer.param_groups]
        if not all((is_number(lr) or isinstance(lr, Tensor)) and float(lr) > 0 for lr in lrs):
            raise SuggestionError(
                f"suggest_lr: {type(self.optimizer).__name__} was built with lr=1 but its param groups hold lr={lrs}; "
                "a suggestion is an lr: give an optimizer whose groups take one (not lr=None)"
            )
        self.ratios = [float(lr) for lr in lrs]  # each group's lr per unit of the reference
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self.batches = Batches(batches, device)
        self.spent = 0.0
        self.taken = 0
        self.lr = 0.0
        self.vector: Tensor | None = None  # the last top eigenvector, to warm-start the next measurement
        self.probes: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.adaptive = adam_family(self.optimizer)
        self.moved = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.gradients: list[list[Tensor]] = []
        self.stability = self.at(1.0, lambda: stability_threshold(self.optimizer))

    @property
    def remaining(self) -> float:
        return self.steps - self.spent

    @property
    def coefficient(self) -> float | None:
        """c of the threshold c/η (its value at the reference η = 1, where it holds for the largest group's lr)."""
        return self.stability.threshold

    def at(self, lr: float, action: Callable[[], Any]) -> Any:
        """``action()`` with every group at ``lr`` × its ratio; the groups' lrs put back after."""
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for g, ratio in zip(self.optimizer.param_groups, self.ratios, strict=True):
            g["lr"] = lr * ratio
        try:
            return action()
        finally:
            for g, lr_before in zip(self.optimizer.param_groups, saved, strict=True):
                g["lr"] = lr_before

    def loss(self, batch: Any) -> Tensor:
        """The loss on ``batch`` with its graph; the first one that is not finite is bad input."""
        loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise TypeError(f"suggest_lr: loss_fn returned a {type(loss).__name__}; it must return the scalar loss")
        if not torch.isfinite(loss) and self.taken == 0:
            raise SuggestionError(
                f"suggest_lr: the loss is {float(loss.detach())} at the first probe step, before any update; check "
                "loss_fn and the batches (a learning rate cannot be read from a loss that is not finite)"
            )
        return loss

    def gradient(self) -> tuple[Any, float]:
        """(a batch drawn, its loss) with the gradients of the loss in the copy's ``.grad``; one pass."""
        batch = self.batches.next()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        if torch.isfinite(loss):
            loss.backward()
        self.spent += 1
        return batch, float(loss.detach())

    def step(self, lr: float, gradient: tuple[Any, float] | None = None) -> float:
        """One optimizer step at ``lr`` (0: the state moves, the weights do not) on the next batch, or on the
        ``gradient`` already taken; its loss (a step whose loss is not finite is not taken)."""
        batch, loss = gradient or self.gradient()
        if math.isfinite(loss):
            self.at(lr, self.optimizer.step)
        self.taken += 1
        self.lr = lr
        self.probes.append({"kind": "step", "step": self.taken, "lr": lr, "loss": loss})
        return loss

    def sharpness(self, hvps: int, lr: float = 0.0) -> float | None:
        """λ₁ of H, or of P⁻¹H for an Adam-family optimizer, on the next batch, after a step at ``lr`` on it (so that
        P holds that batch's gradient, as the step that meets its curvature would: P from other batches alone can be
        far smaller where this batch's gradient is new, and λ₁(P⁻¹H) thousands of times larger); Lanczos
        warm-started from the last measurement, at most ``hvps`` products. None when it is not finite."""
        if self.adaptive:
            taken = self.gradient()
            batch = taken[0]
            self.step(lr, taken)
        else:  # P = I: nothing of the batch enters it
            batch = self.batches.next()
        out = self.at(
            1.0,
            lambda: sharpness(
                self.model, self.loss_fn, batch, self.optimizer, tol=TOLERANCE, max_hvps=hvps, init=self.vector
            ),
        )
        self.spent += 1 + HVP_COST * out["hvps"]
        value = out["eigenvalues"][0]
        self.vector = out["vector"]
        return self.measured("sharpness", value, None)

    def warm_up(self, count: int) -> None:
        """``count`` steps at η = 0: the optimizer's state fills, the weights stay; each batch's gradient is kept
        (``gradients``) for the noise scale."""
        for _ in range(count):
            taken = self.gradient()
            if math.isfinite(taken[1]):
                self.gradients.append([p.grad.detach().clone() for p in self.moved if p.grad is not None])
            self.step(0.0, taken)

    def noise_limit(self) -> dict[str, float] | None:
        """McCandlish et al.'s optimal step for the warm-up's batches (θ unchanged between them), preconditioned as
        the optimizer steps: with Ḡ their mean gradient and N = tr(P⁻¹Σ)/(ḠᵀP⁻¹Ḡ) one batch's gradient noise
        over its signal (``curvature.noise_scale_from_norms``, in units of one batch), and ε_max = ḠᵀP⁻¹Ḡ /
        (ḠᵀP⁻¹HP⁻¹Ḡ) the greedy step along P⁻¹Ḡ (H of the next batch, one product), the step is
        ε_max/(1 + N), divided by the optimizer's steady gain (``gain``: 1/(1 − β) for heavy ball). None with fewer
        than two gradients or a curvature along P⁻¹Ḡ that is not positive (a concave direction sets no limit)."""
        if len(self.gradients) < 2:
            return None
        scales = [
            inverse_preconditioner(self.optimizer, p) if self.adaptive else torch.ones_like(p) for p in self.moved
        ]
        mean = [torch.stack(parts).mean(0) for parts in zip(*self.gradients, strict=True)]
        small = [
            statistics.fmean(float((s * g * g).sum()) for g in grads)
            for s, grads in zip(scales, zip(*self.gradients, strict=True), strict=True)
        ]
        big = [float((s * m * m).sum()) for s, m in zip(scales, mean, strict=True)]
        noise = noise_scale_from_norms(small, big, 1, len(self.gradients))
        if not noise["grad_sq"] > 0:
            return None
        direction = {id(p): s * m for p, s, m in zip(self.moved, scales, mean, strict=True)}
        batch = self.batches.next()
        out = self.at(1.0, lambda: directional_curvature(self.model, self.loss_fn, batch, direction, self.optimizer))
        self.spent += 1 + HVP_COST
        self.measured("curvature", out["curvature"], None)
        if not out["curvature"] > 0:
            return None
        greedy = 1 / out["curvature"]
        return {
            "greedy": greedy,
            "noise": noise["noise_scale"],
            "limit": greedy / (gain(self.optimizer) * (1 + max(0.0, noise["noise_scale"]))),
        }

    def measured(self, kind: str, value: float, loss: float | None) -> float | None:
        """Record a measurement (``probes``) with ``loss``, that of its batch or else of the last step, and return
        it; None when it is not finite."""
        c = self.coefficient
        if loss is None:
            loss = next((p["loss"] for p in reversed(self.probes) if p["kind"] == "step"), None)
        finite = math.isfinite(value)
        edge = c / value if c and finite and value > 0 else None
        self.probes.append(
            {
                "kind": kind,
                "step": self.taken,
                "lr": self.lr,
                "loss": loss,
                "sharpness": value,
                "threshold": c,
                "edge": edge,
            }
        )
        return value if finite else None
