"""contracts.problems against hand-written documents: required and NotRequired keys under postponed
annotations (this module, like every optiscope module, uses ``from __future__ import annotations``)."""

from __future__ import annotations

import math
from typing import NotRequired, Required, TypedDict

from optiscope.contracts import Positive, problems


class Inner(TypedDict):
    values: list[float]


class Shape(TypedDict):
    name: str
    series: NotRequired[Inner]


class Given(TypedDict):
    lr: Positive
    etas: list[Positive]
    measured: float
    later: NotRequired[Positive]


class Partial(TypedDict, total=False):
    note: str
    count: Required[float]


def test_a_not_required_key_may_be_absent_but_is_checked_when_present():
    assert problems({"name": "x"}, Shape) == []
    assert problems({"name": "x", "series": {"values": [1.0, 2]}}, Shape) == []
    assert problems({"name": "x", "series": {"values": ["a"]}}, Shape) == [
        "results.series.values[0] is a str, not a number"
    ]
    assert problems({"series": {"values": []}}, Shape) == ["results.name is missing"]


def test_required_inside_a_partial_typeddict():
    assert problems({"count": 3}, Partial) == []
    assert problems({"note": "n"}, Partial) == ["results.count is missing"]


class Runs(TypedDict):
    runs: dict[str, Inner]


def test_every_entry_of_a_mapping_and_the_last_of_a_list_are_checked():
    """A run's damage may lie in its fifth entry, and a cut-off curve at its end."""
    fine = {f"run{i}": {"values": [1.0] * 10} for i in range(5)}
    assert problems({"runs": fine}, Runs) == []
    assert problems({"runs": {**fine, "run4": {}}}, Runs) == ["results.runs.run4.values is missing"]
    cut = {**fine, "run0": {"values": [1.0] * 9 + ["1."]}}
    assert problems({"runs": cut}, Runs) == ["results.runs.run0.values[9] is a str, not a number"]
    assert problems({"runs": {"run0": {"values": []}}}, Runs) == []


def test_a_given_number_must_be_finite_and_positive_a_measured_one_need_not():
    """A learning rate (``Positive``) that is NaN, ±inf, 0 or negative is named; a measured float may be any of
    those; a tiny positive rate passes. The oracle: math.isfinite(x) and x > 0."""
    for bad in (math.nan, math.inf, -math.inf, 0.0, -1.0):
        found = problems({"lr": bad, "etas": [1.0, bad], "measured": bad, "later": bad}, Given)
        assert found == [
            f"results.etas[1] is {bad}, not a finite number > 0 (the experiment was given it)",
            f"results.later is {bad}, not a finite number > 0 (the experiment was given it)",
            f"results.lr is {bad}, not a finite number > 0 (the experiment was given it)",
        ]
    assert problems({"lr": 1e-300, "etas": [3], "measured": math.nan}, Given) == []
    assert problems({"lr": "fast", "etas": [], "measured": 0.0}, Given) == ["results.lr is a str, not a number"]
