"""The protocol as pure functions: a known objective of the grid position drives it to an interior
optimum, then every seed at the best and its two neighbours."""

import math

from optiscope.sweep import grid


def drive(value, seeds=(0, 1, 2), bounds=(-7, 7)):
    """Run the protocol to the end on ``value(k, seed)``; returns the (k, seed) trials in order."""
    done, order = {}, []
    while batch := grid.next_trials(done, seeds, bounds, grid.INITIAL):
        for k, s in batch:
            assert (k, s) not in done
            done[(k, s)] = value(k, s)
            order.append((k, s))
    return order


def test_extends_downwards_until_the_best_is_interior():
    order = drive(lambda k, s: (k + 4) ** 2)  # optimum at k = -4, outside the first grid
    first = [k for k, s in order if s == 0]
    assert first[:3] == [-1, 0, 1] and first[3:] == [-2, -3, -4, -5]
    assert sorted({(k, s) for k, s in order if s != 0}) == [(k, s) for k in (-5, -4, -3) for s in (1, 2)]


def test_extends_upwards_and_stops_at_the_bound():
    order = drive(lambda k, s: -k, bounds=(-3, 3))  # better and better upwards: the bound stops it
    assert max(k for k, _ in order) == 3
    assert sorted({k for k, s in order if s == 2}) == [2, 3]  # best at the edge: one neighbour


def test_nothing_finite_goes_lower_to_the_bound_then_ends():
    assert drive(lambda k, s: math.inf, bounds=(-3, 3)) == [(-1, 0), (0, 0), (1, 0), (-2, 0), (-3, 0)]


def test_divergence_at_every_first_rate_finds_the_optimum_below():
    order = drive(lambda k, s: math.inf if k >= -1 else (k + 3) ** 2)  # diverges from k = -1 up; optimum -3
    first = [k for k, s in order if s == 0]
    assert first == [-1, 0, 1, -2, -3, -4] and sorted({k for k, s in order if s == 1}) == [-4, -3, -2]


def test_auto_lr_is_half_a_decade_per_step():
    assert grid.auto_lr(1e-3, 2) == 1e-2 and grid.auto_lr(1e-3, -1) == 3.16e-4
