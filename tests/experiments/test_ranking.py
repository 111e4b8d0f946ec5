"""experiments.ranking: the runs in order of the number a study compares them on, and the winner's margin."""

import math

import pytest

from optiscope.experiments.ranking import rank


def test_runs_without_a_finite_number_are_left_out_and_ties_keep_the_order_they_ran_in():
    values = {"sgd": 2.75, "adam@0.05": None, "adam": 2.6, "adamw": 2.6, "lion": math.nan, "muon": math.inf}
    ranked = rank(values, "final validation loss", "min")
    assert ranked == {
        "by": "final validation loss",
        "direction": "min",
        "order": ["adam", "adamw", "sgd"],
        "margin": 0.0,
    }


def test_the_margin_is_the_distance_to_the_next_whichever_end_is_best():
    assert rank({"a": 3, "b": 10010, "c": 9000}, "cases correct", "max")["order"] == ["b", "c", "a"]
    assert rank({"a": 3, "b": 10010, "c": 9000}, "cases correct", "max")["margin"] == 1010
    assert rank({"a": 1.5, "b": 1.25}, "loss", "min")["margin"] == 0.25
    assert rank({"a": 1.5}, "loss", "min")["margin"] is None and rank({}, "loss", "min")["order"] == []


def test_a_direction_other_than_min_or_max_is_refused():
    with pytest.raises(ValueError, match="direction='lowest'; give 'min' or 'max'"):
        rank({"a": 1.0}, "loss", "lowest")
