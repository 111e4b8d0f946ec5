"""optiscope: a PyTorch laboratory for optimizers.

Optimizers make updates (``optiscope.optim``); instruments measure updates (``optiscope.monitor``,
``optiscope.curvature``, ``optiscope.probe``); experiments produce data (``optiscope.experiments``);
figures draw data (``optiscope.figures``). The names people reach for first are also here, at the top.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# name -> the package it lives in; imported on first use, so that `import optiscope` (and the command line, which
# must answer a Ctrl-C during its imports itself: __main__.py) does not import torch
EXPORTS = {
    "Monitor": "monitor",
    "Curvature": "monitor",
    "build_optimizer": "optim",
    "RECIPES": "optim",
    "sharpness": "curvature",
    "stability_threshold": "curvature",
    "update_direction": "probe",
    "probe_step": "probe",
    "suggest_lr": "suggest",
    "LRSuggestion": "suggest",
}
__all__ = list(EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API reference, which read the source (__all__ is EXPORTS')
    from .curvature import sharpness, stability_threshold  # noqa: F401
    from .monitor import Curvature, Monitor  # noqa: F401
    from .optim import RECIPES, build_optimizer  # noqa: F401
    from .probe import probe_step, update_direction  # noqa: F401
    from .suggest import LRSuggestion, suggest_lr  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module 'optiscope' has no attribute {name!r}")
    value = getattr(import_module(f".{EXPORTS[name]}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
