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
    """One number a sweep judges a run by, read from the results.json of a run of one optimizer.

    The value is v = ``read(results)``; ``direction`` says whether lower (``"min"``) or higher (``"max"``) is
    better. A run that diverged, or whose ``read`` gives None or NaN (a target never reached), has the worst
    value: +∞ for ``"min"``, −∞ for ``"max"``, so it is never the best.

    Args:
        description: what the number is, for the console, results.json and the figures, e.g. ``"final
            validation loss"``.
        direction: ``"min"`` or ``"max"``.
        read: ``read(results) -> value``, from the results of a run of one optimizer (a sweep trial;
            [`only_run`][optiscope.experiments.only_run] picks its run); None: the run never got there.
        curve: for an objective read from a learning curve, ``curve(results) -> (steps, values)``, so that a
            sweep can tell how many steps each tuned optimizer needs to reach a common target; None: no curve.
        curve_label: what the curve shows, e.g. ``"validation loss"`` for the objective ``"final validation
            loss"``; empty: the description.

    Raises:
        ValueError: ``direction`` is neither ``"min"`` nor ``"max"``.

    Examples:
        >>> from optiscope.experiments import Objective, only_run
        >>> final_loss = Objective("final loss", "min", lambda results: only_run(results["runs"])["loss"])
        >>> final_loss.value({"status": "ok", "runs": {"adam": {"loss": 0.25}}})
        0.25
        >>> final_loss.value({"status": "ok", "runs": {"adam": {"loss": None}}}), final_loss.worst
        (inf, inf)

    Notes:
        An experiment declares its objectives as ``OBJECTIVES = {"name": Objective(...)}`` in its module, the
        first the default; the experiment then needs a ``seed`` option, which the sweep sets per trial.
    """

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
        """The value of a run that diverged, crashed or never reached the target: +∞ for "min", −∞ for "max"."""
        return math.inf if self.direction == "min" else -math.inf

    def value(self, results: dict[str, Any]) -> float:
        """The objective of a finished run; ``worst`` when it diverged or has no value.

        Args:
            results: the run's results.json, of one optimizer.

        Returns:
            ``read(results)`` as a float; ``worst`` when ``results["status"]`` is ``"diverged"`` or the value is
                None or not finite.
        """
        if results.get("status") == "diverged":
            return self.worst
        value = self.read(results)
        return self.worst if value is None or not math.isfinite(float(value)) else float(value)


def only_run(runs: dict[str, Any] | list[Any]) -> Any:
    """The one run of a single-optimizer results.json (a sweep trial names exactly one).

    Args:
        runs: the results' runs, a dict (name -> run) or a list.

    Returns:
        That run's entry.

    Raises:
        ConfigError: ``runs`` holds no run or more than one.

    Examples:
        >>> from optiscope.experiments import only_run
        >>> only_run({"adam@0.001": {"loss": 0.25}})
        {'loss': 0.25}
        >>> only_run([{"loss": 0.25}, {"loss": 0.5}])
        Traceback (most recent call last):
        optiscope.errors.ConfigError: an objective is read from a run of one optimizer; these results hold 2 runs
    """
    items = list(runs.values()) if isinstance(runs, dict) else list(runs)
    if len(items) != 1:
        raise ConfigError(f"an objective is read from a run of one optimizer; these results hold {len(items)} runs")
    return items[0]


def validation_curve(results: dict[str, Any]) -> tuple[list[int], list[float]]:
    """(steps, validation losses) of a run of one optimizer whose evaluations are ``eval.step``/``eval.val_loss``."""
    evaluations = only_run(results["runs"])["eval"]
    return evaluations["step"], evaluations["val_loss"]


#: The last evaluation's validation loss (``final.val_loss``), with its curve: what ``optiscope sweep`` tunes ``lm``
#: and ``mlp`` for (the curve gives the steps each tuned optimizer needs to reach a common target loss).
VALIDATION_LOSS = Objective(
    "final validation loss",
    "min",
    lambda results: only_run(results["runs"])["final"]["val_loss"],
    curve=validation_curve,
    curve_label="validation loss",
)
