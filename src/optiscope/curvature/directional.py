r"""Curvature along one direction: the optimizer's update, or the gradient.

For a direction d, the curvature of the loss along it is the Rayleigh quotient

    c(d) = dᵀ H d / dᵀ d,

and, for a preconditioned optimizer with P = diag(√v̂ + ε), the generalised quotient

    c_P(d) = dᵀ H d / dᵀ P d = wᵀ (P^{-1/2} H P^{-1/2}) w / wᵀ w,   w = P^{1/2} d,

which lies between the extreme eigenvalues of P⁻¹H and so is directly comparable with the same
stability threshold as the preconditioned sharpness. The loss-spike analyses of Adam watch exactly this
along the gradient and the update. The direction comes from the caller (``Monitor`` passes the update it
measured, ``probe.update_direction`` gives the next one), so curvature needs nothing from the layers above.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import require_optimizer
from .hvp import LossFn
from .sharpness import against, direction_vector, in_operator_space, operator


def directional_curvature(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    direction: dict[str, Tensor] | dict[int, Tensor] | str = "gradient",
    optimizer: torch.optim.Optimizer | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """c(d) (or c_P(d) for Adam-family optimizers) along ``direction`` on ``loss_fn(model, batch)``.

    ``direction``: "gradient" (∇L on ``batch``), or tensors keyed by parameter name or by ``id(param)``
    (parameters without an entry count as 0). One Hessian-vector product.

    Returns ``curvature``, ``preconditioned``, ``threshold``, ``label``, ``ratio`` (curvature/threshold or
    None) and ``reason``.
    """
    if optimizer is not None:
        require_optimizer(optimizer, "directional_curvature")
    objective = operator(model, loss_fn, batch, optimizer, dtype)
    stability = objective.stability
    w = in_operator_space(direction_vector(objective, direction), objective.scale).double()
    length = w.norm()
    value = math.nan
    if length > 0 and torch.isfinite(length):
        # a unit vector into the product, and the quotient in float64: a float16 model's dᵀHd and dᵀd over an
        # unnormalised direction (a gradient) pass float16's 65504 where their ratio does not
        u = (w / length).to(objective.op.dtype)
        u64 = u.double()
        value = float(torch.dot(u64, objective.matvec(u).double()) / torch.dot(u64, u64))
    return {
        **against(value, stability.threshold),
        "preconditioned": objective.scale is not None,
        "threshold": stability.threshold,
        "label": stability.label,
        "reason": stability.reason,
    }
