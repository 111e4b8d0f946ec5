"""What a sweep judges a run by: each experiment that trains declares its ``OBJECTIVES``.

An ``Objective`` reads one number from the ``results.json`` of a run that trained a single optimizer
(what a sweep trial is): ``read(results) -> value``, where ``None`` (or NaN) means the run never got
there (a target not reached) and counts as the worst value. ``direction`` says which way is better.
An objective that is read from a learning curve also gives ``curve(results) -> (steps, values)``, so a
sweep can ask how many steps each tuned optimizer needs to reach a common target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

DIRECTIONS = ("min", "max")


@dataclass(frozen=True)
class Objective:
    description: str
    direction: str
    read: Callable[[dict[str, Any]], float | None]
    curve: Callable[[dict[str, Any]], tuple[list[int], list[float]]] | None = None
    #: what the curve shows, e.g. 'validation loss' for the objective 'final validation loss'
    curve_label: str = ""

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r}; valid: {', '.join(DIRECTIONS)}")

    @property
    def worst(self) -> float:
        """The value of a run that diverged, crashed or never reached the target."""
        return math.inf if self.direction == "min" else -math.inf

    def value(self, results: dict[str, Any]) -> float:
        """The objective of a finished run; ``worst`` when it diverged or has no value."""
        if results.get("status") == "diverged":
            return self.worst
        value = self.read(results)
        return self.worst if value is None or not math.isfinite(float(value)) else float(value)


def only_run(runs: dict[str, Any] | list[Any]) -> Any:
    """The one run of a single-optimizer results.json (a sweep trial names exactly one)."""
    items = list(runs.values()) if isinstance(runs, dict) else list(runs)
    if len(items) != 1:
        raise ConfigError(f"an objective is read from a run of one optimizer; these results hold {len(items)} runs")
    return items[0]
