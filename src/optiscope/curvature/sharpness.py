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
    along: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The top-``k`` eigenvalues of H (or of P⁻¹H for Adam-family optimizers) of ``loss_fn(model, batch)``.

    Lanczos stops when each of the top k has relative residual ‖Ay − θy‖/|θ| ≤ ``tol``, after
    ``max_hvps`` Hessian-vector products, or, unconverged, when the residual stalls at the rounding floor
    of the dtype (``lanczos.py``). ``init`` warm-starts it (pass the previous call's ``vector``);
    otherwise it starts from a Gaussian vector drawn with ``seed``. ``dtype=torch.float64`` evaluates in
    double precision. ``along`` names directions (``{"gradient": "gradient", "update": tensors}``, as
    ``directional_curvature`` takes them) whose curvature to measure too: each joins Lanczos's start
    block, so it costs the one product that also enlarges the search space.

    Returns ``eigenvalues`` (descending), ``threshold`` (None without a known one; ``reason`` says why),
    ``label`` (e.g. "38/η"), ``ratio`` (λ₁/threshold or None), ``preconditioned``, ``hvps``,
    ``residuals``, ``converged``, ``vector`` (the top eigenvector of A, for the next warm start) and,
    with ``along``, ``along``: ``{name: {"curvature", "ratio"}}``.
    """
    op = HessianOperator(model, loss_fn, batch, dtype=dtype)
    matvec, scale, stability = operator_for(op, optimizer)
    start = (
        init.to(op.dtype).to(op.device) if _usable(init, op.size) else op.random(torch.Generator().manual_seed(seed))
    )
    directions = {name: in_operator_space(direction_vector(op, d), scale) for name, d in (along or {}).items()}
    rows = [start, *directions.values()]
    result = lanczos(matvec, torch.stack(rows), k=k, tol=tol, max_steps=max(max_hvps, len(rows)))
    top = result.eigenvalues[0]
    quotients = dict(zip(directions, result.start_quotients[1:], strict=True))
    out = {
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
    if along is not None:
        out["along"] = {name: against(c, stability.threshold) for name, c in quotients.items()}
    return out


def direction_vector(op: HessianOperator, direction: dict[Any, Tensor] | str) -> Tensor:
    """A flat direction: "gradient" (∇L on the operator's batch), or tensors keyed by parameter name or
    by ``id(param)`` (parameters without an entry count as 0)."""
    if isinstance(direction, str):
        if direction != "gradient":
            raise ValueError(f"curvature: direction={direction!r}; give 'gradient' or tensors")
        return op.gradient()
    by_name = dict(zip(op.names, op.params, strict=True))
    by_id = {}
    for key, t in direction.items():
        if isinstance(key, str):
            if key not in by_name:
                raise ValueError(f"curvature: {key!r} is not a trainable parameter; names: {op.names[:5]} …")
            by_id[id(by_name[key])] = t
        else:
            by_id[key] = t
    return op.flatten_by_param(by_id)


def in_operator_space(d: Tensor, scale: Tensor | None) -> Tensor:
    """The direction d as a vector of A = D H D: w = d / D, so that wᵀAw / wᵀw = dᵀHd / dᵀPd (P = D⁻²);
    d itself when A = H."""
    return d if scale is None else d / scale


def against(curvature: float, threshold: float | None) -> dict[str, float | None]:
    """``{"curvature", "ratio"}``: a curvature and its ratio to the threshold (None without one)."""
    return {"curvature": curvature, "ratio": curvature / threshold if threshold else None}


def _usable(init: Tensor | None, size: int) -> bool:
    return init is not None and init.numel() == size and bool(torch.isfinite(init).all()) and bool(init.any())
