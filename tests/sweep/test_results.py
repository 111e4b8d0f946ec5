"""The pairwise verdict of a sweep: a claim about seed noise only where seeds measured some."""

import statistics

import pytest

from optiscope.sweep.results import pair, steps_to_target


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
    of several give the first step at or below the worst tuned mean (here 3.0: a at step 2, b at step 3)."""
    optimizers = {name: {"tuned_lr": 0.1, "mean": mean} for name, mean in (("a", 2.0), ("b", 3.0))}

    def trials(curves):
        return [{"optimizer": n, "lr": 0.1, "seed": 0, "curve": c} for n, c in curves.items()]

    ends = {"a": {"step": [40], "value": [2.0]}, "b": {"step": [40], "value": [3.0]}}
    assert steps_to_target(trials(ends), optimizers, "min") is None
    curves = {"a": {"step": [1, 2, 3], "value": [4.0, 2.5, 2.0]}, "b": {"step": [1, 2, 3], "value": [5.0, 4.0, 3.0]}}
    out = steps_to_target(trials(curves), optimizers, "min")
    assert out["target"] == 3.0 and out["slowest"] == "b"
    assert out["optimizers"]["a"]["steps"] == 2 and out["optimizers"]["b"]["steps"] == 3
    assert out["optimizers"]["a"]["fraction_of_slowest"] == pytest.approx(2 / 3)
