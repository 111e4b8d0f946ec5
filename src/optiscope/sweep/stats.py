r"""Seed statistics: mean ± standard deviation, a 95 % confidence interval of the mean, and whether two
optimizers differ by more than their seed noise.

The interval of a mean over n seeds is Student's t interval, x̄ ± t₀.₉₇₅,ₙ₋₁ · s/√n. Two optimizers
differ beyond seed noise when Welch's interval for the difference of their means,

    x̄ − ȳ ± t₀.₉₇₅,ν · √(s_x²/n_x + s_y²/n_y),   ν = (s_x²/n_x + s_y²/n_y)² / Σ (s²/n)²/(n − 1)

(the Welch–Satterthwaite degrees of freedom), excludes zero: Welch's two-sided t test at 5 %. Both are
scipy.stats' (``ttest_1samp``, ``ttest_ind(equal_var=False)``, their ``confidence_interval``). Both assume
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


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """Student's t 95 % interval of the mean of ``values``: (nan, nan) — no interval — if one is not finite
    (a failed trial's worst value, +inf or −inf, has no spread to measure) or for fewer than two (one seed
    measures no spread), the mean itself when they are all equal."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all() or len(x) < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):  # no spread: scipy's interval would be nan
        return float(x[0]), float(x[0])
    low, high = stats.ttest_1samp(x, 0.0).confidence_interval(LEVEL)
    return float(low), float(high)


def difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's 95 % interval of mean(a) − mean(b) ((nan, nan) without two finite values on each side;
    a single point when neither varies)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or min(len(x), len(y)) < 2:
        return math.nan, math.nan
    if np.all(x == x[0]) and np.all(y == y[0]):  # no spread on either side: scipy's interval would be nan
        difference = float(x[0] - y[0])
        return difference, difference
    low, high = stats.ttest_ind(x, y, equal_var=False).confidence_interval(LEVEL)
    return float(low), float(high)
