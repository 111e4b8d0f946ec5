"""The pairwise verdict of a sweep: a claim about seed noise only where seeds measured some."""

import math
import statistics

import pytest

from optiscope.sweep import results
from optiscope.sweep.results import compare, pair, steps_to_target
from optiscope.sweep.stats import mean_std


def tuned(values, elsewhere=None):
    """An optimizer's fresh ``values`` at its tuned lr 0.1, where its tuning seeds gave them too, and its tuning
    seeds' values at another lr (``elsewhere``: by default the same value for each seed, as fresh)."""
    tuning = {"lr": 0.1, "values": values, "mean": statistics.fmean(values), "seeds": list(range(len(values)))}
    other = [values[0]] * len(values) if elsewhere is None else elsewhere
    other = {"lr": 0.01, "values": other, "mean": statistics.fmean(other), "seeds": tuning["seeds"]}
    return {"values": values, "mean": statistics.fmean(values), "tuned_lr": 0.1, "sensitivity": [other, tuning]}


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


def test_fresh_seeds_that_tie_by_chance_claim_nothing():
    """An objective read at evaluations (steps to a target, checked every 500 steps) ties seeds that differ:
    three fresh seeds each at 2000 and 2500 steps, while the tuning seeds at another lr took 1500, 2000 and 2500.
    The seed matters, its noise at the tuned lr is not measured: no difference is claimed (it had been "exact",
    beyond doubt, where [2000, 2000, 2000] against [2000, 2500, 2500] is within seed noise)."""
    chance = pair({"a": tuned([2000.0] * 3, [1500.0, 2000.0, 2500.0]), "b": tuned([2500.0] * 3)}, "a", "b")
    assert chance["differ"] is False and "the seed noise is not measured" in chance["verdict"]
    assert "does not depend on the seed" not in chance["verdict"]
    assert all(math.isnan(x) for x in chance["interval"])  # not Welch's [−500, −500]: no interval, no claim
    spread = pair({"a": tuned([2000.0] * 3), "b": tuned([2000.0, 2500.0, 2500.0])}, "a", "b")
    assert spread["differ"] is False  # Welch's interval, by hand: Δ = −333, half-width 4.30 · 289/√3 = 717
    half = 4.303 * statistics.stdev([2000.0, 2500.0, 2500.0]) / math.sqrt(3)
    assert spread["interval"] == pytest.approx([-1000 / 3 - half, -1000 / 3 + half], rel=1e-3)


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


def test_fresh_seeds_that_tie_by_chance_have_no_interval():
    """Fresh seeds tied at 1.0 while the tuning seeds at lr 0.1 gave 2.0 and 3.0: their spread of zero is no
    measured seed noise, so no interval (Student's of zero width, [1, 1], had called the mean exact); where every
    seed gives one value at every lr, the mean is exact and its interval the point."""

    def trial(lr, seed, value):
        return {"optimizer": "a", "lr": lr, "seed": seed, "objective": value}

    tuning = [trial(0.001, 0, 1.5), trial(0.001, 1, 1.5), trial(0.01, 0, 1.0), trial(0.01, 1, 1.0)]
    fresh = [trial(0.01, 2, 1.0), trial(0.01, 3, 1.0)]
    coarse = results.tuned([*tuning, trial(0.1, 0, 2.0), trial(0.1, 1, 3.0), *fresh], (0, 1), (2, 3), "min", 0.01)
    assert coarse["tuned_lr"] == 0.01 and coarse["values"] == [1.0, 1.0]
    assert all(math.isnan(x) for x in coarse["interval"])
    exact = results.tuned([*tuning, trial(0.1, 0, 2.0), trial(0.1, 1, 2.0), *fresh], (0, 1), (2, 3), "min", 0.01)
    assert exact["interval"] == [1.0, 1.0]
