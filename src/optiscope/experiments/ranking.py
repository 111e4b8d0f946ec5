"""Which run did best, by the one number a study compares them on: the runs in order and the winner's margin.

An experiment records a ``Ranking`` in its results so that the report can say who won and by how much, reading
every number from ``results.json`` (the report computes nothing of its own).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypedDict


class Ranking(TypedDict):
    """How the runs of a study compare on one number.

    ``by`` says what was compared, in words; ``direction`` which end is best ("min" or "max"); ``order`` the runs
    with a finite value, best first (runs that tie keep the order they ran in); ``margin`` how far the best is
    ahead of the next, |v₂ − v₁| (None with fewer than two such runs).
    """

    by: str
    direction: str
    order: list[str]
    margin: float | None


def rank(values: Mapping[str, float | int | None], by: str, direction: str) -> Ranking:
    """The ``Ranking`` of runs by ``values`` (run -> its number; None, NaN or ±∞ for a run that has none: it
    diverged, or never reached its target).

    Args:
        values: each run's number, in the order the runs ran.
        by: what the number is, in words, e.g. ``"final validation loss"``.
        direction: ``"min"`` (smaller is better) or ``"max"``.

    Returns:
        The ``Ranking``.

    Raises:
        ValueError: ``direction`` is neither ``"min"`` nor ``"max"``.

    Example:
        >>> rank({"sgd": 2.75, "adam@0.05": None, "adamw": 2.6}, "final validation loss", "min")["order"]
        ['adamw', 'sgd']
    """
    if direction not in ("min", "max"):
        raise ValueError(f"direction={direction!r}; give 'min' or 'max'")
    finite = {name: float(v) for name, v in values.items() if v is not None and math.isfinite(v)}
    sign = 1 if direction == "min" else -1
    order = sorted(finite, key=lambda name: sign * finite[name])  # sorted() is stable: ties keep the run order
    margin = abs(finite[order[1]] - finite[order[0]]) if len(order) > 1 else None
    return {"by": by, "direction": direction, "order": order, "margin": margin}
