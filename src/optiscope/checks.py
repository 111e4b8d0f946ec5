"""Predicates for validating what a user passes in (each layer words its own error around them).

A bool is an int to Python but never a number or a count here: ``every=True`` is a mistake, not 1.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def is_number(x: Any) -> bool:
    """A real number (not a bool); it may be infinite or NaN."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def finite(x: Any) -> bool:
    """A real number (not a bool) that is neither infinite nor NaN."""
    return is_number(x) and math.isfinite(x)


def positive(x: Any) -> bool:
    return finite(x) and x > 0


def non_negative(x: Any) -> bool:
    return finite(x) and x >= 0


def is_count(x: Any, least: int = 1) -> bool:
    """An integer (not a bool) >= ``least``."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= least


#: What ``is_seed`` takes, as error messages say it.
SEEDS = "an integer from -2**63 to 2**64 - 1"


def is_seed(x: Any) -> bool:
    """An integer (not a bool) that torch's generators take as a seed: from -2**63 to 2**64 - 1."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and -(2**63) <= x < 2**64


def is_optimizer(x: Any) -> bool:
    """Something with a torch optimizer's interface (``param_groups``, ``state``, ``step``): ours, torch's, or a
    library's wrapper that forwards them (checked by interface, not by type)."""
    groups = getattr(x, "param_groups", None)
    return isinstance(groups, list) and hasattr(x, "state") and callable(getattr(x, "step", None))


def require_optimizer(x: Any, who: str) -> None:
    """A TypeError naming ``who``'s bad ``optimizer`` unless ``is_optimizer(x)``."""
    if not is_optimizer(x):
        raise TypeError(f"{who}: optimizer={x!r} is not an optimizer; give a torch.optim.Optimizer (ours or torch's)")
