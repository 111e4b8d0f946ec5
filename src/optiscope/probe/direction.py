r"""The direction of an optimizer's next step, taken without taking it.

For parameters θ, an optimizer whose next step on a batch would move them to θ⁺, and η₀ the learning
rate of its first param group,

    v = (θ⁺ − θ) / η₀            so that θ + η₀ v is exactly the step the optimizer would take.

Momentum, Adam's moments, bias correction and weight decay are all in v, because v comes from running
the real optimizer's ``step()`` — on a shadow copy of its state and of the parameters. The model (batch
norms' running statistics included), its gradients, the optimizer's state and the global random-number
state are left exactly as they were.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import require_optimizer
from ..curvature import loss_fault, require_optimizer_of, rng_forked, running_statistics_kept
from ..monitor import own_names
from ..optim import clip_grad_norm


def gradients(model: nn.Module, loss_fn: Callable[[nn.Module, Any], Tensor], batch: Any) -> dict[int, Tensor]:
    """∇L(θ) on ``batch`` by id of parameter; the parameters' own ``.grad`` fields are restored after."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    try:
        for p in params:
            p.grad = None
        # dropout here must not shift the training run's RNG, nor a batch norm its running statistics
        with rng_forked(model), running_statistics_kept(model):
            loss = loss_fn(model, batch)
            fault = loss_fault(loss)
            if fault is not None:
                raise ValueError(
                    "update_direction: loss_fn must return the scalar training loss as a tensor computed from the "
                    f"model through autograd; it returned {fault}"
                )
            loss.backward()
        return {id(p): p.grad.detach().clone() for p in params if p.grad is not None}
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = g


def shadow_optimizer(optimizer: torch.optim.Optimizer, clones: dict[int, Tensor]) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` over ``clones`` (by id of the original parameter), state deep-copied, no hooks."""
    # torch.optim's __setstate__ (what copy.copy calls) fills in keys it lacks, e.g. "differentiable", into the
    # dicts it is given: it gets copies, or the original optimizer's defaults and groups would change
    shadow = type(optimizer).__new__(type(optimizer))
    shadow.__setstate__(
        {
            "defaults": dict(optimizer.defaults),
            "state": defaultdict(
                dict, {clones[id(p)]: copy.deepcopy(s) for p, s in optimizer.state.items() if id(p) in clones}
            ),
            "param_groups": [{**g, "params": [clones[id(p)] for p in g["params"]]} for g in optimizer.param_groups],
        }
    )
    shadow._optimizer_step_pre_hooks = OrderedDict()
    shadow._optimizer_step_post_hooks = OrderedDict()
    return shadow


def update_direction(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    loss_fn: Callable[[nn.Module, Any], Tensor],
    batch: Any,
    max_grad_norm: float | None = None,
) -> dict[str, Tensor]:
    """v = Δθ/η₀ for ``optimizer``'s next step on ``batch``, by parameter name (see module doc).

    ``loss_fn(model, batch)`` returns the scalar training loss. With ``optimizer=None`` the direction is
    the plain negative gradient, v = −∇L. ``max_grad_norm`` clips the gradients first, as a training
    loop that clips would. Parameters the step does not move are left out (their v is zero).
    """
    if optimizer is not None:
        require_optimizer(optimizer, "update_direction")
        require_optimizer_of(
            model, optimizer, [p for g in optimizer.param_groups for p in g["params"]], "update_direction"
        )
    named = own_names(model)
    grads = gradients(model, loss_fn, batch)
    params = (
        {id(p): p for g in optimizer.param_groups for p in g["params"]}
        if optimizer is not None
        else {i: p for i, p in ((id(p), p) for p in model.parameters()) if i in grads}
    )
    clones = {i: p.detach().clone().requires_grad_(p.requires_grad) for i, p in params.items()}
    for i, clone in clones.items():
        clone.grad = grads.get(i)
    if max_grad_norm is not None:
        clip_grad_norm(clones.values(), max_grad_norm)
    if optimizer is None:
        return {named[i]: -c.grad for i, c in clones.items() if i in named and c.grad is not None}
    lr = float(optimizer.param_groups[0]["lr"])
    if lr <= 0:
        raise ValueError(f"update_direction: the first param group's lr={lr!r} must be > 0 to define v = Δθ/lr")
    shadow_optimizer(optimizer, clones).step()
    direction = {}
    for i, p in params.items():
        if i in named:
            delta = clones[i].detach() - p.detach()
            if torch.any(delta != 0):
                direction[named[i]] = delta / lr
    return direction
