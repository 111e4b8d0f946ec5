"""Seed statistics against closed forms, a t table, scipy's own Welch test and the error rate they promise."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from optiscope.sweep import stats


def test_mean_std_match_the_standard_library():
    values = [1.9, 2.05, 1.97]
    assert stats.mean_std(values) == pytest.approx((statistics.mean(values), statistics.stdev(values)))


def test_the_interval_of_a_mean_is_students():
    # three seeds: x̄ ± t(0.975, 2) s/√3 with t(0.975, 2) = 4.303 (any t table)
    values = [1.9, 2.05, 1.97]
    half = 4.303 * statistics.stdev(values) / math.sqrt(3)
    assert stats.mean_interval(values) == pytest.approx((1.97333 - half, 1.97333 + half), abs=2e-4)
    assert stats.mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in stats.mean_interval([2.0]))  # one seed: no spread, no interval


@pytest.mark.parametrize("worst", [math.inf, -math.inf])
def test_a_failed_seed_leaves_no_interval(worst):
    """A failed trial's worst value (+inf minimising, −inf maximising) has no spread to measure: no interval,
    as for one seed. An interval had been (+inf, +inf) either way: for a maximised objective it lay entirely
    above its own mean, −inf, printed as "-inf ± nan (95% CI inf … inf)"."""
    values = [2.0, worst, 2.1]
    mean = stats.mean_std(values)[0]
    assert mean == worst == statistics.fmean(values)
    low, high = stats.mean_interval(values)
    assert math.isnan(low) and math.isnan(high)


@pytest.mark.parametrize(
    "a, b",
    [([1.0, 1.01, 0.99], [2.0, 2.01, 1.99]), ([1.0, 2.0, 3.0], [1.5, 2.5, 0.5]), ([3.1, 2.9], [2.0, 2.6, 2.2, 2.4])],
)
def test_the_difference_is_welchs_interval(a, b):
    oracle = scipy_stats.ttest_ind(a, b, equal_var=False)
    low, high = oracle.confidence_interval(0.95)
    assert stats.difference_interval(a, b) == pytest.approx((low, high), rel=1e-9)
    assert (oracle.pvalue < 0.05) == (not low <= 0 <= high)  # the verdict is Welch's test at 5 %


def test_two_identical_optimizers_are_called_different_about_one_time_in_twenty():
    """What the verdict promises, measured: seeds of two optimizers with the same mean, three each (the
    percentile bootstrap this replaced called them different 19 % of the time)."""
    rng = np.random.default_rng(0)
    trials = 4000
    wrong = sum(
        not (low <= 0 <= high)
        for low, high in (stats.difference_interval(rng.normal(size=3), rng.normal(size=3)) for _ in range(trials))
    )
    # at most 5 % (+3.3 standard errors); Welch's test is a little conservative at three seeds (measured 3.5 %)
    assert 0.02 < wrong / trials < 0.065
    covered = sum(low <= 0 <= high for low, high in (stats.mean_interval(rng.normal(size=3)) for _ in range(trials)))
    assert 0.935 < covered / trials < 0.965
