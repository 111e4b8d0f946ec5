r"""Seed statistics: mean ± standard deviation, a bootstrap 95 % interval, and whether two optimizers
differ by more than their seed noise.

The bootstrap interval of a mean resamples the n seed values with replacement B times and takes the
2.5th and 97.5th percentiles of the resampled means (the percentile bootstrap; Efron & Tibshirani, *An
Introduction to the Bootstrap*, 1993, ch. 13). Two optimizers differ beyond seed noise when the same
interval for the difference of their means, each resampled on its own, excludes zero. With three seeds
a mean can take only ten resampled values, so the interval is coarse: it says "clearly apart" or
"not clearly apart", no more. The generator has a fixed seed, so a sweep's numbers are reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; NaN for one value); +inf mean if any value is +inf."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        return math.inf, math.nan
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan


def _interval(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _resampled_means(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))].mean(axis=1)


def bootstrap_interval(values: Sequence[float], seed: int = SEED) -> tuple[float, float]:
    """The percentile-bootstrap 95 % interval of the mean of ``values`` (+inf, +inf if any is +inf)."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        return math.inf, math.inf
    return _interval(_resampled_means(x, np.random.default_rng(seed)))


def difference_interval(a: Sequence[float], b: Sequence[float], seed: int = SEED) -> tuple[float, float]:
    """The percentile-bootstrap 95 % interval of mean(a) − mean(b), a and b resampled independently."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    return _interval(_resampled_means(x, rng) - _resampled_means(y, rng))
