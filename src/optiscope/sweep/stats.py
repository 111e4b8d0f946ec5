r"""Seed statistics: mean ± standard deviation, a 95 % confidence interval of the mean, and whether two
optimizers differ by more than their seed noise.

The interval of a mean over n seeds is Student's t interval, x̄ ± t₀.₉₇₅,ₙ₋₁ · s/√n. Two optimizers
differ beyond seed noise when Welch's interval for the difference of their means,

    x̄ − ȳ ± t₀.₉₇₅,ν · √(s_x²/n_x + s_y²/n_y),   ν = (s_x²/n_x + s_y²/n_y)² / Σ (s²/n)²/(n − 1)

(the Welch–Satterthwaite degrees of freedom), excludes zero: Welch's two-sided t test at 5 %. Both assume
seed values scattered normally around the optimizer's mean; with three seeds t₀.₉₇₅,₂ = 4.30, so the
interval is wide and "beyond seed noise" is a strong statement. (A percentile bootstrap, used before, is
no interval at three seeds: its extreme resampled means are the seeds' own minimum and maximum, each with
probability 1/27, so it spans exactly [min, max] and calls two identical optimizers different about one
time in five.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; NaN for one value); a value that is not finite makes the
    mean ±inf (the worst value of a failed trial, of either sign) or NaN, and the deviation NaN."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        with np.errstate(invalid="ignore"):
            return float(x.mean()), math.nan
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan


def _quantile(dof: float) -> float:
    return float(stats.t.ppf(1 - (1 - LEVEL) / 2, dof))


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """Student's t 95 % interval of the mean of ``values``: (+inf, +inf) if any is +inf, (nan, nan) for
    fewer than two (one seed measures no spread)."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        return math.inf, math.inf
    if len(x) < 2:
        return math.nan, math.nan
    mean, half = float(x.mean()), _quantile(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean - half, mean + half


def difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's 95 % interval of mean(a) − mean(b) ((nan, nan) without two finite values on each side;
    a single point when neither varies)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or min(len(x), len(y)) < 2:
        return math.nan, math.nan
    difference = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return difference, difference
    dof = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = _quantile(dof) * math.sqrt(vx + vy)
    return difference - half, difference + half
