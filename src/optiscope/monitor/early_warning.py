r"""The monitor's early warning: a loss spike or a divergence announced while there is still time to act.

Three signals, each against a threshold, each judged where the monitor already reads (``Monitor``):

- ``loss``: the loss's z-score against ZClip's exponential averages (α = 0.97, arXiv 2504.02507), each step's loss
  judged when the divergence guard reads it (no read of its own);
- ``lag``: Adam's lag (Molybog et al. 2023), ρ = maxᵢ ‖gᵢ‖²/(Σ v̂ᵢ + nᵢε²) over the parameter tensors i, the
  gradient against the second moment *before* the step takes it in: ρ ≈ 1 while v tracks g², ρ ≫ 1 when a
  gradient arrives that v has not prepared for (it decayed over a long quiet stretch) and the step is up to √ρ
  times the usual; computed on the device every step (a norm of g and a sum of v per tensor), read with the losses;
- ``edge``: on the curvature's steps, the (preconditioned) sharpness against the optimizer's stability threshold
  (``Curvature``): above 1 the top direction's quadratic model grows at every step.

A warning is a dict ``{"step", "signal", "value", "threshold", "message"}`` (with ``"action"`` and ``"lr"`` where
``on_warning="reduce_lr"`` acted), handed to ``on_warning`` when it is read and kept for the next measured step's
record, whose ``warning_score`` is the largest value/threshold since the record before (above 1: warned).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import is_count, is_number
from .warning import Average, adam_moments

log = logging.getLogger("optiscope")

#: the signals, in the order the thresholds are given
SIGNALS = ("loss", "lag", "edge")


@dataclass(frozen=True)
class EarlyWarning:
    """When the monitor warns: one threshold per signal (None switches that signal off), and how often it repeats.

    Args:
        loss: the loss's z-score above which a step warns (ZClip's averages, α = 0.97); a number > 0 or None.
        lag: Adam's lag ρ = maxᵢ ‖gᵢ‖²/(Σv̂ᵢ + nᵢε²) above which a step warns; a number > 0 or None.
        edge: the sharpness / stability threshold ratio above which a curvature step warns; a number > 0 or None.
        cooldown: steps after a warning of one signal during which that signal does not warn again (nor act);
            an integer ≥ 1.

    Raises:
        ValueError: a field outside its range.

    Examples:
        >>> from optiscope.monitor import EarlyWarning
        >>> EarlyWarning()
        EarlyWarning(loss=4.2, lag=100000.0, edge=1.0, cooldown=20)
        >>> EarlyWarning(edge=None).edge is None  # the sharpness never warns
        True

    Notes:
        ``loss``'s default is the threshold that gave at most one false alarm per 1,000 steps on the fitting seeds
        (0 … 4) of the warning corpus (``benchmarks/early_warning``: 4.14, rounded up); the evaluation page says how
        little it catches there. ``lag``'s is where the corpus had no false alarm at all: its one-per-1,000
        threshold, 3,300, gave 6.6 per 1,000 on the ``lm`` runs, and the lag predicted none of the corpus's spikes,
        whereas the mechanism it is for (a second moment near 0 meeting a gradient) gives ρ ≈ 10⁸. ``edge`` is
        the theory's 1 (exact on a quadratic); the corpus's runs, whose gradients are clipped to norm 1 so that
        their steps are smaller than η·g, sat far above it (its one-per-1,000 threshold was 67,000), so with
        clipping set ``edge=None``.
    """

    loss: float | None = 4.2
    lag: float | None = 1e5
    edge: float | None = 1.0
    cooldown: int = 20

    def __post_init__(self) -> None:
        for name in SIGNALS:
            value = getattr(self, name)
            if value is not None and not (is_number(value) and math.isfinite(value) and value > 0):
                raise ValueError(f"EarlyWarning: {name}={value!r} must be a finite number > 0, or None (off)")
        if not is_count(self.cooldown, 1):
            raise ValueError(f"EarlyWarning: cooldown={self.cooldown!r} must be an integer >= 1")


def checked_warning(early_warning: Any, on_warning: Any, who: str) -> EarlyWarning | None:
    """``early_warning`` as an ``EarlyWarning`` (True: the defaults) or None (False, None); a one-line error for
    anything else, and for an ``on_warning`` that is neither None, a function nor ``"reduce_lr"``, or given
    without a warning."""
    if early_warning is True:
        early_warning = EarlyWarning()
    elif early_warning is False:
        early_warning = None
    if early_warning is not None and not isinstance(early_warning, EarlyWarning):
        raise TypeError(f"{who}: early_warning={early_warning!r} must be True, False or an EarlyWarning(...)")
    if on_warning is not None and not (callable(on_warning) or on_warning == "reduce_lr"):
        raise ValueError(
            f"{who}: on_warning={on_warning!r} must be a function of the warning (a dict), 'reduce_lr' or None"
        )
    if on_warning is not None and early_warning is None:
        raise ValueError(f"{who}: on_warning={on_warning!r} needs early_warning=True (or an EarlyWarning)")
    return early_warning


def adam_lag_sums(optimizer: torch.optim.Optimizer, params: list[Tensor]) -> Tensor | None:
    """ρ = maxᵢ ‖gᵢ‖²/(Σ v̂ᵢ + nᵢε²) over ``params`` (each with a gradient), v̂ the bias-corrected second moment
    before the step: a float32 scalar on their device (float64 where a parameter is), computed without a host read;
    None where the optimizer keeps no Adam-style moments for them (yet).

    Two passes over the parameters' size (a norm of each gradient, a sum of each second moment) and no temporary
    of their size: the mean of g²/(√v̂ + ε)² (``warning.adam_lag``) would take two more and one temporary.
    """
    moments = adam_moments(optimizer, params) if params else None
    if moments is None:
        return None
    # per tensor, with Python numbers only: no host-to-device copy, which could wait on a GPU; float32 at least,
    # and never narrower than a parameter (a norm refuses to narrow)
    wide = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
    g2 = torch._foreach_norm([p.grad for p in params], 2, dtype=wide)
    torch._foreach_mul_(g2, g2)
    sums = torch._foreach_norm(moments.second, 1, dtype=wide)
    torch._foreach_mul_(sums, [1 / bc for bc in moments.bias_corrections2])
    torch._foreach_add_(sums, [p.numel() * e * e for p, e in zip(params, moments.eps, strict=True)])
    torch._foreach_div_(g2, sums)
    return torch.stack(g2).amax()


class Warnings:
    """The early warning's state in one monitor: the loss's averages, the lags not read yet, the warnings not
    recorded yet, the last step each signal warned at. ``state_dict``/``load_state_dict`` for an exact resume."""

    def __init__(self, config: EarlyWarning, on_warning: Callable[[dict[str, Any]], Any] | str | None) -> None:
        self.config, self.on_warning = config, on_warning
        self.loss_average = Average()
        self.pending: list[tuple[int, Tensor]] = []  # (step, ρ) computed on the device, not read yet
        self.recorded: list[dict[str, Any]] = []  # warnings since the last measured record
        self.score = -math.inf  # the largest value/threshold since the last measured record
        self.last: dict[str, int] = {}  # the step each signal last warned at
        self.told: set[str] = set()

    # -------------------------------------------------------------------------------------------- signals
    def before_step(
        self, optimizer: torch.optim.Optimizer, step: int, measured: bool, sharded: bool, name: str
    ) -> None:
        """Adam's lag of step ``step``, before the optimizer takes it: computed on the device and kept."""
        if self.config.lag is None:
            return
        if sharded:
            self._tell("sharded", f"{name}: under FSDP each rank holds part of Adam's moments: its lag is not watched")
            return
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        state = optimizer.state.get(params[0], {}) if params else {}
        steps = state.get("step")
        if isinstance(steps, Tensor) and steps.device.type != "cpu" and not measured:
            return  # a step count on the GPU (capturable, fused Adam) is a wait to read: measured steps only
        lag = adam_lag_sums(optimizer, params)
        if lag is None:
            if step > 1 and params:
                self._tell(
                    "moments",
                    f"{name}: {type(optimizer).__name__} keeps no Adam moments (exp_avg_sq), so Adam's lag is not "
                    "watched; the loss's z-score and, with curvature=, the sharpness still are",
                )
            return
        self.pending.append((step, lag))

    def losses(self, steps: list[tuple[int, float | None]]) -> list[dict[str, Any]]:
        """Steps' losses as the guard reads them, in order: each judged against the averages before it."""
        out = []
        for step, loss in steps:
            if loss is None:
                continue
            x = torch.tensor(loss, dtype=torch.float32)
            z = float(self.loss_average.z(x))
            self.loss_average.add(x)
            out += self._judge(step, "loss", z, self.config.loss)
        return out

    def read_lags(self) -> list[dict[str, Any]]:
        """The lags kept on the device read, in one transfer, and judged (call where the monitor reads anyway)."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        values = torch.stack([v.to(torch.float64) for _, v in pending]).tolist()
        out = []
        for (step, _), value in zip(pending, values, strict=True):
            if math.isfinite(value):  # a GradScaler's non-finite gradients: the scaler skips that step
                out += self._judge(step, "lag", value, self.config.lag)
        return out

    def edge(self, step: int, ratio: float | None) -> list[dict[str, Any]]:
        """A curvature step's sharpness / stability threshold ratio judged."""
        if ratio is None or not math.isfinite(ratio):
            return []
        return self._judge(step, "edge", ratio, self.config.edge)

    def _judge(self, step: int, signal: str, value: float, threshold: float | None) -> list[dict[str, Any]]:
        if threshold is None:
            return []
        self.score = max(self.score, value / threshold)
        last = self.last.get(signal)
        if value <= threshold or (last is not None and step - last < self.config.cooldown):
            return []
        self.last[signal] = step
        what = {
            "loss": f"the loss is {value:.3g} standard deviations above its average",
            "lag": f"Adam's lag {value:.3g}: a gradient its second moment has not prepared for",
            "edge": f"the sharpness is {value:.3g}x the optimizer's stability threshold",
        }[signal]
        return [{"step": step, "signal": signal, "value": value, "threshold": threshold, "message": what}]

    # -------------------------------------------------------------------------------------------- acting
    def act(self, warnings: list[dict[str, Any]], optimizer: torch.optim.Optimizer) -> None:
        """Hand each warning to ``on_warning`` (``"reduce_lr"``: halve every group's lr) and keep it for the
        next record."""
        for warning in warnings:
            if self.on_warning == "reduce_lr":
                for group in optimizer.param_groups:
                    if isinstance(group["lr"], Tensor):
                        group["lr"].mul_(0.5)  # in place: a compiled step reads the same tensor
                    elif group["lr"] is not None:
                        group["lr"] = group["lr"] * 0.5
                warning["action"] = "reduce_lr"
                warning["lr"] = [None if g["lr"] is None else float(g["lr"]) for g in optimizer.param_groups]
            elif callable(self.on_warning):
                self.on_warning(warning)
            self.recorded.append(warning)

    def fields(self) -> dict[str, Any]:
        """A measured record's ``warning_score`` and ``warnings`` (those since the record before), then reset."""
        out = {"warning_score": self.score if math.isfinite(self.score) else None, "warnings": self.recorded}
        self.recorded, self.score = [], -math.inf
        return out

    def _tell(self, key: str, message: str) -> None:
        if key not in self.told:
            self.told.add(key)
            log.warning(f"{message} (said once)")

    # -------------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """What an exact resume needs; the lags not read yet as numbers (a wait for the device, no collective)."""
        values = torch.stack([v.to(torch.float64) for _, v in self.pending]).tolist() if self.pending else []
        return {
            "loss_average": self.loss_average.state_dict(),
            "pending": [(s, v) for (s, _), v in zip(self.pending, values, strict=True)],
            "recorded": self.recorded,
            "score": self.score,
            "last": self.last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``."""
        self.loss_average.load_state_dict(state["loss_average"])
        self.pending = [(int(s), torch.tensor(v)) for s, v in state["pending"]]
        self.recorded = list(state["recorded"])
        self.score, self.last = state["score"], dict(state["last"])
