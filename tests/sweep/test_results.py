"""The pairwise verdict of a sweep: a claim about seed noise only where seeds measured some."""

import statistics

import pytest

from optiscope.sweep.results import pair


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
