r"""Early warning of loss spikes and divergence: signals the monitor can compute on every step, on the device.

Notation of the seeds: step t has gradient g (as the optimizer steps with it, after clipping), the update
u = θₜ − θₜ₋₁, the weights w = θₜ, Adam's moments m, v with v̂ = v/(1 − β₂ᵗ), m̂ = m/(1 − β₁ᵗ), and ε.

Per-step signals read only what the monitor already holds (g, u, w, the optimizer's state, the loss) and return
tensors on the parameters' device: no host read, so that the monitor can leave them there and read a verdict
only every k steps. Curvature signals need Hessian-vector products (≈ 2 forward and backward passes each) and are
taken every k steps by ``optiscope.curvature``; ``Signals`` holds their last value in between.

Per tensor (``squared_norms``, ``adam_lag``, ``adam_step_size``; each one or two passes over the parameters):

- Adam's lag (Molybog et al. 2023; Bai et al., arXiv 2506.04805): ρ = mean g²/(√v̂ₜ₋₁ + ε)², the squared gradient
  against the second moment *before* the step takes it in. ρ ≈ 1 while v tracks g²; ρ ≪ 1 while v decays on a
  vanishing gradient (which raises the preconditioned curvature P⁻¹H, Bai et al.), ρ ≫ 1 when a gradient arrives
  that v has not seen: the step that follows is larger than any the moments prepared for (Molybog et al.).
- Adam's step size s = mean (m̂/(√v̂ + ε))², the squared RMS of the step before η.
- u/w, the relative size of the step.

``Signals`` turns them, step by step, into dimensionless scores (each a tensor of the batch shape):

- ``loss_z``, ``grad_norm_z``: z-scores of the loss and the gradient norm against exponential moving averages
  (α = 0.97, ZClip's recurrences: arXiv 2504.02507), the value entering the averages clipped at z = 2.5;
  ``loss_unrest``, ``grad_norm_unrest``: an EMA (α = 0.98) of max(z, 0)², how much they have jumped lately;
  ``loss_cusum``: Page's CUSUM of the loss's z-score, Sₜ = max(0, Sₜ₋₁ + zₜ − 0.5), a rise sustained over steps;
- ``update_ratio_growth``: maxᵢ log(u/w)ᵢ − EMA(log(u/w)ᵢ) over tensors i;
- ``lag``: maxᵢ log ρᵢ; ``lag_growth``: maxᵢ log ρᵢ − EMA(log ρᵢ); ``decay``: −minᵢ EMA(log ρᵢ), how far v has been
  outrunning g² (Bai et al.'s regime); ``lag_sums``, ``lag_sums_growth``: the same from ‖g‖²/Σv̂ per tensor, which
  needs no pass of its own (a norm of g and a sum of v);
- ``step_size``: maxᵢ log sᵢ; ``step_growth``: maxᵢ log sᵢ − EMA(log sᵢ);
- ``secant``: an EMA (α = 0.9) of the secant curvature along the last update against the stability threshold,
  ⟨gₜ − gₜ₋₁, uₜ₋₁⟩ / ⟨uₜ₋₁, P uₜ₋₁⟩ · ηₜ₋₁ / c (c = 2(1 + β₁)/(1 − β₁) for Adam, 2(1 + β) for heavy ball): the
  curvature along the update from two gradients of different batches, without a Hessian-vector product;
- ``curvature_update``, ``curvature_gradient``, ``sharpness``: the last measured ratios to the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..optim.adam import adam_steps

#: ZClip's smoothing and threshold (arXiv 2504.02507), used by every z-score here
ALPHA = 0.97
Z_CLIP = 2.5
#: steps whose plain mean and variance start each average (ZClip's warm-up)
WARMUP = 25
SECANT_ALPHA = 0.9
#: the memory of the unrest scores: an EMA over about 50 steps
UNREST_ALPHA = 0.98
#: the drift, in standard deviations per step, that the loss's CUSUM allows before it accumulates
CUSUM_SLACK = 0.5
#: the scores ``Signals.update`` returns, in order
SCORES = (
    "loss_z",
    "grad_norm_z",
    "loss_unrest",
    "grad_norm_unrest",
    "loss_cusum",
    "update_ratio_growth",
    "lag",
    "lag_growth",
    "decay",
    "lag_sums",
    "lag_sums_growth",
    "step_size",
    "step_growth",
    "secant",
    "curvature_update",
    "curvature_gradient",
    "sharpness",
)


def squared_norms(tensors: Sequence[Tensor]) -> Tensor:
    """‖xᵢ‖² of each tensor, as one float32 vector on their device (no host read).

    One pass over the tensors (``torch._foreach_norm``), accumulated in float32 at least.
    """
    if not tensors:
        return torch.zeros(0)
    norms = torch._foreach_norm(list(tensors), 2, dtype=torch.float32)
    return torch.stack(norms) ** 2


def preconditioned(
    tensors: Sequence[Tensor],
    second_moments: Sequence[Tensor],
    bias_corrections: Sequence[float],
    eps: float | Sequence[float],
) -> list[Tensor]:
    """x/(√v̂ + ε) for each tensor x, v̂ = v/(1 − β₂ᵗ) its second moment: new tensors, one pass to build."""
    denominators = torch._foreach_div(list(second_moments), list(bias_corrections))
    torch._foreach_sqrt_(denominators)
    torch._foreach_add_(denominators, eps if isinstance(eps, float | int) else list(eps))
    torch._foreach_div_(denominators, list(tensors))  # (√v̂ + ε)/x, inverted below: one temporary list
    torch._foreach_reciprocal_(denominators)
    return denominators


def adam_lag(
    grads: Sequence[Tensor],
    second_moments: Sequence[Tensor],
    bias_corrections: Sequence[float],
    eps: float | Sequence[float],
) -> Tensor:
    """ρᵢ = mean of g²/(√v̂ + ε)² over the entries of each tensor i, v̂ = v/(1 − β₂ᵗ⁻¹) its second moment before
    the step, as one float32 vector on the device.

    Two passes over the parameters and one parameter-sized temporary, freed on return.
    """
    return squared_norms(preconditioned(grads, second_moments, bias_corrections, eps)) / _sizes(grads)


def adam_step_size(
    first_moments: Sequence[Tensor],
    second_moments: Sequence[Tensor],
    bias_corrections1: Sequence[float],
    bias_corrections2: Sequence[float],
    eps: float | Sequence[float],
) -> Tensor:
    """sᵢ = mean of (m̂/(√v̂ + ε))² over the entries of each tensor i after the step, as one float32 vector."""
    steps = preconditioned(first_moments, second_moments, bias_corrections2, eps)
    torch._foreach_div_(steps, list(bias_corrections1))
    return squared_norms(steps) / _sizes(first_moments)


class AdamMoments(NamedTuple):
    """Adam's state for a list of parameters: m, v and, per parameter, 1 − β₁ᵗ, 1 − β₂ᵗ and ε."""

    first: list[Tensor]
    second: list[Tensor]
    bias_corrections1: list[float]
    bias_corrections2: list[float]
    eps: list[float]


def adam_moments(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> AdamMoments | None:
    """The Adam-style moments of ``params`` in ``optimizer``'s state (``exp_avg``, ``exp_avg_sq`` or with AMSGrad
    ``max_exp_avg_sq``, ``step``, its groups' ``betas`` and ``eps``); None when one of them has none (not stepped
    yet, or not an Adam-style optimizer).

    Reads each parameter's step count (a host read where it is a device tensor: torch's capturable and fused Adam).
    """
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    out = AdamMoments([], [], [], [], [])
    for p in params:
        state, group = optimizer.state.get(p, {}), group_of.get(id(p))
        t = adam_steps(state)
        if t == 0 or group is None or "exp_avg" not in state or "betas" not in group:
            return None
        beta1, beta2 = group["betas"]
        out.first.append(state["exp_avg"])
        out.second.append(state["max_exp_avg_sq"] if group.get("amsgrad") else state["exp_avg_sq"])
        out.bias_corrections1.append(1 - beta1**t)
        out.bias_corrections2.append(1 - beta2**t)
        out.eps.append(group["eps"])
    return out


def _sizes(tensors: Sequence[Tensor]) -> Tensor:
    return torch.tensor([float(t.numel()) for t in tensors], device=tensors[0].device if tensors else None)


class Average:
    """An exponential moving average and variance of x (any shape), ZClip's way, on x's device.

    The first ``WARMUP`` finite values give the plain mean and variance; after them
    μ ← αμ + (1 − α)x̃ and σ² ← ασ² + (1 − α)(x̃ − μ)², x̃ = min(x, μ + 2.5σ) (a spike does not inflate the
    averages it is judged against). A non-finite x leaves them as they are.
    """

    def __init__(self, alpha: float = ALPHA) -> None:
        self.alpha = alpha
        self.mean: Tensor | None = None
        self.var: Tensor | None = None
        self.count: Tensor | None = None

    def ready(self) -> Tensor:
        """Where the average has seen its ``WARMUP`` values (a bool tensor)."""
        assert self.count is not None
        return self.count >= WARMUP

    def z(self, x: Tensor) -> Tensor:
        """(x − μ)/σ against the averages so far; 0 where not ready or x is not finite."""
        self._start(x)
        z = (x - self.mean) / torch.sqrt(self.var).clamp_min(1e-12)
        return torch.where(self.ready() & torch.isfinite(x), z, torch.zeros_like(z))

    def add(self, x: Tensor) -> None:
        """Take x into the averages."""
        self._start(x)
        finite = torch.isfinite(x)
        x0 = torch.where(finite, x, self.mean)
        # the warm-up: Welford's running mean and (population) variance
        n = self.count + 1
        delta = x0 - self.mean
        warm_mean = self.mean + delta / n
        warm_var = self.var + (delta * (x0 - warm_mean) - self.var) / n
        # after it: ZClip's clipped exponential averages
        clipped = torch.minimum(x0, self.mean + Z_CLIP * torch.sqrt(self.var))
        ema_mean = self.alpha * self.mean + (1 - self.alpha) * clipped
        ema_var = self.alpha * self.var + (1 - self.alpha) * (clipped - ema_mean) ** 2
        ready = self.ready()
        self.mean = torch.where(finite, torch.where(ready, ema_mean, warm_mean), self.mean)
        self.var = torch.where(finite, torch.where(ready, ema_var, warm_var), self.var)
        self.count = torch.where(finite, self.count + 1, self.count)

    def _start(self, x: Tensor) -> None:
        if self.mean is None:
            self.mean = torch.zeros_like(x, dtype=torch.float32)
            self.var = torch.zeros_like(x, dtype=torch.float32)
            self.count = torch.zeros_like(x, dtype=torch.int64)

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha, self.mean, self.var, self.count = state["alpha"], state["mean"], state["var"], state["count"]


class Signals:
    """Early-warning scores of one run (or several: leading batch dimensions), step by step, on the device.

    Feed ``update`` once per optimizer step with what the monitor holds; per-tensor inputs have a last dimension
    over the parameter tensors. Only the scores in ``names`` are computed, each from the inputs it needs.

    Args:
        names: the scores to compute, from ``SCORES``; all by default.
    """

    def __init__(self, names: Sequence[str] = SCORES) -> None:
        unknown = [n for n in names if n not in SCORES]
        if unknown:
            raise ValueError(f"Signals: unknown score {unknown[0]!r}; valid: {', '.join(SCORES)}")
        self.names = tuple(names)
        self.averages = {name: Average() for name in ("loss", "grad_norm", "update_ratio", "lag", "lag_sums", "step")}
        self.secant_average: Tensor | None = None
        self.unrest: dict[str, Tensor] = {}
        self.cusum: Tensor | None = None
        self.previous: dict[str, Tensor] | None = None  # last step's ⟨g, u⟩, ⟨u, P u⟩ sums and η / c
        self.curvature: dict[str, Tensor] = {}

    def update(self, loss: Tensor, **inputs: Tensor | None) -> dict[str, Tensor]:
        """This step's scores from its quantities; an input a score needs that is None makes that score NaN.

        Args:
            loss: Lₜ, the step's loss.
            **inputs: ``grad_norm`` (‖g‖ over all parameters, before clipping where the loop clips); per tensor:
                ``u2``, ``w2`` (‖u‖², ‖θₜ‖²), ``gu``, ``gu_prev`` (⟨gₜ, uₜ⟩, ⟨gₜ, uₜ₋₁⟩), ``upu`` (⟨uₜ, P uₜ⟩, P the
                identity for SGD), ``lag`` (``adam_lag``), ``g2`` and ``v_sum`` (‖g‖² and Σv̂ before the step),
                ``step2`` (``adam_step_size``); ``lr_over_threshold`` (η/c, c/η the stability threshold).

        Returns:
            ``{name: tensor}`` for each of ``names``.
        """
        want, out = set(self.names), {}
        nan = torch.full_like(loss, math.nan, dtype=torch.float32)
        got = {k: v for k, v in inputs.items() if v is not None}
        if {"loss_z", "loss_unrest", "loss_cusum"} & want:
            out["loss_z"] = self.averages["loss"].z(loss)
            self.averages["loss"].add(loss)
            out["loss_unrest"] = self._unrest("loss", out["loss_z"])
            last = self.cusum if self.cusum is not None else torch.zeros_like(out["loss_z"])
            self.cusum = torch.clamp(last + out["loss_z"] - CUSUM_SLACK, min=0)
            out["loss_cusum"] = self.cusum
        if {"grad_norm_z", "grad_norm_unrest"} & want and "grad_norm" in got:
            out["grad_norm_z"] = self.averages["grad_norm"].z(got["grad_norm"])
            self.averages["grad_norm"].add(got["grad_norm"])
            out["grad_norm_unrest"] = self._unrest("grad_norm", out["grad_norm_z"])
        if "update_ratio_growth" in want and {"u2", "w2"} <= got.keys():
            out["update_ratio_growth"] = _growth(self.averages["update_ratio"], 0.5 * torch.log(got["u2"] / got["w2"]))
        if {"lag", "lag_growth", "decay"} & want and "lag" in got:
            log_lag = torch.log(got["lag"])
            out["lag"] = _max(log_lag)
            out["lag_growth"] = _growth(self.averages["lag"], log_lag)
            ready = self.averages["lag"].ready().all(-1)
            out["decay"] = torch.where(ready, -_min(self.averages["lag"].mean), nan)
        if {"lag_sums", "lag_sums_growth"} & want and {"g2", "v_sum"} <= got.keys():
            log_lag = torch.log(got["g2"] / got["v_sum"])
            out["lag_sums"] = _max(log_lag)
            out["lag_sums_growth"] = _growth(self.averages["lag_sums"], log_lag)
        if {"step_size", "step_growth"} & want and "step2" in got:
            log_step = torch.log(got["step2"])
            out["step_size"] = _max(log_step)
            out["step_growth"] = _growth(self.averages["step"], log_step)
        if "secant" in want and {"gu", "gu_prev", "upu", "lr_over_threshold"} <= got.keys():
            out["secant"] = self._secant(got)
        out.update({k: v for k, v in self.curvature.items() if k in want})
        return {name: out.get(name, nan).float() for name in self.names}

    def _unrest(self, name: str, z: Tensor) -> Tensor:
        """EMA (``UNREST_ALPHA``) of max(z, 0)²: how much the value has been jumping lately, spikes included."""
        jump = torch.clamp(z, min=0) ** 2
        last = self.unrest.get(name)
        self.unrest[name] = jump if last is None else UNREST_ALPHA * last + (1 - UNREST_ALPHA) * jump
        return self.unrest[name]

    def _secant(self, got: dict[str, Tensor]) -> Tensor:
        sums = {"gu": got["gu"].sum(-1), "upu": got["upu"].sum(-1), "scale": got["lr_over_threshold"]}
        if self.previous is not None:
            last = self.previous
            secant = (got["gu_prev"].sum(-1) - last["gu"]) / last["upu"] * last["scale"]
            secant = torch.where(torch.isfinite(secant), secant, torch.zeros_like(secant))
            average = self.secant_average
            self.secant_average = secant if average is None else SECANT_ALPHA * average + (1 - SECANT_ALPHA) * secant
        self.previous = sums
        return torch.full_like(sums["gu"], math.nan) if self.secant_average is None else self.secant_average

    def measured(self, **ratios: Tensor) -> None:
        """The curvature measured this step, as ratios to the threshold: ``curvature_update``,
        ``curvature_gradient``, ``sharpness``; held until the next measurement."""
        self.curvature.update(ratios)


def _max(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.full_like(x, -math.inf)).amax(-1)


def _min(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.full_like(x, math.inf)).amin(-1)


def _growth(average: Average, x: Tensor) -> Tensor:
    """maxᵢ xᵢ − EMA(xᵢ) over the last dimension, where the average is ready (NaN before), then x taken in."""
    ready = average.ready() if average.count is not None else torch.zeros_like(x, dtype=torch.bool)
    growth = torch.where(ready, x - average.mean if average.mean is not None else x, torch.full_like(x, -math.inf))
    average.add(x)
    out = _max(growth)
    return torch.where(torch.isfinite(out), out, torch.full_like(out, math.nan))
