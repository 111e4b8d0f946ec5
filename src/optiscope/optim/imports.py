"""An optimizer class named by its dotted path (``torch.optim.NAdam``, ``mypkg.opt.MyOpt``), imported or refused
in one line that says why and what would be valid.

The command line runs as a console script, whose ``sys.path`` lacks the current directory that ``python -m``
would put there: a module found nowhere else is also looked for there (appended, so it never shadows an
installed package), so ``mypkg/opt.py`` beside the command works as it would in a script.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import ModuleType

import torch

from ..errors import ConfigError


def import_optimizer(path: str) -> type[torch.optim.Optimizer]:
    """The ``torch.optim.Optimizer`` subclass at ``path`` (``module.Class``); ``ConfigError`` naming what is
    wrong: no such module, no such attribute (with the optimizers the module has), or not an optimizer class."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{path!r} is not a dotted path module.Class; e.g. torch.optim.NAdam")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"cannot import {path!r}: no module named {e.name!r} (install it, or put its folder on PYTHONPATH)"
        ) from None
    except Exception as e:  # the module itself failed while importing: its own error, in one line
        said = " ".join(str(e).split())
        raise ConfigError(
            f"cannot import {path!r}: importing {module_name} raised {type(e).__name__}: {said}"
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        found = ", ".join(optimizers_in(module)) or "none"
        raise ConfigError(f"cannot import {path!r}: {module_name} has no {attr!r}; its optimizer classes: {found}")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ConfigError(
            f"{path!r} is not a torch.optim.Optimizer subclass; name an optimizer class, e.g. torch.optim.NAdam"
        )
    return cls


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)``, retried with the current directory on ``sys.path`` (appended) when its
    top-level package is found nowhere else."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if e.name != name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(name)


def optimizers_in(module: ModuleType) -> list[str]:
    """The names of the optimizer classes ``module`` holds (what a mistyped path could have meant)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and inspect.isclass(value)
        and issubclass(value, torch.optim.Optimizer)
        and value is not torch.optim.Optimizer
    )
