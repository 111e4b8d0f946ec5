"""The protocol as pure functions: a known objective of the grid position drives it to an interior
optimum, then every seed at the best and its two neighbours, then the fresh seeds at the tuned position."""

import math
import random
import statistics

from optiscope.sweep import grid


def drive(value, seeds=(0, 1, 2), bounds=(-7, 7), fresh=(), misses=lambda k: False):
    """Run the protocol to the end on ``value(k, seed)``, a +inf at position k being a missed target where
    ``misses(k)`` (else a divergence); returns the (k, seed) trials in order."""
    done, order = {}, []

    def missed():
        return {k for (k, s), v in done.items() if s == seeds[0] and v == math.inf and misses(k)}

    while batch := grid.next_trials(done, seeds, bounds, grid.INITIAL, fresh, missed()):
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


def test_targets_missed_at_every_first_rate_find_the_optimum_above():
    """Steps to a target: a learning rate too small never gets there in the steps given (a missed target, not a
    divergence), so the grid grows upwards; it had gone lower, to the bound, and found nothing."""
    order = drive(lambda k, s: math.inf if k < 3 else (k - 4) ** 2, misses=lambda k: k < 3)  # optimum k = 4
    first = [k for k, s in order if s == 0]
    assert first == [-1, 0, 1, 2, 3, 4, 5] and sorted({k for k, s in order if s == 1}) == [3, 4, 5]


def test_a_missed_target_below_and_a_divergence_above_end_the_grid():
    """The lowest η misses the target and the highest diverges: no η of the grid both trains and gets there."""
    assert drive(lambda k, s: math.inf, misses=lambda k: k < 1) == [(-1, 0), (0, 0), (1, 0)]


def test_auto_lr_is_half_a_decade_per_step():
    assert grid.auto_lr(1e-3, 2) == 1e-2 and grid.auto_lr(1e-3, -1) == 3.16e-4


def test_fresh_seeds_run_last_and_only_at_the_tuned_position():
    # seed 1 is unlucky at k = -4, so the tuning seeds' mean prefers k = -3 (0.1) over the optimum -4 (0.5)
    # and -5 (0.15)
    def value(k, s):
        return (k + 4) ** 2 / 10 + (1.0 if (k, s) == (-4, 1) else 0.0) + (0.05 if k == -5 else 0.0)

    order = drive(value, seeds=(0, 1), fresh=(2, 3))
    assert order[-2:] == [(-3, 2), (-3, 3)] and not [(k, s) for k, s in order[:-2] if s >= 2]


def test_nothing_tuned_runs_no_fresh_seed():
    assert all(s == 0 for _, s in drive(lambda k, s: math.inf, bounds=(-3, 3), fresh=(1,)))


def test_the_fresh_mean_is_unbiased_where_the_tuning_mean_is_not():
    """Every position equally good, seed noise N(0, 1) independent between trials: the tuning seeds' mean
    at the position they chose is the best of three means of N seeds, biased by at least −0.846/√N (the
    expected smallest of three standard normals, a closed form: −3/(2√π); more, as the first seed also chose
    the three); the fresh seeds' mean is not biased."""
    rng = random.Random(0)
    n, tuning_bias, fresh_bias = 3, [], []
    for _ in range(2000):
        noise = {}
        done = {}
        seeds, fresh = (0, 1, 2), (3, 4, 5)
        while batch := grid.next_trials(done, seeds, (-7, 7), grid.INITIAL, fresh):
            for trial in batch:
                done[trial] = noise.setdefault(trial, rng.gauss(0.0, 1.0))
        tuned = grid.tuned_position({t: v for t, v in done.items() if t[1] in seeds}, seeds)
        tuning_bias.append(statistics.fmean(done[(tuned, s)] for s in seeds))
        fresh_bias.append(statistics.fmean(done[(tuned, s)] for s in fresh))
    standard_error = 1 / math.sqrt(n) / math.sqrt(2000)  # of the average of 2000 means of n seeds (at most)
    assert abs(statistics.fmean(fresh_bias)) < 4 * standard_error
    assert statistics.fmean(tuning_bias) < -3 / (2 * math.sqrt(math.pi)) / math.sqrt(n) + 2 * standard_error
