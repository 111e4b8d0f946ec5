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
    """Top eigenvalues of the loss Hessian, preconditioned as the optimizer sees it.

    For SGD, or without an optimizer, these are the k largest eigenvalues λ₁ ≥ … ≥ λ_k of H, the Hessian of
    L(θ) = ``loss_fn(model, batch)``; for Adam-family optimizers those of P⁻¹H, P = diag(√v̂ + ε) from the
    optimizer's state. λ₁ is compared with the optimizer's threshold
    ([`stability_threshold`][optiscope.curvature.stability_threshold]: 2/η for GD, 38/η for Adam at β₁ = 0.9):
    ``ratio`` = λ₁/threshold above 1 means the step is unstable along the top eigenvector. Found by Lanczos with
    full reorthogonalisation on Hessian-vector products H v = ∇⟨∇L, v⟩, without forming H.

    Args:
        model: the module whose parameters span H (DDP, DataParallel and ``torch.compile`` wrappers are
            unwrapped).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss (a mean over the batch).
        batch: what ``loss_fn`` takes, held fixed: a tensor, or tuples, named tuples, lists and mappings (a 🤗
            ``BatchEncoding``) of tensors, on the model's device.
        optimizer: the optimizer whose preconditioner, weight decay and threshold apply (optiscope's, torch's,
            or a wrapper that forwards its ``param_groups``); None for plain H and no threshold.
        k: how many of the largest eigenvalues to return; from 1 to the number of entries H is taken over.
        tol: relative residual ‖Ay − θy‖/|θ| at which each of the top k counts as converged; in (0, 1).
        max_hvps: the most Hessian-vector products to take; at least ``k`` (one per start vector is always
            taken).
        init: a warm start, the previous call's ``vector``. One that is zero or not finite (from a diverged
            model) is not taken; one of another length is not taken either, with a warning.
        seed: seed of the Gaussian start vectors, an integer from ``-2**63`` to ``2**64 - 1``.
        dtype: a floating dtype to evaluate in (``torch.float64`` for double precision); None keeps the model's.
        along: directions whose curvature to measure too, ``{name: "gradient" or {param name or id(param):
            tensor}}``, as [`directional_curvature`][optiscope.curvature.directional_curvature] takes them;
            None for none.

    Returns:
        A dict: ``eigenvalues`` (k floats, largest first), ``threshold`` (float, or None), ``label`` (the
            threshold's formula, e.g. "38/η"; "" without one), ``ratio`` (λ₁/threshold, or None),
            ``preconditioned`` (whether the eigenvalues are P⁻¹H's), ``reason`` (why there is no threshold; None
            with one), ``hvps`` (products taken), ``residuals`` (k relative residuals), ``converged`` (bool),
            ``vector`` (the top eigenvector, flat, for ``init``) and, with ``along``, ``along``:
            ``{name: {"curvature": float, "ratio": float or None}}``.

    Raises:
        ValueError: ``k``, ``tol``, ``seed``, ``max_hvps`` or ``along`` invalid, or ``k`` above the number of
            entries H is taken over; ``dtype`` not floating; a ``loss_fn`` that does not return a differentiable
            scalar; an empty batch, or one on another device than the model; a direction in ``along`` of the
            wrong shape or naming no parameter H is taken over; a model with no parameter that requires grad; an
            optimizer whose parameters are all frozen or are not the model's.
        TypeError: ``init`` not a tensor, ``optimizer`` not an optimizer, ``loss_fn`` not callable, or ``model``
            not an ``nn.Module`` (with an optimizer given, the last is an AttributeError today).

    Examples:
        On L = ½ Σ aᵢwᵢ², H = diag(a); SGD at η = 0.1 is stable below 2/η = 20:

        >>> import torch
        >>> from optiscope.curvature import sharpness
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> def loss_fn(m, a):
        ...     return 0.5 * (a * m.weight[0] ** 2).sum()
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> out = sharpness(model, loss_fn, torch.tensor([10.0, 1.0]), sgd, k=2)
        >>> [round(e, 4) for e in out["eigenvalues"]], out["label"], round(out["ratio"], 4), out["converged"]
        ([10.0, 1.0], '2/η', 0.5, True)

        After one Adam step, v̂ = g² and P⁻¹H = diag(aᵢ/|gᵢ|) (ε aside): at w = (1, 1), the identity.

        >>> with torch.no_grad():
        ...     _ = model.weight.fill_(1.0)
        >>> adam = torch.optim.Adam(model.parameters(), lr=0.01)
        >>> loss_fn(model, torch.tensor([10.0, 1.0])).backward()
        >>> adam.step()
        >>> out = sharpness(model, loss_fn, torch.tensor([10.0, 1.0]), adam, init=out["vector"])
        >>> round(out["eigenvalues"][0], 4), out["preconditioned"], out["label"]
        (1.0, True, '38/η')

    Notes:
        - **Which eigenvalues.** The k largest algebraic ones: at a saddle λ₁ is the largest positive one, not
          the largest in magnitude, which no threshold bounds. With k > 1, k − 1 random vectors join the start
          block, so an eigenvalue repeated among the top k is found as often as it is repeated (one start
          vector sees one vector of each eigenspace; tested on quadratics with double, triple and zero
          eigenvalues).
        - **Which parameters.** H is taken over those the optimizer moves: in its groups at η > 0, requiring
          grad and, once an Adam-family optimizer has stepped, holding its state (an unused head, or a group
          frozen at η = 0, is left out). A tensor it moves that the model does not hold (a learnable weight of
          the loss, reached through ``loss_fn``'s closure) is in H too, in its own dtype: under
          ``dtype=torch.float64`` a float32 one stays float32, and a warning says so (tested against the exact
          Hessian over both). Without an optimizer, every parameter of the model that requires grad. The others
          are constants.
        - **The preconditioner.** P⁻¹H for Adam, AdamW and Adam+L2 (optiscope's and torch.optim's), with v̂ the
          bias-corrected second moment (``max_exp_avg_sq`` with AMSGrad), computed as the symmetric D H D,
          D = P^{-1/2}, which has the same eigenvalues. Before Adam's first step there is no P: the eigenvalues
          are H's, with no threshold and a ``reason``. P does not depend on η, so at η = 0 (a warm-up's first
          step) they are still P⁻¹H's, without a threshold. Param groups at different η_g fold η_g/η_max into
          P⁻¹ (P = I for SGD): the result is then ``preconditioned`` for SGD too, against "2/η_max".
        - **The objective the step descends.** With ``maximize=True`` the spectrum is that of −H (−P⁻¹H;
          tested against torch's SGD diverging just above its threshold and converging just below); groups
          that mix maximize=True and False get no threshold. Coupled L2 decay λ (SGD's ``weight_decay``, Adam's
          without decoupling, ``AdamL2``) adds λθ to every gradient, so the spectrum is that of H + λI
          (P⁻¹(H + λI); λ per group) and ``"gradient"`` means ∇L + λθ. Left out, P⁻¹λ, large where v̂ is small,
          goes unseen: on the ``edge-of-stability`` student, full batch, ``adaml2`` at η = 0.001, λ = 0.1,
          after 2,000 steps the ratio is 0.98 with it against 0.11 for the loss's H alone
          (``benchmarks/curvature_weight_decay.py``; 0.54 against 0.04 at step 500). Decoupled decay (AdamW's,
          optiscope SGD's ``decoupled_weight_decay=True``) is not in the gradient but in the step's linear map,
          whose eigenvalue −1 lies where H + cλ (P⁻¹H + cλ) reaches the same threshold, so cλ is added:
          c = (1 + β₁)/(1 − β₁) = 19 for AdamW at β₁ = 0.9 (negligible beside 38/η at usual λ), 1 for SGD
          without momentum (its steps are then coupled decay's), (1 + β)/(1 − τ) for heavy ball with dampening
          τ, (1 + β)/(1 + 2β) for Nesterov (derived in ``curvature/thresholds.py``). Tested: torch's SGD at
          λ = 2 on ½xᵀdiag(10, 1)x diverges at 2/η = 11 (the loss's 10 would call it stable) and converges at
          13; against eig(D(H + Λ)D) from a hand-built ``torch.optim.Adam`` state with decay on one group;
          optiscope's SGD diverges at 0.95× and converges at 1.05× of the decoupled thresholds in all four
          cases; AdamW with decay on one group against the update's (θ, m) map written out with P frozen, which
          has an eigenvalue −1 at the η where the sharpness meets 38/η, not where λ₁(P⁻¹H) alone would put it.
        - **The model is left as it was.** It is evaluated with ``torch.func.functional_call`` at copies of its
          parameters and buffers, in eval mode (dropout off) with the RNG forked: training is untouched (tested
          bit for bit), and a buffer the forward pass updates in place, a call counter say, updates a copy.
          Batch and instance norms that were training are the exception: they normalise by the batch's (each
          example's) own statistics, as in the loss the optimizer descends (eval mode's running averages make
          another function, far from it early in training), and leave their running statistics as they were
          (tested against the Hessian written out with each set of statistics). A ``SyncBatchNorm`` under an
          initialised process group uses its running statistics: its synchronising backward pass has no second
          derivative. A weight norm (``nn.utils.parametrizations.weight_norm`` or the older
          ``nn.utils.weight_norm``) is computed from ordinary ops: torch's fused kernel has a wrong second
          derivative (27 % off a finite difference on a small MLP, torch 2.13; tested for both). Works under
          ``torch.no_grad()`` and ``torch.inference_mode()``.
        - **Cost.** One forward and backward pass with ``create_graph=True`` gives the gradient and its graph;
          each product is then one backward pass through that graph: about 2 forward+backward passes on the
          ``lm`` GPT, against 4 for ``torch.func``'s jvp of grad, which redoes the forward and backward every
          time (``benchmarks/curvature_cost.py``).
        - **Precision.** ``dtype=torch.float64`` evaluates in double precision. With ``dtype=None`` the products
          run in the parameters' own dtypes and the Lanczos vectors in the widest of them and at least float32:
          a bfloat16 parameter among float32 ones does not round them to bfloat16, nor does a model wholly in
          float16 or bfloat16 round its eigenvalues to its dtype, at twice the memory of half-precision vectors
          (tested against the exact Hessian and a closed form). Rounded products stall the residual near a
          floor of about √n·ε: Lanczos then stops, unconverged (``converged`` False), once the residual is within
          100·√n·ε and 8 products brought no 10 % gain, so a ``tol`` finer than the dtype can resolve costs a
          few products more, not ``max_hvps`` (``benchmarks/curvature_cost.py`` prints where the float32 floor
          lies on the ``lm`` GPT). A residual r places an eigenvalue within r of the estimate, and within
          r²/gap once it is separated from the next.
        - **Warm starts.** ``init`` saves products while training moves slowly. Where the top two eigenvalues
          swapped since, the old vector lies near the new second eigenvector and Lanczos can settle on λ₂ with
          a small residual, which no residual test can tell from λ₁: a random start (``init=None``) is the
          check. None of the 750 warm-started measurements of the default ``edge-of-stability`` run did, each
          within 6.9e-4 of a cold start's float64 value at residual 1e-6, nor any of 20 on the ``lm`` GPT over
          2,000 AdamW steps as the monitor takes them by default (residual 1e-2, the update in the block), each
          within 1.1e-4 of a cold start of four vectors at residual 1e-4; both checked once by hand.
        - **Directions (``along``).** Tensors are keyed by parameter name (the model's, or its DDP or
          ``torch.compile`` wrapper's own "module." or "_orig_mod." names) or by ``id(param)``; parameters
          without an entry count as 0, and entries of parameters H is not taken over are left out. Each
          direction joins Lanczos's start block, so it costs the one product that also enlarges the search
          space; the eigenvalues are those found without them (tested against dᵀHd/dᵀPd from the exact Hessian
          and a hand-built Adam P).
        - **Tested against oracles**: the top-3 eigenvalues of small float64 MLPs against
          ``torch.func.hessian`` + ``eigvalsh`` to 1e-6 relative; the preconditioned spectrum against
          eig(P^{-1/2} H P^{-1/2}) built by hand from a ``torch.optim.Adam`` state; quadratics with a known
          spectrum.
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
