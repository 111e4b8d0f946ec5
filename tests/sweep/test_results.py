"""The pairwise verdict of a sweep: a claim about seed noise only where seeds measured some."""

import math
import statistics

import pytest

from optiscope.sweep.results import compare, pair, steps_to_target
from optiscope.sweep.stats import mean_std


def tuned(values):
    return {"values": values, "mean": statistics.fmean(values)}


@pytest.mark.parametrize(
    ("better", "worse", "differ", "says"),
    [
        ([1.0, 1.1, 0.9], [5.0, 5.1, 4.9], True, "beyond seed noise"),
        ([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], False, "within seed noise"),
        ([2.0], [3.0], False, "from one seed — the seed noise is not measured"),
        ([2.0, 2.0, 2.0], [3.0, 3.0, 3.0], True, "every seed gave the same value, so the objective does not depend"),
        ([2.0, 2.0], [2.0, 2.0], False, "the difference is exact"),
    ],
    ids=["apart", "overlapping", "one-seed", "seed-independent", "seed-independent-equal"],
)
def test_the_verdict_claims_seed_noise_only_where_seeds_measured_it(better, worse, differ, says):
    out = pair({"a": tuned(better), "b": tuned(worse)}, "a", "b")
    assert out["differ"] is differ and says in out["verdict"]
    assert out["difference"] == pytest.approx(statistics.fmean(better) - statistics.fmean(worse))
    if len(set(better)) == 1 and len(better) > 1:
        assert "seed noise" not in out["verdict"]


def test_steps_to_target_needs_curves_that_resolve_time():
    """Curves of one point (evaluated only at the end) say nothing about when a target was reached; curves
    of several give the first step at or below the worst tuned mean (here 3.0: a at step 2, b at step 3),
    read from the fresh seeds' curves only (a tuning seed's, here seed 0 reaching it at once, is left out)."""
    optimizers = {name: {"tuned_lr": 0.1, "mean": mean} for name, mean in (("a", 2.0), ("b", 3.0))}
    tuning = {"step": [1, 2, 3], "value": [1.0, 1.0, 1.0]}

    def trials(curves):
        fresh = [{"optimizer": n, "lr": 0.1, "seed": 1, "curve": c} for n, c in curves.items()]
        return fresh + [{"optimizer": n, "lr": 0.1, "seed": 0, "curve": tuning} for n in curves]

    ends = {"a": {"step": [40], "value": [2.0]}, "b": {"step": [40], "value": [3.0]}}
    assert steps_to_target([t for t in trials(ends) if t["seed"] == 1], optimizers, "min", [1]) is None
    curves = {"a": {"step": [1, 2, 3], "value": [4.0, 2.5, 2.0]}, "b": {"step": [1, 2, 3], "value": [5.0, 4.0, 3.0]}}
    out = steps_to_target(trials(curves), optimizers, "min", [1])
    assert out["target"] == 3.0 and out["slowest"] == "b"
    assert out["optimizers"]["a"]["steps"] == 2 and out["optimizers"]["b"]["steps"] == 3
    assert out["optimizers"]["a"]["fraction_of_slowest"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("direction, worst", [("min", math.inf), ("max", -math.inf)])
def test_an_optimizer_whose_fresh_seed_failed_ranks_last_without_an_interval(direction, worst):
    """A fresh seed that diverged holds the worst value (+inf when minimising, −inf when maximising): its
    optimizer has no mean to compare and ranks last, whichever way the objective points."""
    optimizers = {
        "a": {"tuned_lr": 0.1, "values": [2.0, worst, 2.1], "mean": mean_std([2.0, worst, 2.1])[0]},
        "b": {"tuned_lr": 0.1, "values": [3.0, 3.1, 2.9], "mean": 3.0},
    }
    ranked, comparison, _ = compare(optimizers, direction)
    assert ranked == ["b", "a"] and comparison["differ"] is False
    assert "1 of 3 fresh seeds of a diverged, crashed or missed the target — no interval" in comparison["verdict"]
