r"""Sharpness: the top eigenvalues of the loss Hessian, preconditioned by the optimizer when it has one.

Without an optimizer, or with SGD, the sharpness is λ₁(H). With an Adam-family optimizer it is the
*preconditioned* sharpness λ₁(P⁻¹H), P = diag(√v̂ + ε) from the optimizer's state, computed as the
top eigenvalue of the symmetric D H D with D = P^{-1/2} (same eigenvalues as P⁻¹H, as it is similar to
it). Either is compared with the optimizer's stability threshold (``thresholds.py``): a ratio
λ₁/threshold above 1 means the step is unstable along the top eigenvector.

H is taken over the parameters whose stability the threshold speaks of, those the optimizer moves: the
ones in its param groups that require grad and, once an Adam-family optimizer has stepped, hold its state
(a parameter that never had a gradient is not moved, and has no P). Without an optimizer, over every
parameter that requires grad; the others are constants.

An optimizer with ``maximize=True`` descends −L, so its stability is that of −H: the eigenvalues are those of
−H (or P⁻¹(−H)), and a loss it is climbing towards a maximum shows positive curvature, as L's does under a
minimising optimizer. Param groups that mix maximize=True and False get no threshold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import is_count, is_number, require_optimizer
from .hvp import HessianOperator, LossFn, unwrap
from .lanczos import lanczos
from .thresholds import Stability, inverse_preconditioner, moving_groups, stability_threshold


def moved_parameters(model: nn.Module, optimizer: torch.optim.Optimizer, preconditioned: bool) -> list[Tensor]:
    """The parameters whose stability the optimizer's threshold speaks of: those it moves — in its param
    groups at lr > 0 (``moving_groups``), requiring grad, and, for a ``preconditioned`` (Adam-family)
    optimizer that has stepped, holding its state (a parameter that never had a gradient, an unused head, is
    not moved). Before the first step no parameter has state, and all of those are returned (``operator``
    then measures H)."""
    params = [p for group in moving_groups(optimizer) for p in group["params"] if p.requires_grad]
    require_optimizer_of(model, optimizer, params, "curvature", "parameters that require grad")
    stepped = [p for p in params if "exp_avg_sq" in optimizer.state.get(p, {})] if preconditioned else []
    return stepped or params


def require_optimizer_of(
    model: nn.Module, optimizer: torch.optim.Optimizer, params: list[Tensor], who: str, what: str = "parameters"
) -> None:
    """A ValueError (from ``who``) when none of ``params`` (``optimizer``'s ``what``) is a parameter of
    ``model`` inside its wrappers: the optimizer of another model would measure nothing."""
    inner = unwrap(model)
    mine = {id(p) for p in inner.parameters()}
    if not any(id(p) in mine for p in params):
        raise ValueError(
            f"{who}: none of the {type(optimizer).__name__}'s {what} is a parameter of the model "
            f"({type(inner).__name__}); give the optimizer that trains this model"
        )


def operator(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    optimizer: torch.optim.Optimizer | None,
    dtype: torch.dtype | None,
) -> tuple[HessianOperator, Any, Tensor | None, Stability]:
    """(H over the parameters the optimizer moves, v ↦ A v, D or None, stability), where A = D H D with
    D = P^{-1/2} for a preconditioned optimizer that has stepped, else A = H; with ``maximize=True`` the
    optimizer descends −L, and −H takes H's place."""
    stability = stability_threshold(optimizer)
    params = None if optimizer is None else moved_parameters(model, optimizer, stability.preconditioned)
    op = HessianOperator(model, loss_fn, batch, dtype=dtype, params=params)
    maximizing = {bool(g.get("maximize", False)) for g in moving_groups(optimizer)} if optimizer else {False}
    hessian: Any = op if maximizing != {True} else (lambda v: -op(v))
    if len(maximizing) > 1:
        why = f"{type(optimizer).__name__}'s param groups mix maximize=True and False: H of neither objective"
        stability = Stability(None, stability.label, stability.preconditioned, why)
    if optimizer is None or not stability.preconditioned:
        return op, hessian, None, stability
    try:
        parts = {id(p): inverse_preconditioner(optimizer, p).sqrt() for p in op.params}
    except KeyError:
        why = f"{type(optimizer).__name__} has no state yet (before its first step): H, not P⁻¹H"
        return op, op, None, Stability(None, stability.label, False, why)
    scale = op.flatten_by_param(parts)
    return op, (lambda v: scale * hessian(scale * v)), scale, stability


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
    if not is_count(k):
        raise ValueError(f"sharpness: k={k!r} must be an integer >= 1")
    if not (is_number(tol) and 0 < tol < 1):
        raise ValueError(f"sharpness: tol={tol!r} must be a number in (0, 1) (a relative residual)")
    if not is_count(max_hvps, k):
        raise ValueError(f"sharpness: max_hvps={max_hvps!r} must be an integer >= k={k}")
    if optimizer is not None:
        require_optimizer(optimizer, "sharpness")
    op, matvec, scale, stability = operator(model, loss_fn, batch, optimizer, dtype)
    if k > op.size:
        raise ValueError(f"sharpness: k={k} exceeds the {op.size} parameters H is taken over")
    generator = torch.Generator().manual_seed(seed)
    start = init.to(op.dtype).to(op.device) if _usable(init, op.size) else op.random(generator)
    # k − 1 random vectors more: a single start vector sees one vector of each eigenspace, so an eigenvalue
    # repeated among the top k would show once
    extra = [op.random(generator) for _ in range(min(k, op.size) - 1)]
    directions = {name: in_operator_space(direction_vector(op, d), scale) for name, d in (along or {}).items()}
    rows = [start, *extra, *directions.values()]
    result = lanczos(matvec, torch.stack(rows), k=k, tol=tol, max_steps=max(max_hvps, len(rows)))
    top = result.eigenvalues[0]
    quotients = dict(zip(directions, result.start_quotients[1 + len(extra) :], strict=True))
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
    if not isinstance(direction, Mapping):
        raise ValueError(
            f"curvature: a direction of type {type(direction).__name__}; give 'gradient' or a dict of tensors keyed "
            "by parameter name or id(param)"
        )
    by_name = dict(zip(op.names, op.params, strict=True))
    ids = {id(p) for p in op.params}
    by_id = {}
    for key, t in direction.items():
        if isinstance(key, str):
            if key not in by_name:
                raise ValueError(f"curvature: {key!r} is not a trainable parameter; names: {op.names[:5]} …")
            by_id[id(by_name[key])] = t
        elif isinstance(key, int) and not isinstance(key, bool):
            by_id[key] = t  # ids of tensors H is not taken over (another module's, a frozen one's) count as 0
        else:
            raise ValueError(
                f"curvature: a direction keyed by a {type(key).__name__}; key it by parameter name or by id(param)"
            )
    if direction and not ids & by_id.keys():  # nothing of it lies in the space H acts on: no direction at all
        raise ValueError(
            f"curvature: none of the direction's {len(direction)} keys is a parameter H is taken over (those the "
            "optimizer moves, requiring grad); are they another model's?"
        )
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
