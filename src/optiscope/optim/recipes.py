r"""Named optimizer recipes: one name, one update rule with one set of hyperparameters, everywhere.

``RECIPES`` is the table (its docstring lists every recipe), ``build_optimizer`` builds one, and
``parse_runs`` reads the command line's ``--optimizers name[@lr],...`` against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .adam import Adam, AdamL2, AdamW
from .lion import Lion
from .muon import Muon, muon_with_adamw
from .rmsprop import RMSprop
from .sgd import SGD

#: The AdamW part of ``muon+adamw`` runs at this fraction of the recipe's learning rate.
MUON_ADAMW_LR_RATIO = 1 / 20


@dataclass(frozen=True)
class Recipe:
    """An optimizer class and the hyperparameters it always gets (besides η and, if ``decays``, λ).

    A recipe is the update rule ``cls(params, lr=η, **options)``, with ``weight_decay=λ`` from the
    experiment when it ``decays`` and λ = 0 otherwise. ``build_optimizer`` builds one by name from ``RECIPES``.

    Args:
        cls: the optimizer class, e.g. ``SGD``.
        options: the keyword arguments it always gets, e.g. ``{"momentum": 0.9}``.
        decays: whether λ (``--weight-decay``) reaches it; without, every group gets ``weight_decay=0``.
        splits_model: whether it needs the model to split into Muon and AdamW parameters (``muon+adamw``).

    Examples:
        >>> from optiscope.optim import RECIPES, SGD, Recipe
        >>> RECIPES["nesterov"].describe()
        'SGD(lr=η, momentum=0.9, nesterov=True)'
        >>> Recipe(SGD, {"momentum": 0.5}, decays=True).describe()
        'SGD(lr=η, momentum=0.5, weight_decay=λ)'
    """

    cls: type[torch.optim.Optimizer]
    options: dict[str, Any] = field(default_factory=dict)
    decays: bool = False
    splits_model: bool = False

    def describe(self) -> str:
        """The recipe as code, for results.json and legends.

        Returns:
            A string such as ``'SGD(lr=η, momentum=0.9)'``, with ``weight_decay=λ`` where it decays; for
            ``muon+adamw`` both parts and their learning rates.
        """
        if self.splits_model:
            return (
                "Muon(lr=η, weight_decay=0) on hidden matrices + "
                f"AdamW(lr=η/{round(1 / MUON_ADAMW_LR_RATIO)}, betas=(0.9, 0.95), weight_decay=0) on the rest"
            )
        shown = "".join(f", {k}={str(v).removeprefix('torch.')}" for k, v in self.options.items())
        decay = ", weight_decay=λ" if self.decays else ""
        return f"{self.cls.__name__}(lr=η{shown}{decay})"


RECIPES: dict[str, Recipe] = {
    "sgd": Recipe(SGD),
    "momentum": Recipe(SGD, {"momentum": 0.9}),
    "nesterov": Recipe(SGD, {"momentum": 0.9, "nesterov": True}),
    "rmsprop": Recipe(RMSprop),
    "adam": Recipe(Adam),
    "adam-no-bc": Recipe(Adam, {"bias_correction": False}),
    "adamw": Recipe(AdamW, decays=True),
    "adaml2": Recipe(AdamL2, decays=True),
    "lion": Recipe(Lion, decays=True),
    "muon": Recipe(Muon, {"ns_dtype": None, "weight_decay": 0.0}),  # torch.optim.Muon's default λ is 0.1
    "muon+adamw": Recipe(Muon, splits_model=True),
}
"""Every named optimizer recipe (name -> ``Recipe``): the one vocabulary of the experiments, sweeps and legends.

Every experiment, its ``--optimizers`` option, the sweep and every figure legend use these names, so
"momentum" always means SGD with μ = 0.9 and "sgd" always means plain SGD. Only two numbers come from the
experiment: the learning rate η (``name@lr``, or the experiment's default) and, for the recipes that decay
weights, λ (``--weight-decay``). Every other hyperparameter is torch.optim's default unless the table says
otherwise.

| name | recipe | λ from the experiment |
|---|---|---|
| `sgd` | `SGD(lr=η)` | no |
| `momentum` | `SGD(lr=η, momentum=0.9)` (heavy ball) | no |
| `nesterov` | `SGD(lr=η, momentum=0.9, nesterov=True)` | no |
| `rmsprop` | `RMSprop(lr=η)` (α = 0.99) | no |
| `adam` | `Adam(lr=η)` (β = 0.9, 0.999) | no |
| `adam-no-bc` | `Adam(lr=η, bias_correction=False)` | no |
| `adamw` | `AdamW(lr=η, weight_decay=λ)` (β = 0.9, 0.999), decoupled decay | yes |
| `adaml2` | `AdamL2(lr=η, weight_decay=λ)`: λθ added to the gradient | yes |
| `lion` | `Lion(lr=η, weight_decay=λ)` (β = 0.9, 0.99), decoupled decay | yes |
| `muon` | `Muon(lr=η, ns_dtype=None, weight_decay=0.0)`, every parameter a matrix | no (λ = 0, not torch's 0.1) |
| `muon+adamw` | Muon (η, λ = 0) on hidden matrices; AdamW (η/20, β = 0.9, 0.95, λ = 0) on the rest | no (λ = 0) |

``muon`` needs every parameter to be a matrix (it orthogonalises the update); a model with embeddings,
norms and biases takes ``muon+adamw``, which splits it the standard way (``split_params_for_muon``) and
gives the AdamW part 1/20 of η: at Muon's usual η = 0.02 that is AdamW's usual 1e-3. Newton–Schulz runs
in float32 on the CPU (bfloat16 products are emulated there and ~10× slower) and in bfloat16 on a GPU.
"""


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(RECIPES)}")
    return RECIPES[name]


def build_optimizer(
    name: str,
    params: nn.Module | Iterable[Tensor] | Iterable[dict[str, Any]],
    lr: float,
    weight_decay: float = 0.0,
    *,
    decay_vectors: bool = True,
) -> torch.optim.Optimizer:
    """Build the optimizer of recipe ``name`` over ``params`` with learning rate η = ``lr``.

    The result is ``RECIPES[name].cls(groups, lr=η, **options)`` with λ = ``weight_decay`` in each group
    for the recipes that decay and λ = 0 for the others.

    Args:
        name: a key of ``RECIPES`` (``"sgd"``, ``"adamw"``, ``"muon+adamw"``, …).
        params: a model (its trainable parameters), tensors, or param groups. ``muon+adamw`` needs the
            model, to find its hidden matrices.
        lr: η.
        weight_decay: λ ≥ 0, for the recipes that decay (``adamw``, ``adaml2``, ``lion``); ignored by the others.
        decay_vectors: with a model, False leaves parameters with fewer than two dimensions (norms, biases)
            undecayed, as nanoGPT does; ignored for tensors and param groups.

    Returns:
        The optimizer, a ``torch.optim.Optimizer`` (a ``MuonWithAdamW`` for ``muon+adamw``).

    Raises:
        ValueError: ``name`` is not a recipe; or the optimizer refuses a value (``lr < 0``, a tensor that is
            not 2-D for ``muon``).
        TypeError: ``muon+adamw`` with ``params`` that are not an ``nn.Module``.

    Examples:
        >>> import torch
        >>> from optiscope.optim import build_optimizer
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 1))
        >>> optimizer = build_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, decay_vectors=False)
        >>> type(optimizer).__name__, [g["weight_decay"] for g in optimizer.param_groups]  # λ on matrices only
        ('AdamW', [0.1, 0.0])

    Notes:
        - In param groups a group's own ``weight_decay`` wins for the recipes that decay; the others set
          ``weight_decay=0`` in every group, the group's own included.
        - ``muon+adamw`` ignores ``weight_decay`` and ``decay_vectors`` (λ = 0 in both parts) and gives AdamW
          η/20.
    """
    rule = recipe(name)
    if rule.splits_model:
        if not isinstance(params, nn.Module):
            raise TypeError(f"{name} splits a model into Muon and AdamW parameters: pass the nn.Module")
        return muon_with_adamw(params, lr=lr, adamw_lr=lr * MUON_ADAMW_LR_RATIO)
    decay = weight_decay if rule.decays else 0.0
    groups = param_groups(params, decay, decay_vectors)
    if not rule.decays:
        groups = [{**g, "weight_decay": 0.0} for g in groups]
    return rule.cls(groups, lr=lr, **rule.options)


def param_groups(
    params: nn.Module | Iterable[Tensor] | Iterable[dict[str, Any]], weight_decay: float, decay_vectors: bool
) -> list[dict[str, Any]]:
    """``params`` as param groups carrying ``weight_decay`` (groups that set their own keep it)."""
    if isinstance(params, nn.Module):
        trainable = [p for p in params.parameters() if p.requires_grad]
        if decay_vectors:
            return [{"params": trainable, "weight_decay": weight_decay}]
        matrices = [p for p in trainable if p.ndim >= 2]
        vectors = [p for p in trainable if p.ndim < 2]
        groups = [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]
        return [g for g in groups if g["params"]]
    items = [params] if isinstance(params, Tensor) else list(params)
    if items and all(isinstance(g, dict) for g in items):
        return [{"weight_decay": weight_decay, **g} for g in items]
    return [{"params": items, "weight_decay": weight_decay}]


@dataclass(frozen=True)
class RunSpec:
    """One training run as named on the command line: ``optimizer[@lr]`` (a name from ``optim.RECIPES``).
    ``lr`` is None where the experiment chooses it (landscapes: its whole grid)."""

    label: str
    optimizer: str
    lr: float | None


def parse_runs(
    text: str | tuple[str, ...] | list[str],
    default_lr: dict[str, float] | float | None,
    valid: tuple[str, ...] | None = None,
) -> tuple[RunSpec, ...]:
    """``--optimizers``: 'sgd,adam@0.05' -> RunSpecs. Without ``@lr`` a run takes ``default_lr`` (one
    number, the experiment's learning rate per optimizer, or None). ``valid`` narrows the recipes allowed."""
    valid = tuple(valid or (default_lr if isinstance(default_lr, dict) else RECIPES))
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else [str(s).strip() for s in text]
    _require(
        all(items) or not any(items),
        f"--optimizers has an empty item in {','.join(items)!r}; name each run once, separated by commas",
    )
    specs = []
    for item in [s for s in items if s]:
        name, at, lr_text = item.partition("@")
        where = f" in {item!r}" if item != name else ""
        _require(name in valid, f"--optimizers: unknown optimizer {name!r}{where}; valid: {', '.join(valid)}")
        _require(not at or lr_text.strip(), f"--optimizers: {item!r} has no learning rate after '@'; write {name}@0.01")
        lr = default_lr[name] if isinstance(default_lr, dict) else default_lr
        if lr_text:
            try:
                lr = float(lr_text)
            except ValueError:
                raise ConfigError(
                    f"--optimizers: {item!r} has a learning rate {lr_text!r} that is not a number"
                ) from None
            _require(
                math.isfinite(lr) and lr > 0, f"--optimizers: {item!r}: the learning rate must be a finite number > 0"
            )
        specs.append(RunSpec(item, name, lr))
    _require(bool(specs), f"--optimizers is empty; name one or more of {', '.join(valid)} (optionally as name@lr)")
    labels = [s.label for s in specs]
    _require(len(set(labels)) == len(labels), f"--optimizers names a run twice: {', '.join(labels)}")
    seen: dict[tuple[str, float | None], str] = {}
    for spec in specs:  # the same recipe at the same lr, written two ways ("sgd@0.2,sgd@.2", or the default lr)
        twin = seen.setdefault((spec.optimizer, spec.lr), spec.label)
        if twin != spec.label:
            raise ConfigError(f"--optimizers: {twin} and {spec.label} are one run ({spec.optimizer} at lr {spec.lr:g})")
    return tuple(specs)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
