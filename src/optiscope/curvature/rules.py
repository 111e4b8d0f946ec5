r"""Which update rule an optimizer's step is, where optiscope knows it: shared by the stability thresholds
(``thresholds.py``) and the monitor's effective learning rates (``monitor/stats.py``).

A rule is known for a class itself, or for a subclass that keeps the class's ``step`` (and, for optiscope's,
its ``update_group``, where the rule is written); a subclass that overrides either may step otherwise (a zoo's
Adam with its own ``step``), and then has no known rule rather than its parent's.
"""

from __future__ import annotations

import inspect
import math
from typing import Any


def known_class(optimizer: Any, classes: dict[type, Any]) -> type | None:
    """The class among ``classes`` whose step ``optimizer`` (an optimizer, or its class) takes: its own class, or
    the nearest of them it inherits from when it keeps that class's ``step`` (and, for optiscope's, its
    ``update_group``, where the rule is written). None when it is none of them, or overrides either: it may step
    otherwise (a zoo's Adam subclass)."""
    own = optimizer if isinstance(optimizer, type) else type(optimizer)
    for cls in own.__mro__:
        if cls in classes:
            # torch's classes have no update_group: a subclass adding one still takes their step
            methods = [m for m in ("step", "update_group") if _method(cls, m) is not None]
            same = all(_method(own, m) is _method(cls, m) for m in methods)
            return cls if same else None
    return None


def _method(cls: type, name: str) -> Any:
    """``cls.name`` without the wrappers torch puts around ``step`` (its profiling hook); None without one."""
    method = getattr(cls, name, None)
    return None if method is None else inspect.unwrap(method)


def radam_rectification(beta2: float, t: float) -> float | None:
    """r_t of torch's RAdam at step t: √((ρ_t − 4)(ρ_t − 2)ρ_∞ / ((ρ_∞ − 4)(ρ_∞ − 2)ρ_t)), with ρ_∞ = 2/(1 − β₂) − 1
    and ρ_t = ρ_∞ − 2tβ₂ᵗ/(1 − β₂ᵗ); None where ρ_t ≤ 5 (the step is then η m̂, not rectified)."""
    rho_inf = 2 / (1 - beta2) - 1
    rho = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    if rho <= 5:
        return None
    return math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
