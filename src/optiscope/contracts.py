"""Is a JSON document shaped like its ``TypedDict``? Names the first places where it is not.

Every experiment writes down the shape of its ``results.json`` as a ``TypedDict``; ``problems`` checks a
document read back from disk against it (keys present, numbers where numbers belong, recursively), so
that a file of another experiment or of the wrong shape is reported as such instead of failing deep
inside a figure. Long lists are checked on their first entries and their last (``SAMPLED``).

A number the experiment was *given* rather than measured (a learning rate, a token frequency, a target
weight) is declared ``Positive``: finite and > 0. Measured numbers may be anything a run can produce (NaN,
inf, 0) and the figures draw them; a given one that is NaN or 0 cannot come from a run, and every figure
would divide by it or set axis limits from it, so the file is refused, naming the field.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Annotated, Any

#: Items of a list checked: the first few and the last (a curve holds thousands of points of one shape, and
#: a damaged file is damaged at its start or its end). Every entry of a mapping is checked: mappings hold
#: runs, optimizers and layers, a few dozen at most, and a run's damage can lie in any one of them.
SAMPLED = 3

#: The metadata that marks a number an experiment was given: ``Positive`` requires it finite and > 0.
GIVEN = "given: finite and > 0"
Positive = Annotated[float, GIVEN]


def problems(value: Any, expected: Any, where: str = "results", limit: int = 5) -> list[str]:
    """Up to ``limit`` descriptions of where ``value`` differs from the type ``expected``."""
    found: list[str] = []
    _check(value, expected, where, found, limit)
    return found[:limit]


def _check(value: Any, expected: Any, where: str, found: list[str], limit: int) -> None:
    if len(found) >= limit or expected is Any:
        return
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin is Annotated:
        _check(value, args[0], where, found, limit)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if GIVEN in expected.__metadata__ and number and not (math.isfinite(value) and value > 0):
            found.append(f"{where} is {value}, not a finite number > 0 (the experiment was given it)")
    elif typing.is_typeddict(expected):
        if not isinstance(value, dict):
            found.append(f"{where} is {_kind(value)}, not an object")
            return
        # include_extras keeps NotRequired[...]: under ``from __future__ import annotations`` (all our
        # modules) the class's own __required_keys__ cannot see it and lists every key as required.
        for key, hint in sorted(typing.get_type_hints(expected, include_extras=True).items()):
            marker = typing.get_origin(hint)
            required = marker is typing.Required or (
                marker is not typing.NotRequired and key in expected.__required_keys__
            )
            if marker in (typing.Required, typing.NotRequired):
                hint = typing.get_args(hint)[0]
            if key in value:
                _check(value[key], hint, f"{where}.{key}", found, limit)
            elif required:
                found.append(f"{where}.{key} is missing")
    elif origin in (typing.Union, types.UnionType):
        trials = [problems(value, option, where, 1) for option in args]
        if all(trials):
            found.append(min(trials, key=len)[0])
    elif origin is dict or expected is dict:
        if not isinstance(value, dict):
            found.append(f"{where} is {_kind(value)}, not an object")
        elif args:
            for key, item in value.items():
                _check(item, args[1], f"{where}.{key}", found, limit)
    elif origin is list or expected is list:
        if not isinstance(value, list):
            found.append(f"{where} is {_kind(value)}, not a list")
        elif args:
            for i in sorted({*range(min(SAMPLED, len(value))), len(value) - 1}) if value else ():
                _check(value[i], args[0], f"{where}[{i}]", found, limit)
    elif expected is float:
        if not (isinstance(value, int | float) and not isinstance(value, bool)):
            found.append(f"{where} is {_kind(value)}, not a number")
    elif expected is type(None) or expected is None:
        if value is not None:
            found.append(f"{where} is {_kind(value)}, not null")
    elif isinstance(expected, type) and not isinstance(value, expected):
        found.append(f"{where} is {_kind(value)}, not {expected.__name__}")


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"
