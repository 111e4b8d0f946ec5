r"""Each optimizer's stability threshold, read from its current hyperparameters and state.

On a quadratic with Hessian H, an optimizer with a fixed (pre)conditioner is a linear map, stable iff
every eigenvalue of its iteration matrix lies inside the unit circle. Along an eigenvector with
eigenvalue λ of the relevant matrix this gives (Cohen et al., ICLR 2021; Cohen et al., 2022,
"Adaptive Gradient Methods at the Edge of Stability"):

    gradient descent, step η                    λ(H) < 2/η
    heavy-ball momentum β (torch's SGD)         λ(H) < (2 + 2β)/η          (dampening τ: η → η(1 − τ))
    Nesterov momentum β (torch's SGD)           λ(H) < (2 + 2β)/((1 + 2β)η)
    Adam / AdamW / Adam+L2, β₁                  λ(P⁻¹H) < (2 + 2β₁)/((1 − β₁)η),  P = diag(√v̂ + ε)

where v̂ = v/(1 − β₂ᵗ) is the bias-corrected second moment in the optimizer's state (``max_exp_avg_sq``
with AMSGrad). For β₁ = 0.9 Adam's threshold is 38/η. The analysis freezes P, and leaves out m̂'s bias
correction 1/(1 − β₁ᵗ) (within 1 % of 1 after 44 steps at β₁ = 0.9).

Weight decay λ enters the same linear maps (``weight_decay``), and the sharpness takes it into the matrix
whose top eigenvalue it reports (``sharpness.py``), so that the thresholds above stand as they are. Coupled
decay (SGD's, Adam+L2: λθ added to the gradient) turns H into H + λI. Decoupled decay, θ ← (1 − ηλ)θ − η d
for a step direction d = β b + (1 − τ) g (heavy ball with dampening τ; Adam: d = P⁻¹m̂, τ = β₁), gives the
iteration matrix [[1 − ηλ − η(1 − τ)h, −ηβ], [(1 − τ)h, β]] along an eigenvector with eigenvalue h of H (of
P⁻¹H), whose eigenvalue −1 lies at h + λ(1 + β)/(1 − τ) = (2 + 2β)/((1 − τ)η): the condition is the
threshold above for h + cλ, c = (1 + β)/(1 − τ) — 1 without momentum (the same steps as coupled decay), 19
for AdamW at β₁ = 0.9 — and c = (1 + β)/(1 + 2β) for Nesterov momentum. With λ differing between param
groups the eigenvectors differ too, but the Schur complement of the map (θ, m) ↦ (θ′, m′) + (θ, m) shows the
eigenvalue −1 still lies exactly where D H D + diag(cλ) has an eigenvalue at the threshold (tested).

Param groups at different learning rates η_g (with the same betas, momentum, dampening and Nesterov flag)
share one threshold too: η_g = η_max·s_g, with η_max the largest lr of a group a step moves, makes each step
that of one optimizer at η_max whose preconditioner carries the factor s_g, P⁻¹ → s_g P⁻¹ (P = I for SGD),
and whose decoupled decay is s_g λ_g. The threshold is then the formula above at η_max ("2/η_max",
"38/η_max"), and it bounds the top eigenvalue of that P⁻¹H (``preconditioned``; tested against torch's own
SGD and Adam diverging just above it and converging just below).

For optimizers without such a linear analysis (Lion and Muon are sign / orthogonalising maps, RMSprop
and others are not covered here) the threshold is None with the reason — never a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import is_optimizer, require_optimizer
from ..optim import SGD, Adam
from ..optim.adam import adam_denominator, adam_steps

_SGD_TYPES = (SGD, torch.optim.SGD)
_ADAM_TYPES = (Adam, torch.optim.Adam)  # ours covers AdamW and AdamL2, torch's covers its AdamW


@dataclass(frozen=True)
class Stability:
    """An optimizer's stability threshold now: its value, its formula in η and what it bounds.

    What [`stability_threshold`][optiscope.curvature.stability_threshold] returns: the (preconditioned)
    sharpness λ₁ must stay below ``threshold`` for the step to be stable; ``label`` says which formula in η gave
    it. Immutable: a snapshot of the optimizer's settings when read (read again after a scheduler steps).

    Args:
        threshold: the value that λ₁(H), or λ₁(P⁻¹H) when ``preconditioned``, must stay below (in units of
            1/η); None where no linear analysis applies or the settings allow none.
        label: the formula in η, e.g. "2/η", "3.8/η" or "38/η" ("38/η_max" for param groups at different
            lrs); "" without a threshold.
        preconditioned: whether it bounds λ(P⁻¹H) (Adam's P, or the groups' lr ratios η_g/η_max) rather than
            λ(H).
        reason: why there is no threshold; None when there is one.

    Examples:
        >>> import torch
        >>> from optiscope.curvature import Stability, stability_threshold
        >>> sgd = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> stability_threshold(sgd)
        Stability(threshold=20.0, label='2/η', preconditioned=False, reason=None)
        >>> Stability(None, "", False, "no optimizer given").threshold is None
        True
    """

    threshold: float | None
    label: str
    preconditioned: bool
    reason: str | None = None


def _shared(groups: list[dict], read: dict[str, Any], name: str) -> tuple[tuple | None, str | None]:
    """(the settings ``read`` takes from each group — {field: function of the group} —, None) when every group
    has the same; else (None, a reason naming each field that differs and its values)."""
    if not groups:  # every parameter frozen
        return None, f"{name} moves no parameter (none of its groups holds one that requires grad)"
    values = {f: sorted({get(g) for g in groups}) for f, get in read.items()}
    differing = [f"{f} ({vs})" for f, vs in values.items() if len(vs) > 1]
    if differing:
        return None, f"{name}'s param groups have different {' and '.join(differing)}; no single threshold"
    return tuple(vs[0] for vs in values.values()), None


def coefficient(c: float) -> str:
    """The threshold's coefficient c of c/η as its label writes it: three significant digits, never in
    exponent form (Adam at β₁ = 0.999 has 3998/η, not 4e+03/η)."""
    return f"{c:.3g}" if c < 1000 else f"{c:.0f}"


def label(coef: float, lrs: list[float]) -> str:
    """The threshold's formula: c/η, or c/η_max when the groups' ``lrs`` differ (the threshold is then at the
    largest)."""
    return f"{coefficient(coef)}/η" + ("_max" if len(set(lrs)) > 1 else "")


def step_scales(groups: list[dict]) -> list[float]:
    """s_g = η_g/η_max for each of ``groups`` (those a step moves): the factor by which a group's steps are
    smaller than at the largest lr, which the preconditioner and decoupled decay carry (module docstring).
    1 for every group when the largest lr is not > 0 (no threshold then) or a group has no lr to read."""
    lrs = [g.get("lr") for g in groups]
    if any(lr is None for lr in lrs):
        return [1.0] * len(groups)
    largest = max((float(lr) for lr in lrs), default=0.0)
    return [float(lr) / largest if largest > 0 else 1.0 for lr in lrs]


def inner_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside a library's wrapper that forwards its ``param_groups`` (🤗 Accelerate's
    ``AcceleratedOptimizer`` holds it as ``.optimizer``): its type says which threshold and preconditioner apply,
    the wrapper's does not. ``optimizer`` itself when it wraps none."""
    while not isinstance(optimizer, _SGD_TYPES + _ADAM_TYPES):
        inner = getattr(optimizer, "optimizer", None)
        if inner is optimizer or not (is_optimizer(inner) and inner.param_groups is optimizer.param_groups):
            return optimizer
        optimizer = inner
    return optimizer


def stability_threshold(optimizer: torch.optim.Optimizer | None) -> Stability:
    """The stability threshold of an optimizer, from its current learning rates and betas.

    On a quadratic with a fixed preconditioner an optimizer is a linear map, stable while every eigenvalue λ of
    H (of P⁻¹H for Adam) stays below (Cohen et al., 2021, 2022):

    | optimizer | stable while | label at the usual β |
    |---|---|---|
    | gradient descent, step η | λ(H) < 2/η | "2/η" |
    | heavy ball, momentum β, dampening τ | λ(H) < (2 + 2β)/((1 − τ)η) | "3.8/η" (β = 0.9) |
    | Nesterov, momentum β | λ(H) < (2 + 2β)/((1 + 2β)η) | "1.36/η" (β = 0.9) |
    | Adam, AdamW, Adam+L2, β₁ | λ(P⁻¹H) < (2 + 2β₁)/((1 − β₁)η), P = diag(√v̂ + ε) | "38/η" (β₁ = 0.9) |

    For optimizers without such an analysis (Lion, Muon, RMSprop, anything else) the threshold is None with the
    reason, never a made-up number.

    Args:
        optimizer: the optimizer (optiscope's or torch.optim's ``SGD``, ``Adam``, ``AdamW``, ``AdamL2``, any
            other, or a wrapper that forwards its ``param_groups``); None gives no threshold.

    Returns:
        [`Stability`][optiscope.curvature.Stability] with the threshold (None with a ``reason`` where there
            is none), its label and whether it bounds P⁻¹H.

    Raises:
        TypeError: ``optimizer`` is neither None nor an optimizer (``param_groups``, ``state``, ``step``).

    Examples:
        >>> import torch
        >>> from optiscope.curvature import stability_threshold
        >>> params = list(torch.nn.Linear(2, 1).parameters())
        >>> stability_threshold(torch.optim.SGD(params, lr=0.1)).threshold
        20.0
        >>> s = stability_threshold(torch.optim.SGD(params, lr=0.1, momentum=0.9))
        >>> round(s.threshold, 6), s.label
        (38.0, '3.8/η')
        >>> s = stability_threshold(torch.optim.Adam(params, lr=0.01))
        >>> round(s.threshold, 6), s.label, s.preconditioned
        (3800.0, '38/η', True)
        >>> from optiscope.optim import Lion
        >>> stability_threshold(Lion(params, lr=1e-4)).reason
        'no known stability threshold for Lion'

    Notes:
        - **Current hyperparameters.** The lr is read now, so schedules are followed; a tensor lr is read as
          its value. The analysis freezes P and leaves out m̂'s bias correction 1/(1 − β₁ᵗ) (within 1 % of 1
          after 44 steps at β₁ = 0.9). Tested by running ``torch.optim.SGD`` (plain, heavy ball, Nesterov) on a
          quadratic at 0.97× and 1.03× of the thresholds: below converges, above diverges, and for GD the
          instrument flags ratio 1.03 before the first step, while the loss has not yet doubled.
        - **Which param groups count.** Those a step moves: holding a parameter that requires grad, at η > 0.
          A frozen group, or one at η = 0 beside groups that move, does not count (when none has η > 0, a
          warm-up's first step from 0, all trainable ones do), nor, once an Adam-family optimizer has stepped,
          a group none of whose parameters holds its state (an unused head in a group of its own at another
          η). Groups whose momentum, dampening, Nesterov flag or β₁ differ get no threshold.
        - **Groups at different η_g** (layer-wise rates, LoRA+, a head at 10×) share the threshold at the
          largest, labelled e.g. "2/η_max" or "38/η_max", and ``preconditioned`` is True for SGD too: a group's
          step is that of η_max with s = η_g/η_max folded into P⁻¹ (P = I for SGD) and into its decoupled
          decay. Tested against ``torch.optim.SGD`` (plain, heavy ball, Nesterov) with two coupled groups at lr
          ratios 1/4 and 3, diverging at 1.03× and converging at 0.97× of the measured edge, where λ₁(H) against
          2/η_max would put it over 20 % off; and for AdamW with two groups at different η and decay against P
          built by hand and against the update's (θ, m) map written out with P frozen.
        - **Wrappers and special lrs.** An optimizer inside a wrapper that forwards its ``param_groups`` (🤗
          Accelerate's ``AcceleratedOptimizer``) is read as the one it wraps (P⁻¹H and 38/η for a wrapped Adam).
          One without a fixed η in its groups (🤗 Adafactor's ``lr=None``) gets no threshold, with the reason,
          and the sharpness of H. P does not depend on η, so at η = 0 (a warm-up's first step) Adam's sharpness
          is still preconditioned, with no threshold. Dampening τ = 1 without Nesterov gives an infinite
          threshold (the buffer takes no gradient after the first step).
        - **Weight decay** does not move the threshold: [`sharpness`][optiscope.curvature.sharpness] adds it to
          the matrix whose top eigenvalue it reports (λI for coupled decay, cλ for decoupled decay).
    """
    if optimizer is None:
        return Stability(None, "", False, "no optimizer given")
    require_optimizer(optimizer, "stability_threshold")
    optimizer = inner_optimizer(optimizer)
    name = type(optimizer).__name__
    groups = moving_groups(optimizer)
    if isinstance(optimizer, _SGD_TYPES):
        setting, why = _shared(
            groups,
            {
                "momentum": lambda g: float(g["momentum"]),
                "dampening": lambda g: float(g["dampening"]),
                "nesterov": lambda g: bool(g["nesterov"]),
            },
            name,
        )
        if setting is None:
            return Stability(None, "", False, why)
        mu, tau, nesterov = setting
        lrs = [float(g["lr"]) for g in groups]
        lr = max(lrs)
        if lr <= 0:
            return Stability(None, "", False, f"{name} has lr={lr}")
        if mu == 0:
            coef = 2.0
        elif nesterov:
            coef = (2 + 2 * mu) / (1 + 2 * mu)
        else:
            coef = (2 + 2 * mu) / (1 - tau) if tau < 1 else float("inf")
        return Stability(coef / lr, label(coef, lrs), len(set(lrs)) > 1)
    if isinstance(optimizer, _ADAM_TYPES):
        setting, why = _shared(groups, {"beta1": lambda g: float(g["betas"][0])}, name)
        if setting is None:
            return Stability(None, "", True, why)
        (beta1,) = setting
        lrs = [float(g["lr"]) for g in groups]
        lr = max(lrs)
        if lr <= 0 or beta1 >= 1:
            return Stability(None, "", True, f"{name} has lr={lr}, beta1={beta1}")
        coef = (2 + 2 * beta1) / (1 - beta1)
        return Stability(coef / lr, label(coef, lrs), True)
    return Stability(None, "", False, f"no known stability threshold for {name}")


def moving_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The param groups a step moves: holding a parameter that requires grad, at lr > 0. A frozen group, or one
    at lr 0 (a way to freeze), moves nothing a step could destabilise. When no group has lr > 0 (a warm-up's
    first step from 0) all that hold a trainable parameter are returned. Once an Adam-family optimizer has
    stepped, a group none of whose parameters holds its state (an unused head in a group of its own, never
    given a gradient) is not moved either, and its lr does not count (the sharpness leaves it out of H)."""
    trainable = [g for g in optimizer.param_groups if any(p.requires_grad for p in g["params"])]
    moving = [g for g in trainable if _moves(g)] or trainable
    if not isinstance(optimizer, _ADAM_TYPES):
        return moving
    stepped = [g for g in moving if any(adam_steps(optimizer.state.get(p, {})) > 0 for p in g["params"])]
    return stepped or moving


def _moves(group: dict) -> bool:
    """Whether a step moves ``group`` by its lr: lr > 0, or no lr to read (missing, or None: Adafactor's
    relative step size, which it computes itself)."""
    lr = group.get("lr")
    return lr is None or float(lr) > 0


@dataclass(frozen=True)
class Decay:
    """A param group's weight decay as the stability analysis sees it: ``coupled``, the λ of an L2 term λθ
    added to the gradient (λI joins H, before any preconditioning); ``shift``, cλ for decoupled decay, added
    to the eigenvalues of H (of P⁻¹H) that the threshold bounds."""

    coupled: float = 0.0
    shift: float = 0.0


def weight_decay(optimizer: torch.optim.Optimizer, group: dict) -> Decay:
    """``group``'s weight decay in ``optimizer``'s stability analysis (module docstring); none for optimizers
    without a threshold here."""
    lam = float(group.get("weight_decay", 0.0))
    if lam == 0 or not isinstance(optimizer, _SGD_TYPES + _ADAM_TYPES):
        return Decay()
    decoupled = bool(group.get("decoupled_weight_decay", False)) or isinstance(optimizer, torch.optim.AdamW)
    if not decoupled:
        return Decay(coupled=lam)
    if isinstance(optimizer, _ADAM_TYPES):
        beta = float(group["betas"][0])
        return Decay(shift=lam * (1 + beta) / (1 - beta))
    mu, tau = float(group["momentum"]), float(group["dampening"])
    if mu == 0:
        return Decay(shift=lam)
    if tau >= 1 and not group["nesterov"]:  # the buffer takes no gradient after the first step: the threshold is
        return Decay()  # infinite (``stability_threshold``), and no shift of H can reach it
    return Decay(shift=lam * (1 + mu) / (1 + 2 * mu) if group["nesterov"] else lam * (1 + mu) / (1 - tau))


def adam_family(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (the one inside a wrapper: ``inner_optimizer``) preconditions by Adam's
    P = diag(√v̂ + ε)."""
    return isinstance(inner_optimizer(optimizer), _ADAM_TYPES)


def inverse_preconditioner(optimizer: torch.optim.Optimizer, param: Tensor, step_scale: float = 1.0) -> Tensor:
    """P⁻¹ for ``param``, whose group's steps carry ``step_scale`` (``step_scales``): s/(√v̂ + ε) for an
    Adam-family optimizer, from its state (KeyError for a param not in it or before its first step; independent
    of η, so defined at η = 0 too, a warm-up from 0), s elsewhere."""
    if not adam_family(optimizer):
        return torch.full_like(param, step_scale)
    _, denominator = adam_denominator(optimizer.state, optimizer.param_groups, param)
    return step_scale / denominator
