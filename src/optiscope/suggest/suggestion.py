"""What a learning-rate suggestion says: the η, the band around it, what it spent and the evidence it read."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


def shown(x: float | None) -> str:
    """A learning rate or a measurement in three significant digits; "—" for none."""
    return "—" if x is None or not math.isfinite(x) else f"{x:.3g}"


@dataclass(frozen=True)
class LRSuggestion:
    """A learning rate suggested before training, with the band it believes in and the evidence behind it.

    What [`suggest_lr`][optiscope.suggest.suggest_lr] returns. ``lr`` = σ · ``edge``, where ``edge`` is the η at
    which the measured (preconditioned) sharpness reaches the optimizer's stability threshold c/η (or a lower
    noise-limited step, for ``limits``) and σ the
    method's factor, fitted on the calibration tasks of the evaluation (``docs/experiments/suggest-lr.md``); a
    fallback (an optimizer without a known threshold) says so in ``method`` and ``notes``.

    Args:
        lr: the suggested learning rate η (the peak of a schedule).
        low: the low end of the band it believes in (on the calibration tasks, the tuned η was at least this
            far below the suggestion in only a tenth of the cases).
        high: the high end of that band.
        edge: the η at which the measured sharpness reaches the threshold; for ``limits`` (the default) the lower
            of that and the noise-limited step, ``notes`` saying which; the fallback: the range test's η.
        sigma: the factor σ, ``lr`` / ``edge``.
        method: which method measured it (``METHODS``), or ``"fallback: range test"``.
        optimizer: the optimizer's class name.
        threshold: the threshold's formula, e.g. ``"38/η"``; ``""`` without one.
        steps_used: forward+backward passes spent, each on one batch (a Hessian-vector product counts as two).
        steps: the passes it was allowed.
        probes: the evidence, one dict per measurement: ``kind`` ("step", "sharpness", "curvature", "range"),
            ``step`` (probe steps taken before it), ``lr`` (the probe's η then), ``loss``, and for a measurement
            ``sharpness`` (λ₁, or the curvature along a direction), ``threshold`` (c/η at η = 1, i.e. c) and
            ``edge`` (c/λ).
        notes: sentences a reader needs (a fallback, a measurement that failed and was left out).

    Examples:
        >>> from optiscope.suggest import LRSuggestion
        >>> s = LRSuggestion(3e-3, 1.5e-3, 6e-3, 9e-3, 1 / 3, "sharpness", "AdamW", "38/η", 18, 20)
        >>> s.lr, s.to_dict()["band"]
        (0.003, [0.0015, 0.006])
        >>> print(s.explain().splitlines()[0])
        AdamW: lr 0.003 (band 0.0015 … 0.006), 18 of 20 forward+backward passes
    """

    lr: float
    low: float
    high: float
    edge: float
    sigma: float
    method: str
    optimizer: str
    threshold: str
    steps_used: float
    steps: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def explain(self) -> str:
        """A few lines a person reads: the η and its band, what was measured, and how η follows from it.

        Returns:
            Lines separated by newlines.
        """
        lines = [
            f"{self.optimizer}: lr {shown(self.lr)} (band {shown(self.low)} … {shown(self.high)}), "
            f"{self.steps_used:g} of {self.steps} forward+backward passes"
        ]
        measured = [p for p in self.probes if p["kind"] == "sharpness"]  # not the noise limit's curvature
        if measured:
            values = ", ".join(shown(p["sharpness"]) for p in measured)
            lines.append(f"  {self.method}: λ₁ = {values} ({len(measured)} measurement(s))")
            if self.method == "limits":  # the note below gives both limits
                lines.append(f"  the suggestion is σ = {self.sigma:.3g} × the lower limit, η = {shown(self.edge)}")
            else:
                lines.append(
                    f"  the threshold {self.threshold} puts the edge of stability at η = {shown(self.edge)}; "
                    f"the suggestion is σ = {self.sigma:.3g} × it"
                )
        else:
            lines.append(f"  {self.method}: η = {shown(self.edge)}, × {self.sigma:.3g}")
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The suggestion as plain data (``suggestion.json``'s entries): every field, and ``band`` = [low, high].

        Returns:
            A dict of JSON-able values.
        """
        return {**dataclasses.asdict(self), "band": [self.low, self.high]}
