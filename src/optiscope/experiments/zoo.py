"""The named optimizer settings that experiments compare, so that "momentum" means one thing everywhere.

Each name maps to an optimizer class and the hyperparameters it gets besides the learning rate η; the
names are the keys of ``figures.style.OPTIMIZER_COLORS``. Hyperparameters not listed are the class's
defaults (torch.optim's). Two settings differ from their class's defaults, for a reason:

* ``muon``: weight decay λ = 0 (torch's default 0.1 would pull every weight towards 0 and hide what the
  orthogonalised step does) and Newton–Schulz in float32 (bfloat16 matmuls are slow on a CPU; on the
  small matrices of these experiments the orthogonal factor is the same up to rounding).
* ``adamw`` and ``adaml2``: λ = 0.01, the class default, spelled out because it is what separates them
  from ``adam``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ..optim import SGD, Adam, AdamL2, AdamW, Lion, Muon, RMSprop

SETTINGS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (SGD, {}),
    "momentum": (SGD, {"momentum": 0.9}),
    "nesterov": (SGD, {"momentum": 0.9, "nesterov": True}),
    "rmsprop": (RMSprop, {}),
    "adam": (Adam, {}),
    "adam-no-bc": (Adam, {"bias_correction": False}),
    "adamw": (AdamW, {"weight_decay": 0.01}),
    "adaml2": (AdamL2, {"weight_decay": 0.01}),
    "lion": (Lion, {}),
    "muon": (Muon, {"weight_decay": 0.0, "ns_dtype": torch.float32}),
}


def make_optimizer(name: str, params: Iterable[Tensor] | Iterable[dict], lr: float) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``params`` (tensors or param groups) with learning rate ``lr``."""
    cls, options = SETTINGS[name]
    return cls(params, lr=lr, **options)


def describe(name: str) -> str:
    """``name``'s setting as code, e.g. 'SGD(lr=η, momentum=0.9)', for results.json and figure legends."""
    cls, options = SETTINGS[name]
    shown = "".join(f", {k}={str(v).removeprefix('torch.')}" for k, v in options.items())
    return f"{cls.__name__}(lr=η{shown})"
