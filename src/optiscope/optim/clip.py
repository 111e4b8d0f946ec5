r"""Global-norm gradient clipping.

With gradients g_1 … g_n and a threshold c, the global norm is ‖g‖ = (Σᵢ ‖gᵢ‖²)^½ and every gradient is
scaled by min(1, c / (‖g‖ + 10⁻⁶)): the direction of the full step is kept, only its length is capped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from .optimizer import grouped_by_device_and_dtype


class NonFiniteGradientError(ValueError):
    """The gradients' global norm is inf or nan; the message names the offending parameters."""


def clip_grad_norm(
    params: Iterable[Tensor] | Tensor,
    max_norm: float,
    *,
    norm_type: float = 2.0,
    nonfinite: str = "raise",
) -> Tensor:
    """Scale the gradients of ``params`` in place so their global norm is at most ``max_norm``.

    Returns the global norm *before* clipping (a 0-d tensor). If that norm is inf or nan:
    ``nonfinite="raise"`` raises ``NonFiniteGradientError`` naming the parameters with non-finite
    gradients; ``nonfinite="skip"`` leaves the gradients untouched and returns the norm, so the caller
    can skip the step.
    """
    if not (isinstance(max_norm, int | float) and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip_grad_norm: max_norm={max_norm!r} must be a finite number > 0")
    if not (isinstance(norm_type, int | float) and norm_type > 0):
        raise ValueError(f"clip_grad_norm: norm_type={norm_type!r} must be > 0 (2.0 for L2, math.inf for max)")
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"clip_grad_norm: nonfinite={nonfinite!r} must be 'raise' or 'skip'")
    params = [params] if isinstance(params, Tensor) else list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = []
    for idx in grouped_by_device_and_dtype(grads).values():
        norms.extend(torch._foreach_norm([grads[i] for i in idx], norm_type))
    device = grads[0].device
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    stacked = torch.stack([n.to(device=device, dtype=dtype) for n in norms])
    total = stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
    if not torch.isfinite(total):
        if nonfinite == "skip":
            return total
        bad = [
            f"#{i} shape {tuple(p.shape)}"
            for i, p in enumerate(params)
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        raise NonFiniteGradientError(
            f"clip_grad_norm: the gradients' global norm is {total.item()}; non-finite gradients in "
            f"{len(bad)} parameter(s): {', '.join(bad[:5])}{' …' if len(bad) > 5 else ''}. "
            "Pass nonfinite='skip' to get the norm back and skip the step instead"
        )
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for idx in grouped_by_device_and_dtype(grads).values():
        group = [grads[i] for i in idx]
        torch._foreach_mul_(group, scale.to(device=group[0].device, dtype=group[0].dtype))
    return total
