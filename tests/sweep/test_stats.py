"""Seed statistics against closed forms (the bootstrap's distribution is known for two values)."""

import statistics

import pytest

from optiscope.sweep import stats


def test_mean_std_match_the_standard_library():
    values = [1.9, 2.05, 1.97]
    assert stats.mean_std(values) == pytest.approx((statistics.mean(values), statistics.stdev(values)))


def test_bootstrap_of_two_values_spans_them():
    # the mean of two draws from {0, 1} is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4
    assert stats.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    assert stats.bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)


def test_difference_beyond_and_within_noise():
    low, high = stats.difference_interval([1.0, 1.01, 0.99], [2.0, 2.01, 1.99])
    assert -1.02 - 1e-12 <= low < high <= -0.98 + 1e-12  # within the support of the resampled difference
    low, high = stats.difference_interval([1.0, 2.0, 3.0], [1.5, 2.5, 0.5])
    assert low < 0 < high
