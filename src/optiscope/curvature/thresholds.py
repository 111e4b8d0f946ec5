r"""Each optimizer's stability threshold, read from its current hyperparameters and state.

On a quadratic with Hessian H, an optimizer with a fixed (pre)conditioner is a linear map, stable iff
every eigenvalue of its iteration matrix lies inside the unit circle. Along an eigenvector with
eigenvalue λ of the relevant matrix this gives (Cohen et al., ICLR 2021; Cohen et al., 2022,
"Adaptive Gradient Methods at the Edge of Stability"):

    gradient descent, step η                    λ(H) < 2/η
    heavy-ball momentum β (torch's SGD)         λ(H) < (2 + 2β)/η          (dampening τ: η → η(1 − τ))
    Nesterov momentum β (torch's SGD)           λ(H) < (2 + 2β)/((1 + 2β)η)
    Adam / AdamW / Adam+L2, β₁                  λ(P⁻¹H) < (2 + 2β₁)/((1 − β₁)η),  P = diag(√v̂ + ε)
    torch's NAdam, β₁, μ = μ_{t+1}, μ′ = μ_{t+2}    λ(P⁻¹H) < 2(1 + β₁)/(Dη),  D = (1 + β₁)(1 − μ) + (1 − β₁)μ′
    torch's RAdam, rectified (ρ_{t+1} > 5)      λ(P⁻¹H) < (2 + 2β₁)/((1 − β₁) r η),  P = diag((√v + ε)/√(1 − β₂ᵗ))
    torch's RAdam, its first steps (ρ ≤ 5)      λ(H) < (2 + 2β₁)/((1 − β₁)η)

where v̂ = v/(1 − β₂ᵗ) is the bias-corrected second moment in the optimizer's state (``max_exp_avg_sq``
with AMSGrad). For β₁ = 0.9 Adam's threshold is 38/η. The analysis freezes P, and leaves out m̂'s bias
correction 1/(1 − β₁ᵗ) (within 1 % of 1 after 44 steps at β₁ = 0.9).

NAdam steps θ ← θ − η((1 − μ)g + μ′m)/P with m ← β₁m + (1 − β₁)g and μ_s = β₁(1 − ½·0.96^{sψ}) (ψ its
``momentum_decay``). Along an eigenvector of P⁻¹H with eigenvalue h the map of (θ, m) has determinant
β₁(1 − ηh(1 − μ)) > −1 below the threshold, and its eigenvalue −1 where ηhD = 2(1 + β₁): the threshold above.
μ = μ′ = 0 gives 2/η; μ = μ′ = β₁ gives Nesterov's (2 + 2β₁)/((1 + 2β₁)(1 − β₁)η), and Adam is the map with
(1 − μ, μ′) = (0, 1), D = 1 − β₁. At ψ = 0.004, β₁ = 0.9 it is 3.49/η at the first step, 4.9/η after 3000 and
13.6/η far on: the threshold follows μ_t, read from the step count in the state; the factors 1/(1 − Πμ) that
correct the momentum's start are left out like m̂'s bias correction (Πμ ≤ β₁ᵗ). RAdam's rectified step is
Adam's at η·r_t, r_t = √((ρ_t − 4)(ρ_t − 2)ρ_∞/((ρ_∞ − 4)(ρ_∞ − 2)ρ_t)), ρ_∞ = 2/(1 − β₂) − 1, with ε outside
the bias correction; while ρ_t ≤ 5 (the first 5 steps at β₂ = 0.999, every step at β₂ ≤ 2/3) it is η m̂, heavy
ball with dampening β₁ on H itself. Each of these is tested on a quadratic with P frozen, against torch's own
optimizer: 1.1× above diverges, 0.9× below converges.

The threshold is given only for an optimizer whose step is one of these (``RULES``): its class, or a subclass
that keeps the class's ``step`` (and, for optiscope's, ``update_group``). A subclass that steps otherwise (a zoo's
Adam with its own ``step``) has no threshold, with the reason, rather than its parent's.

Weight decay λ enters the same linear maps (``weight_decay``), and the sharpness takes it into the matrix
whose top eigenvalue it reports (``sharpness.py``), so that the thresholds above stand as they are. Coupled
decay (SGD's, Adam+L2: λθ added to the gradient) turns H into H + λI. Decoupled decay, θ ← (1 − ηλ)θ − η d
for a step direction d = β b + (1 − τ) g (heavy ball with dampening τ; Adam: d = P⁻¹m̂, τ = β₁), gives the
iteration matrix [[1 − ηλ − η(1 − τ)h, −ηβ], [(1 − τ)h, β]] along an eigenvector with eigenvalue h of H (of
P⁻¹H), whose eigenvalue −1 lies at h + λ(1 + β)/(1 − τ) = (2 + 2β)/((1 − τ)η): the condition is the
threshold above for h + cλ, c = (1 + β)/(1 − τ) — 1 without momentum (the same steps as coupled decay), 19
for AdamW at β₁ = 0.9 — and c = (1 + β)/(1 + 2β) for Nesterov momentum; for NAdam and RAdam, whose decay is at η,
c = (1 + β₁)/D and (1 + β₁)/((1 − β₁)r): half the coefficient of c/η in each threshold. With λ differing between param
groups the eigenvectors differ too, but the Schur complement of the map (θ, m) ↦ (θ′, m′) + (θ, m) shows the
eigenvalue −1 still lies exactly where D H D + diag(cλ) has an eigenvalue at the threshold (tested).

Param groups at different learning rates η_g (with the same betas, momentum, dampening and Nesterov flag)
share one threshold too: η_g = η_max·s_g, with η_max the largest lr of a group a step moves, makes each step
that of one optimizer at η_max whose preconditioner carries the factor s_g, P⁻¹ → s_g P⁻¹ (P = I for SGD),
and whose decoupled decay is s_g λ_g. The threshold is then the formula above at η_max ("2/η_max",
"38/η_max"), and it bounds the top eigenvalue of that P⁻¹H (``preconditioned``; tested against torch's own
SGD and Adam diverging just above it and converging just below).

For optimizers without such a linear analysis (Lion and Muon are sign / orthogonalising maps, RMSprop,
Adamax, Adagrad and others are not covered here) the threshold is None with the reason — never a made-up number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import is_optimizer, require_optimizer
from ..optim import SGD, Adam
from ..optim.adam import adam_denominator, adam_steps
from .rules import known_class, radam_rectification

#: The optimizers whose step the analysis knows, and the rule of each. Ours covers AdamW and AdamL2, torch's Adam
#: its AdamW; any other subclass counts only where it keeps the known class's step (``known_class``).
RULES: dict[type, str] = {
    SGD: "sgd",
    torch.optim.SGD: "sgd",
    Adam: "adam",
    torch.optim.Adam: "adam",
    torch.optim.NAdam: "nadam",
    torch.optim.RAdam: "radam",
}
#: The rules with Adam-style state (``exp_avg_sq``, ``step``), which leave a parameter without a gradient unmoved.
ADAPTIVE = ("adam", "nadam", "radam")


def rule(optimizer: Any) -> str | None:
    """The stability rule of ``optimizer`` (``RULES``), None where the analysis does not know its step."""
    cls = known_class(optimizer, RULES)
    return None if cls is None else RULES[cls]


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
    while rule(optimizer) is None:
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
    | torch's NAdam | λ(P⁻¹H) < 2(1 + β₁)/(Dη), D from μ_t (module docstring) | "3.49/η" at its first step |
    | torch's RAdam, rectified | λ(P⁻¹H) < (2 + 2β₁)/((1 − β₁)r_t η) | "41.4/η" at t = 3000 |
    | torch's RAdam, first steps | λ(H) < (2 + 2β₁)/((1 − β₁)η) | "38/η" |

    Only for those steps: the class, or a subclass that keeps its ``step``. For any other (Lion, Muon, RMSprop,
    a subclass with a ``step`` of its own) the threshold is None with the reason, never a made-up number.

    Args:
        optimizer: the optimizer (optiscope's or torch.optim's ``SGD``, ``Adam``, ``AdamW``, ``AdamL2``, torch's
            ``NAdam``, ``RAdam``, any other, or a wrapper that forwards its ``param_groups``); None gives no
            threshold.

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
        >>> stability_threshold(torch.optim.NAdam(params, lr=0.01)).label  # at its first step (μ ≈ 0.45)
        '3.49/η'
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
    kind = rule(optimizer)
    if kind is None:
        return Stability(None, "", False, unknown(optimizer))
    groups = moving_groups(optimizer)
    if kind == "sgd":
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
    read = {"beta1": lambda g: float(g["betas"][0])}
    read |= {"momentum_decay": lambda g: float(g["momentum_decay"])} if kind == "nadam" else {}
    read |= {"beta2": lambda g: float(g["betas"][1])} if kind == "radam" else {}
    setting, why = _shared(groups, read, name)
    if setting is None:
        return Stability(None, "", True, why)
    beta1 = setting[0]
    lrs = [float(g["lr"]) for g in groups]
    lr = max(lrs)
    if lr <= 0 or beta1 >= 1:
        return Stability(None, "", True, f"{name} has lr={lr}, beta1={beta1}")
    t, why = _step_count(optimizer, groups, name) if kind != "adam" else (0.0, None)  # Adam's c is the same at any t
    if t is None:
        return Stability(None, "", True, why)
    coef, preconditioned = adaptive_coefficient(kind, groups[0], t)
    return Stability(coef / lr, label(coef, lrs), preconditioned or len(set(lrs)) > 1)


def unknown(optimizer: torch.optim.Optimizer) -> str:
    """Why ``optimizer`` has no threshold: its class is not in ``RULES``, or overrides the step of the one it
    subclasses."""
    name = type(optimizer).__name__
    base = next((cls for cls in type(optimizer).__mro__ if cls in RULES), None)
    if base is None:
        return f"no known stability threshold for {name}"
    package = ".".join(base.__module__.split(".")[:2])  # torch.optim.Adam, optiscope.optim.SGD: where users import it
    return f"no known stability threshold for {name} (its step() is not {package}.{base.__name__}'s)"


def _step_count(optimizer: torch.optim.Optimizer, groups: list[dict], name: str) -> tuple[float | None, str | None]:
    """(t, None): the steps the moved parameters' Adam-style state has taken (0 before the first), on which NAdam's
    μ and RAdam's rectification depend; (None, the reason) when they have taken different numbers."""
    steps = {adam_steps(optimizer.state.get(p, {})) for g in groups for p in g["params"]} - {0.0}
    if len(steps) > 1:
        return None, f"{name}'s parameters have taken different numbers of steps ({sorted(steps)}); no single threshold"
    return (steps.pop() if steps else 0.0), None


def adaptive_coefficient(kind: str, group: dict, t: float) -> tuple[float, bool]:
    """(c, whether the step is preconditioned by P) for an ``ADAPTIVE`` rule's next step from ``group``'s settings
    and t steps taken: its threshold is c/η (module docstring); c/2 is its decoupled decay's factor."""
    beta1 = float(group["betas"][0])
    if kind == "nadam":
        return 2 * (1 + beta1) / nadam_denominator(beta1, float(group["momentum_decay"]), t), True
    r = radam_rectification(float(group["betas"][1]), t + 1) if kind == "radam" else 1.0
    return (2 + 2 * beta1) / ((1 - beta1) * (r or 1.0)), r is not None


def group_steps(optimizer: torch.optim.Optimizer, group: dict) -> float:
    """t of ``group``: the most steps any of its parameters' Adam-style state has taken (0 before the first)."""
    return max((adam_steps(optimizer.state.get(p, {})) for p in group["params"]), default=0.0)


def nadam_denominator(beta1: float, momentum_decay: float, t: float) -> float:
    """D = (1 + β₁)(1 − μ) + (1 − β₁)μ′ of torch's NAdam at its next step t + 1, with μ = μ_{t+1}, μ′ = μ_{t+2} and
    μ_s = β₁(1 − ½·0.96^{sψ}), ψ its ``momentum_decay``: its threshold is 2(1 + β₁)/(D η)."""
    mu, mu_next = (beta1 * (1 - 0.5 * 0.96 ** (s * momentum_decay)) for s in (t + 1, t + 2))
    return (1 + beta1) * (1 - mu) + (1 - beta1) * mu_next


def moving_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The param groups a step moves: holding a parameter that requires grad, at lr > 0. A frozen group, or one
    at lr 0 (a way to freeze), moves nothing a step could destabilise. When no group has lr > 0 (a warm-up's
    first step from 0) all that hold a trainable parameter are returned. Once an Adam-family optimizer has
    stepped, a group none of whose parameters holds its state (an unused head in a group of its own, never
    given a gradient) is not moved either, and its lr does not count (the sharpness leaves it out of H)."""
    trainable = [g for g in optimizer.param_groups if any(p.requires_grad for p in g["params"])]
    moving = [g for g in trainable if _moves(g)] or trainable
    if rule(optimizer) not in ADAPTIVE:
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
    kind = rule(optimizer)
    if lam == 0 or kind is None:
        return Decay()
    decoupled = bool(group.get("decoupled_weight_decay", False)) or isinstance(optimizer, torch.optim.AdamW)
    if not decoupled:
        return Decay(coupled=lam)
    if kind in ADAPTIVE:
        coef, _ = adaptive_coefficient(kind, group, group_steps(optimizer, group))
        return Decay(shift=lam * coef / 2)
    mu, tau = float(group["momentum"]), float(group["dampening"])
    if mu == 0:
        return Decay(shift=lam)
    if tau >= 1 and not group["nesterov"]:  # the buffer takes no gradient after the first step: the threshold is
        return Decay()  # infinite (``stability_threshold``), and no shift of H can reach it
    return Decay(shift=lam * (1 + mu) / (1 + 2 * mu) if group["nesterov"] else lam * (1 + mu) / (1 - tau))


def adam_family(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (the one inside a wrapper: ``inner_optimizer``) keeps Adam-style state and so leaves a
    parameter without it unmoved: Adam and AdamW (ours, torch's), torch's NAdam and RAdam."""
    return rule(inner_optimizer(optimizer)) in ADAPTIVE


def inverse_preconditioner(optimizer: torch.optim.Optimizer, param: Tensor, step_scale: float = 1.0) -> Tensor:
    """P⁻¹ for ``param``, whose group's steps carry ``step_scale`` (``step_scales``), from the optimizer's state
    (KeyError for a param not in it or before its first step; independent of η, so defined at η = 0 too, a warm-up
    from 0): s/(√v̂ + ε) for Adam, AdamW and NAdam, s√(1 − β₂ᵗ)/(√v + ε) for RAdam's rectified step; s elsewhere
    (RAdam's unrectified step η m̂ too)."""
    optimizer = inner_optimizer(optimizer)
    kind = rule(optimizer)
    if kind not in ADAPTIVE:
        return torch.full_like(param, step_scale)
    t = adam_steps(optimizer.state.get(param, {}))
    beta2 = next((float(g["betas"][1]) for g in optimizer.param_groups if any(p is param for p in g["params"])), 0.0)
    if kind == "radam" and radam_rectification(beta2, t + 1) is None:  # before the first step too: P = I
        return torch.full_like(param, step_scale)
    group, denominator = adam_denominator(optimizer.state, optimizer.param_groups, param)
    if kind != "radam":
        return step_scale / denominator
    return step_scale * math.sqrt(1 - beta2**t) / (optimizer.state[param]["exp_avg_sq"].sqrt() + group["eps"])
