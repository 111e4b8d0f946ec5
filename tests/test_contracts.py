"""contracts.problems against hand-written documents: required and NotRequired keys under postponed
annotations (this module, like every optiscope module, uses ``from __future__ import annotations``)."""

from __future__ import annotations

from typing import NotRequired, Required, TypedDict

from optiscope.contracts import problems


class Inner(TypedDict):
    values: list[float]


class Shape(TypedDict):
    name: str
    series: NotRequired[Inner]


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
