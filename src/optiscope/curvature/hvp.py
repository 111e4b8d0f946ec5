r"""Hessian-vector products of a loss, by forward-over-reverse automatic differentiation.

For the loss L(θ) = ``loss_fn(model, batch)`` and a vector v over the parameters that require grad,

    H v = ∂/∂ε ∇L(θ + εv) |_{ε=0}

is one ``torch.func.jvp`` of ``torch.func.grad``: a forward-mode pass through the backward pass, at
about the cost of two to three forward+backward passes and without ever forming H. The model is
evaluated with ``torch.func.functional_call`` at detached copies of its parameters (in float64 on
request) and is never mutated; it is put in eval mode meanwhile, so that dropout cannot make H v a
random function of v, and the global random-number state is left as it was.

Some of torch's derivative formulas do not support forward mode through their backward (in torch 2.13
``mse_loss`` fails with "ZeroTensors are immutable"); for such a loss the operator falls back, once and
for good, to reverse-over-reverse (``vjp`` of ``grad``: H v = vᵀH as H is symmetric), and says so in
``mode``.

Vectors are flat (one tensor over all trainable parameters, in ``model.named_parameters()`` order), so
that Lanczos and Hutchinson see a plain linear operator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp
from torch.nn.attention import SDPBackend, sdpa_kernel

LossFn = Callable[[nn.Module, Any], Tensor]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (``.module``) or ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """``obj`` (a tensor, or tuples / lists / dicts of them) with its floating tensors cast to ``dtype``."""
    if isinstance(obj, Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple | list):
        return type(obj)(cast_floats(x, dtype) for x in obj)
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class _Loss(nn.Module):
    """``loss_fn(model, batch)`` as a module's forward, so that ``functional_call`` can swap the
    parameters that ``loss_fn`` sees through ``model``."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> Tensor:
        return self.loss_fn(self.model, batch)


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode, a forked RNG and the plain-math attention kernel for the duration (the fused
    flash-attention kernels have no second derivative); every submodule's training flag is restored."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        for m, flag in flags:
            m.training = flag


class HessianOperator:
    """v ↦ H v for the loss of ``model`` on ``batch``; ``hvps`` counts the products taken.

    Args:
        model: the module (DDP / compiled wrappers are unwrapped: every rank computes the same H).
        loss_fn: ``loss_fn(model, batch) -> scalar loss`` (the training loss, mean over the batch).
        batch: a fixed batch.
        dtype: evaluate in this floating dtype (e.g. ``torch.float64``); None keeps the model's.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, batch: Any, dtype: torch.dtype | None = None) -> None:
        self.model = unwrap(model)
        self.module = _Loss(self.model, loss_fn)
        self.cast = dtype
        self.batch = self.prepare(batch)
        named = list(self.model.named_parameters())
        if not any(p.requires_grad for _, p in named):
            raise ValueError("HessianOperator: the model has no parameter that requires grad")
        self.params = [p for _, p in named if p.requires_grad]
        self.names = [n for n, p in named if p.requires_grad]
        cast = (lambda t: t.detach()) if dtype is None else (lambda t: cast_floats(t.detach(), dtype))
        self.theta = {"model." + n: cast(p) for n, p in named if p.requires_grad}
        # frozen parameters and floating buffers are constants (cast too, so that float64 is float64 throughout)
        self.constants = {"model." + n: cast(p) for n, p in named if not p.requires_grad}
        self.constants.update({"model." + n: cast(b) for n, b in self.model.named_buffers()})
        self.shapes = [t.shape for t in self.theta.values()]
        self.sizes = [t.numel() for t in self.theta.values()]
        self.size = sum(self.sizes)
        first = next(iter(self.theta.values()))
        self.dtype, self.device = first.dtype, first.device
        self.hvps = 0
        self.mode = "forward-over-reverse"

    # -------------------------------------------------------------------------------- vectors
    def split(self, flat: Tensor) -> dict[str, Tensor]:
        parts = torch.split(flat, self.sizes)
        return {k: part.view(shape) for k, part, shape in zip(self.theta, parts, self.shapes, strict=True)}

    def flatten(self, tensors: dict[str, Tensor] | list[Tensor]) -> Tensor:
        values = [tensors[k] for k in self.theta] if isinstance(tensors, dict) else tensors
        return torch.cat([t.reshape(-1).to(self.dtype) for t in values])

    def flatten_by_param(self, by_param: dict[int, Tensor], fill: float = 0.0) -> Tensor:
        """A flat vector from tensors keyed by ``id(param)``; parameters missing get ``fill``."""
        parts = []
        for p, size in zip(self.params, self.sizes, strict=True):
            t = by_param.get(id(p))
            parts.append(
                torch.full((size,), fill, dtype=self.dtype, device=self.device)
                if t is None
                else t.detach().reshape(-1).to(self.dtype)
            )
        return torch.cat(parts)

    def random(self, generator: torch.Generator, rademacher: bool = False) -> Tensor:
        x = torch.randn(self.size, generator=generator, dtype=torch.float64)
        if rademacher:
            x = x.sign()
        return x.to(self.dtype).to(self.device)

    # ------------------------------------------------------------------------------- products
    def _loss(self, theta: dict[str, Tensor], batch: Any) -> Tensor:
        return functional_call(self.module, {**self.constants, **theta}, (batch,))

    def prepare(self, batch: Any) -> Any:
        """``batch`` with its floating tensors in the operator's dtype (when one was asked for)."""
        return batch if self.cast is None else cast_floats(batch, self.cast)

    def loss(self, batch: Any = None) -> float:
        with evaluating(self.model), torch.no_grad():
            return float(self._loss(self.theta, self.batch if batch is None else self.prepare(batch)))

    def gradient(self, batch: Any = None) -> Tensor:
        """∇L(θ) as a flat vector (on ``batch``, by default the operator's own)."""
        batch = self.batch if batch is None else self.prepare(batch)
        with evaluating(self.model):
            g = grad(lambda th: self._loss(th, batch))(self.theta)
        return self.flatten(g)

    def __call__(self, v: Tensor) -> Tensor:
        """H v for a flat vector v."""
        gradient = grad(lambda th: self._loss(th, self.batch))
        tangent = self.split(v.to(self.dtype))
        with evaluating(self.model):
            if self.mode == "forward-over-reverse":
                try:
                    _, hv = jvp(gradient, (self.theta,), (tangent,))
                except RuntimeError:
                    if self.hvps:  # it worked before: this is not a missing forward-mode formula
                        raise
                    self.mode = "reverse-over-reverse"
            if self.mode == "reverse-over-reverse":
                (hv,) = vjp(gradient, self.theta)[1](tangent)
        self.hvps += 1
        return self.flatten(hv)
