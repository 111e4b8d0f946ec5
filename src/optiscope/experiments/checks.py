"""Predicates for validating experiment Configs (used with ``experiments.require``)."""

from __future__ import annotations

import math
from typing import Any


def finite(x: Any) -> bool:
    """A real number (not a bool) that is neither infinite nor NaN."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def positive(x: Any) -> bool:
    return finite(x) and x > 0
