r"""Sharpness: the top eigenvalues of the loss Hessian, preconditioned by the optimizer when it has one.

Without an optimizer, or with SGD, the sharpness is λ₁(H). With an Adam-family optimizer it is the
*preconditioned* sharpness λ₁(P⁻¹H), P = diag(√v̂ + ε) from the optimizer's state, computed as the
top eigenvalue of the symmetric D H D with D = P^{-1/2} (same eigenvalues as P⁻¹H, as it is similar to
it). Either is compared with the optimizer's stability threshold (``thresholds.py``): a ratio
λ₁/threshold above 1 means the step is unstable along the top eigenvector.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .hvp import HessianOperator, LossFn
from .lanczos import lanczos
from .thresholds import Stability, inverse_preconditioner, stability_threshold


def preconditioner_scaling(op: HessianOperator, optimizer: torch.optim.Optimizer) -> tuple[Tensor | None, str | None]:
    """D = P^{-1/2} as a flat vector over ``op``'s parameters, or (None, why not)."""
    parts = {}
    for name, p in zip(op.names, op.params, strict=True):
        try:
            parts[id(p)] = inverse_preconditioner(optimizer, p).sqrt()
        except (KeyError, StopIteration):
            return None, f"{name} has no {type(optimizer).__name__} state yet (before its first step)"
    return op.flatten_by_param(parts), None


def operator_for(op: HessianOperator, optimizer: torch.optim.Optimizer | None) -> tuple[Any, Tensor | None, Stability]:
    """(v ↦ A v, D or None, stability) where A = D H D for a preconditioned optimizer, else H."""
    stability = stability_threshold(optimizer)
    if optimizer is None or not stability.preconditioned:
        return op, None, stability
    scale, why = preconditioner_scaling(op, optimizer)
    if scale is None:
        return op, None, Stability(None, stability.label, False, why)
    return (lambda v: scale * op(scale * v)), scale, stability


def sharpness(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    optimizer: torch.optim.Optimizer | None = None,
    k: int = 1,
    *,
    tol: float = 1e-3,
    max_hvps: int = 100,
    init: Tensor | None = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """The top-``k`` eigenvalues of H (or of P⁻¹H for Adam-family optimizers) of ``loss_fn(model, batch)``.

    Lanczos stops when each of the top k has relative residual ‖Ay − θy‖/|θ| ≤ ``tol`` or after
    ``max_hvps`` Hessian-vector products. ``init`` warm-starts it (pass the previous call's ``vector``);
    otherwise it starts from a Gaussian vector drawn with ``seed``. ``dtype=torch.float64`` evaluates in
    double precision.

    Returns ``eigenvalues`` (descending), ``threshold`` (None without a known one; ``reason`` says why),
    ``label`` (e.g. "38/η"), ``ratio`` (λ₁/threshold or None), ``preconditioned``, ``hvps``,
    ``residuals``, ``converged`` and ``vector`` (the top eigenvector of A, for the next warm start).
    """
    op = HessianOperator(model, loss_fn, batch, dtype=dtype)
    matvec, _, stability = operator_for(op, optimizer)
    start = (
        init.to(op.dtype).to(op.device) if _usable(init, op.size) else op.random(torch.Generator().manual_seed(seed))
    )
    result = lanczos(matvec, start, k=k, tol=tol, max_steps=max_hvps)
    top = result.eigenvalues[0]
    return {
        "eigenvalues": result.eigenvalues,
        "threshold": stability.threshold,
        "label": stability.label,
        "ratio": top / stability.threshold if stability.threshold else None,
        "preconditioned": stability.preconditioned,
        "reason": stability.reason,
        "hvps": op.hvps,
        "residuals": result.residuals,
        "converged": result.converged,
        "vector": result.vectors[0].detach(),
    }


def _usable(init: Tensor | None, size: int) -> bool:
    return init is not None and init.numel() == size and bool(torch.isfinite(init).all()) and bool(init.any())
