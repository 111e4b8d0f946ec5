"""optiscope.suggest: a learning rate before the sweep, from the optimizer's own stability threshold.

``suggest_lr`` probes a copy of the model for a few steps (``session``), measures the curvature that the
optimizer's threshold c/η bounds (``curvature``), and puts η at a fitted factor σ of the edge c/λ (``methods``);
``LRSuggestion`` holds the η, its band and the evidence. Short probes prescribe, so they sit beside ``probe``,
under the loop that would use them: ``experiments``, ``sweep`` and the command line call it.
"""

from .suggest import suggest_lr
from .suggestion import LRSuggestion

__all__ = ["suggest_lr", "LRSuggestion"]
