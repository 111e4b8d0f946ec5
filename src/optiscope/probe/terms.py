r"""Derivatives of a per-sequence functional along a direction, by forward-mode automatic differentiation.

For a direction v and step size η, let F_i(η) be a per-sequence quantity of the model at θ + ηv (the
summed entropy S_i, and for sampled sequences also log p(x_i)). One nested forward-mode pass
(``torch.func.jvp`` of ``torch.func.jvp``, hyper-dual numbers in effect) gives, for every sequence at once,

    F_i(0),   F_i′(0) = ∇F_i · v,   F_i″(0) = vᵀ ∇²F_i v

at the memory of a forward pass and no backward pass; the model is evaluated with
``torch.func.functional_call`` and never mutated (``fixed_state``). ``gradient_dot`` and ``hessian_quadratic``
compute the totals the reverse-mode way (∇F·v, and vᵀ(∇²F v) as a Hessian-vector product) as an independent check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp

from ..curvature.hvp import (
    buffer_copies,
    unwrap,  # noqa: F401 (re-exported: probe.unwrap)
)
from .calls import call_kwargs
from .functionals import check_logits, per_sequence, sequence_log_prob

PerSequence = Callable[[Tensor], tuple[Tensor, ...]]


def base_parameters(model: nn.Module, direction: dict[str, Tensor]) -> dict[str, Tensor]:
    params = {n: p.detach() for n, p in model.named_parameters()}
    missing = sorted(set(direction) - set(params))
    if missing:
        raise ValueError(unknown_entries(model, missing))
    return {n: params[n] for n in direction}


def unknown_entries(model: nn.Module, missing: list[str]) -> str:
    """The error for direction entries that are no parameter's name. A tied parameter (an output head's weight that is
    the embedding's) has one name, the first ``named_parameters()`` gives; an entry under its second says so."""
    first = {id(p): n for n, p in model.named_parameters()}
    second = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if n != first[id(p)]}
    tied = [n for n in missing if n in second]
    if tied:
        name = second[tied[0]]
        return f"direction[{tied[0]!r}] is the parameter {name!r} (tied): give its entry once, under {name!r}"
    return f"direction has entries for {missing[:5]}, which are not parameters of the model"


def fixed_state(model: nn.Module, direction: dict[str, Tensor]) -> dict[str, Tensor]:
    """Everything ``functional_call`` is given besides the moved parameters: the other parameters detached (no
    autograd graph through the model's own tensors) and copies of the buffers, so that a forward pass that
    updates one in place (a call counter) updates its copy, never the model's. Made inside the function a
    transform differentiates, the copies are that transform's own tensors, which it lets the forward mutate."""
    others = {n: p.detach() for n, p in model.named_parameters() if n not in direction}
    return {**others, **buffer_copies(model)}


def along(
    model: nn.Module,
    direction: dict[str, Tensor],
    inputs: Tensor,
    targets: Tensor | None,
    functional: str,
    with_log_prob: bool,
    attention_mask: Tensor | None = None,
    scored: Tensor | None = None,
) -> PerSequence:
    """η ↦ (F_i(θ + ηv) for each sequence, [log p_{θ+ηv}(x_i)]) — a pure function of η. ``scored`` picks the
    positions that count (see ``functionals``); ``attention_mask`` marks the real tokens of padded inputs."""
    theta = base_parameters(model, direction)
    kwargs = call_kwargs(model, attention_mask)

    def f(eta: Tensor) -> tuple[Tensor, ...]:
        params = {n: theta[n] + eta.to(theta[n].dtype) * v for n, v in direction.items()}
        logits = check_logits(functional_call(model, {**fixed_state(model, direction), **params}, (inputs,), kwargs))
        out = (per_sequence(functional, logits, targets, scored),)
        if with_log_prob:
            out += (sequence_log_prob(logits, targets, scored),)
        return out

    return f


def derivatives(f: PerSequence) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...]]:
    """(values, first derivatives, second derivatives) of ``f`` at η = 0, by nested forward mode."""
    zero = torch.zeros((), dtype=torch.float64)
    one = torch.ones((), dtype=torch.float64)

    def value_and_first(eta: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        return jvp(f, (eta,), (one,))

    (values, firsts), (_, seconds) = jvp(value_and_first, (zero,), (one,))
    return values, firsts, seconds


def gradient_dot(model: nn.Module, direction: dict[str, Tensor], total: Callable[[dict[str, Tensor]], Tensor]) -> float:
    """∇T(θ)·v by reverse mode, for a scalar T(params)."""
    theta = base_parameters(model, direction)
    g = grad(total)(theta)
    return float(sum(torch.sum(g[n].double() * direction[n].double()) for n in direction))


def hessian_quadratic(
    model: nn.Module, direction: dict[str, Tensor], total: Callable[[dict[str, Tensor]], Tensor]
) -> float:
    """vᵀ ∇²T(θ) v as v · (∇²T v), the Hessian-vector product by forward-over-reverse mode."""
    theta = base_parameters(model, direction)
    _, hv = jvp(grad(total), (theta,), ({n: direction[n].to(theta[n].dtype) for n in theta},))
    return float(sum(torch.sum(hv[n].double() * direction[n].double()) for n in direction))
