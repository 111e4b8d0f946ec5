r"""Sharpness: the top eigenvalues of the loss Hessian, preconditioned by the optimizer when it has one.

Without an optimizer, or with SGD, the sharpness is λ₁(H). With an Adam-family optimizer it is the
*preconditioned* sharpness λ₁(P⁻¹H), P = diag(√v̂ + ε) from the optimizer's state (and with param groups at
different lrs η_g, P⁻¹ carries η_g/η_max, SGD's then being diag(η_g/η_max): ``thresholds.py``), computed as the
top eigenvalue of the symmetric D H D with D = P^{-1/2} (same eigenvalues as P⁻¹H, as it is similar to
it). Either is compared with the optimizer's stability threshold (``thresholds.py``): a ratio
λ₁/threshold above 1 means the step is unstable along the top eigenvector.

H is taken over the parameters whose stability the threshold speaks of, those the optimizer moves: the
ones in its param groups that require grad and, once an Adam-family optimizer has stepped, hold its state
(a parameter that never had a gradient is not moved, and has no P). Without an optimizer, over every
parameter that requires grad; the others are constants.

With an optimizer, H is the Hessian of the objective its step descends (``Objective``), which is the loss's
but for two cases. An optimizer with ``maximize=True`` descends −L, so its stability is that of −H: the
eigenvalues are those of −H (or P⁻¹(−H)), and a loss it is climbing towards a maximum shows positive
curvature, as L's does under a minimising optimizer (param groups that mix maximize=True and False get no
threshold). Coupled L2 weight decay λ (SGD's, Adam's without decoupling, ``AdamL2``) adds λθ to the gradient
each step, so H + λI takes H's place: preconditioned, P⁻¹λ is large wherever v̂ is small, and leaving it out
can understate the ratio several-fold. Decoupled decay (AdamW's, SGD's with ``decoupled_weight_decay``) adds
its shift cλ to the eigenvalues the threshold bounds (``thresholds.py``): 19λ for AdamW at β₁ = 0.9,
negligible beside 38/η in practice; λ for SGD without momentum, whose steps are then those of coupled decay.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import SEEDS, is_count, is_number, is_seed, require_optimizer
from ..optim.adam import adam_steps
from .hvp import HessianOperator, LossFn, unwrap
from .lanczos import lanczos
from .thresholds import (
    Stability,
    adam_family,
    inner_optimizer,
    inverse_preconditioner,
    moving_groups,
    stability_threshold,
    step_scales,
    weight_decay,
)


def moved_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters whose stability the optimizer's threshold speaks of: those it moves — in its param
    groups at lr > 0 (``moving_groups``), requiring grad, and, for an Adam-family optimizer that has stepped,
    holding its state (a parameter that never had a gradient, an unused head, is not moved). Before the first
    step no parameter has state, and all of those are returned (``operator`` then measures H)."""
    params = [p for group in moving_groups(optimizer) for p in group["params"] if p.requires_grad]
    if not params:  # every one frozen: say so, not that the optimizer is another model's
        held = [p for group in optimizer.param_groups for p in group["params"]]
        require_optimizer_of(model, optimizer, held, "curvature")
        raise ValueError(
            f"curvature: every parameter of the {type(optimizer).__name__} is frozen (requires_grad False): it moves "
            "nothing to take the Hessian over; unfreeze the parameters to measure"
        )
    require_optimizer_of(model, optimizer, params, "curvature", "parameters that require grad")
    stepped = [p for p in params if adam_steps(optimizer.state.get(p, {})) > 0] if adam_family(optimizer) else []
    return stepped or params


def require_optimizer_of(
    model: nn.Module, optimizer: torch.optim.Optimizer, params: list[Tensor], who: str, what: str = "parameters"
) -> None:
    """A ValueError (from ``who``) when none of ``params`` (``optimizer``'s ``what``) is a parameter of
    ``model`` inside its wrappers: the optimizer of another model would measure nothing."""
    if not isinstance(model, nn.Module):  # before reading its parameters: the same refusal as without an optimizer
        raise TypeError(f"{who}: model={model!r} is not a torch.nn.Module")
    inner = unwrap(model)
    mine = {id(p) for p in inner.parameters()}
    if not any(id(p) in mine for p in params):
        raise ValueError(
            f"{who}: none of the {type(optimizer).__name__}'s {what} is a parameter of the model "
            f"({type(inner).__name__}); give the optimizer that trains this model"
        )


@dataclass(frozen=True)
class Objective:
    r"""What one step of the optimizer descends, as the curvature instruments see it.

    The objective is J = s·L + ½ Σ λ_p ‖θ_p‖², with s = −1 for an optimizer with ``maximize=True`` (it
    descends −L) and λ_p the *coupled* L2 weight decay of parameter p's group — the λθ an optimizer adds to
    the gradient before its step (torch's and our SGD, Adam without decoupling, ``AdamL2``), which its
    moments and its preconditioner see as part of the gradient. ``matvec`` is v ↦ A v with
    A = D ∇²J D + C, D = P^{-1/2} for a preconditioned optimizer that has stepped (``scale``), else D = I, and
    C the diagonal of decoupled decay's shifts c·s_p·λ_p (``thresholds.weight_decay``; s_p, the group's step
    scale: ``step_scales``): the matrix whose top eigenvalue the optimizer's threshold bounds. ``op`` is the
    loss's own ``HessianOperator``.
    """

    op: HessianOperator
    stability: Stability
    sign: float = 1.0
    decay: Tensor | None = None  # coupled λ_p per entry, flat; None without
    scale: Tensor | None = None
    shift: Tensor | None = None  # decoupled c·s_p·λ_p per entry, flat; None without

    def hessian(self, v: Tensor) -> Tensor:
        """∇²J v = s·H v + λ ⊙ v."""
        hv = self.op(v) if self.sign > 0 else -self.op(v)
        return hv if self.decay is None else hv + self.decay * v

    def matvec(self, v: Tensor) -> Tensor:
        """A v = D ∇²J D v + C v."""
        av = self.hessian(v) if self.scale is None else self.scale * self.hessian(self.scale * v)
        return av if self.shift is None else av + self.shift * v

    def gradient(self) -> Tensor:
        """∇J = s·∇L + λ ⊙ θ on the operator's batch, flat: the gradient the optimizer's step sees."""
        g = self.op.gradient() * self.sign
        return g if self.decay is None else g + self.decay * self.op.flatten(self.op.theta)


def operator(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    optimizer: torch.optim.Optimizer | None,
    dtype: torch.dtype | None,
) -> Objective:
    """The ``Objective`` of ``optimizer`` (the loss itself without one), over the parameters it moves."""
    stability = stability_threshold(optimizer)
    if optimizer is None:
        return Objective(HessianOperator(model, loss_fn, batch, dtype=dtype), stability)
    optimizer = inner_optimizer(optimizer)  # as stability_threshold reads it: a wrapper's type says nothing here
    op = HessianOperator(model, loss_fn, batch, dtype=dtype, params=moved_parameters(model, optimizer))
    groups = moving_groups(optimizer)
    maximizing = {bool(g.get("maximize", False)) for g in groups}
    if len(maximizing) > 1:
        why = f"{type(optimizer).__name__}'s param groups mix maximize=True and False: H of neither objective"
        stability = Stability(None, stability.label, stability.preconditioned, why)
    sign = -1.0 if maximizing == {True} else 1.0
    decays = {id(p): weight_decay(optimizer, g) for g in groups for p in g["params"]}
    scales = {id(p): s for g, s in zip(groups, step_scales(groups), strict=True) for p in g["params"]}
    decay = per_entry(op, {i: d.coupled for i, d in decays.items()})
    shift = per_entry(op, {i: d.shift * scales[i] for i, d in decays.items()})
    if not stability.preconditioned:
        return Objective(op, stability, sign, decay, shift=shift)
    try:
        parts = {id(p): inverse_preconditioner(optimizer, p, scales[id(p)]).sqrt() for p in op.params}
    except KeyError:  # no threshold without P, and the shifts are in P⁻¹H's units: H of J alone
        why = f"{type(optimizer).__name__} has no state yet (before its first step): H, not P⁻¹H"
        return Objective(op, Stability(None, stability.label, False, why), sign, decay)
    return Objective(op, stability, sign, decay, scale=op.flatten_by_param(parts), shift=shift)


def per_entry(op: HessianOperator, values: dict[int, float]) -> Tensor | None:
    """A flat vector holding, on each parameter's entries, its value in ``values`` (keyed by ``id(param)``;
    0 when missing) in the operator's dtype; None when all are 0."""
    if not any(values.get(id(p), 0.0) for p in op.params):
        return None
    return torch.cat(
        [
            torch.full((n,), values.get(id(p), 0.0), dtype=op.dtype, device=op.device)
            for p, n in zip(op.params, op.sizes, strict=True)
        ]
    )


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
    ``max_hvps`` Hessian-vector products (or one per start vector, where those are more), or, unconverged,
    when the residual stalls at the rounding floor of the dtype (``lanczos.py``). ``init`` warm-starts it
    (pass the previous call's ``vector``; one that is zero or not finite, from a diverged model, is not taken);
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
    if not is_seed(seed):
        raise ValueError(f"sharpness: seed={seed!r} must be {SEEDS} (a random seed)")
    if init is not None and not isinstance(init, Tensor):
        raise TypeError(
            f"sharpness: init is a {type(init).__name__}; give the previous call's vector (a tensor) or None"
        )
    if along is not None and not isinstance(along, Mapping):
        raise ValueError(
            f"sharpness: along={along!r}; give a dict naming directions, e.g. {{'gradient': 'gradient'}}, or None"
        )
    if optimizer is not None:
        require_optimizer(optimizer, "sharpness")
    objective = operator(model, loss_fn, batch, optimizer, dtype)
    op, stability = objective.op, objective.stability
    if k > op.size:
        raise ValueError(f"sharpness: k={k} exceeds the {op.size} parameters H is taken over")
    if not is_count(max_hvps, k):
        raise ValueError(f"sharpness: max_hvps={max_hvps!r} must be an integer >= k={k}")
    if init is not None and init.numel() != op.size:  # a warning, not an error: a monitor's warm start meets
        # this in a healthy run, where the optimizer starts moving parameters it did not move before (unfrozen)
        warnings.warn(
            f"sharpness: init has {init.numel()} entries, but H is taken over {op.size} parameters (another model's "
            "vector, or the parameters the optimizer moves changed); starting from a random vector instead",
            stacklevel=2,
        )
        init = None
    generator = torch.Generator().manual_seed(seed)
    start = init.reshape(-1).to(op.dtype).to(op.device) if _usable(init) else op.random(generator)
    # k − 1 random vectors more: a single start vector sees one vector of each eigenspace, so an eigenvalue
    # repeated among the top k would show once
    extra = [op.random(generator) for _ in range(min(k, op.size) - 1)]
    directions = {
        name: in_operator_space(direction_vector(objective, d, f"along[{name!r}]"), objective.scale)
        for name, d in (along or {}).items()
    }
    rows = [start, *extra, *directions.values()]
    result = lanczos(objective.matvec, torch.stack(rows), k=k, tol=tol, max_steps=max(max_hvps, len(rows)))
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


def direction_vector(objective: Objective, direction: dict[Any, Tensor] | str, called: str = "direction") -> Tensor:
    """A flat direction: "gradient" (the objective's gradient on the operator's batch: ∇L, with coupled weight
    decay ∇L + λθ), or tensors keyed by parameter name or by ``id(param)`` (parameters without an entry
    count as 0, and entries of parameters H is not taken over are left out). ``called``: how an error names the
    argument (``along['x']`` for one of several)."""
    if isinstance(direction, str):
        if direction != "gradient":
            raise ValueError(f"curvature: {called}={direction!r}; give 'gradient' or tensors")
        return objective.gradient()
    op = objective.op
    if not isinstance(direction, Mapping):
        raise ValueError(
            f"curvature: {called} is of type {type(direction).__name__}; give 'gradient' or a dict of tensors keyed "
            "by parameter name or id(param)"
        )
    by_name = {**op.wrapped_names, **dict(zip(op.names, op.params, strict=True))}
    ids = {id(p) for p in op.params}
    by_id = {}
    for key, t in direction.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"curvature: the direction's {key!r} is a {type(t).__name__}; give a tensor per parameter")
        if isinstance(key, str):
            if key in by_name:
                by_id[id(by_name[key])] = t
            elif key not in op.model_names:  # one of the model's that H is not taken over (frozen, not moved) is 0
                raise ValueError(f"curvature: {key!r} is not a parameter of the model; names: {op.names[:5]} …")
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


def _usable(init: Tensor | None) -> bool:
    """A warm start to take: a vector of a previous measurement that was not zero or non-finite (one of a
    diverged model)."""
    return init is not None and bool(torch.isfinite(init).all()) and bool(init.any())
