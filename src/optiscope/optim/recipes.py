r"""Named optimizer recipes: one name, one update rule with one set of hyperparameters, everywhere.

``RECIPES`` is the built-in table (its docstring lists every recipe), ``build_optimizer`` builds one, and
``parse_runs`` reads the command line's ``--optimizers name[@lr],...``. An optimizer spec is one of three
things, resolved here alone (``recipe``) so that ``run``, ``sweep`` and its pool and Ray workers agree:

* a built-in recipe name: ``adamw``;
* a dotted path to an importable ``torch.optim.Optimizer`` subclass: ``torch.optim.NAdam``,
  ``pytorch_optimizer.SOAP``, ``mypkg.opt.MyOpt`` (built as ``cls(params, lr=η)``, every other argument the
  class's default);
* a recipe the user registered (``register_recipe``), e.g. from a recipes file (``load_recipes``).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .adam import Adam, AdamL2, AdamW
from .imports import import_optimizer
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
    experiment when it ``decays``; otherwise λ is the class's own (its default, 0 for every built-in recipe,
    or ``options``'s). ``build_optimizer`` builds one by name: from ``RECIPES``, the recipes registered with
    ``register_recipe``, or a dotted path.

    Args:
        cls: the optimizer class, e.g. ``SGD`` or ``torch.optim.NAdam``.
        options: the keyword arguments it always gets, e.g. ``{"momentum": 0.9}``.
        decays: whether λ (``--weight-decay``) reaches it, as ``weight_decay=λ``.
        splits_model: whether it needs the model to split into Muon and AdamW parameters (``muon+adamw``).
        lr: its default η, where the experiment has no learning rate of its own for it and the run names none
            (``name@lr``); None: the run must name one. Built-in recipes leave it to the experiments.

    Examples:
        >>> import torch
        >>> from optiscope.optim import RECIPES, SGD, Recipe
        >>> RECIPES["nesterov"].describe()
        'SGD(lr=η, momentum=0.9, nesterov=True)'
        >>> Recipe(SGD, {"momentum": 0.5}, decays=True).describe()
        'SGD(lr=η, momentum=0.5, weight_decay=λ)'
        >>> Recipe(torch.optim.NAdam, {"betas": (0.95, 0.98)}, lr=3e-3).describe()
        'torch.optim.nadam.NAdam(lr=η, betas=(0.95, 0.98))'
    """

    cls: type[torch.optim.Optimizer]
    options: dict[str, Any] = field(default_factory=dict)
    decays: bool = False
    splits_model: bool = False
    lr: float | None = None

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
        return f"{class_name(self.cls)}(lr=η{shown}{decay})"


def class_name(cls: type) -> str:
    """An optimizer class as results name it: optiscope's by its name, any other by its full import path."""
    return cls.__name__ if cls.__module__.startswith("optiscope.") else f"{cls.__module__}.{cls.__qualname__}"


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


#: the user's recipes, by name (``register_recipe``): beside ``RECIPES``, never in place of one
_registered: dict[str, Recipe] = {}
#: what a recipe name is made of: no ``.`` (a dotted path), ``@`` (its η) or ``,`` (the next run)
RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]*")
#: the keys of a recipe in a recipes file (``[recipes.NAME]``)
RECIPE_KEYS = ("class", "lr", "decays", "options")
#: a name that is no recipe, in an error: what else would be valid
OTHER_SPECS = "a recipe of --recipes, or a dotted path to a torch.optim.Optimizer subclass (e.g. torch.optim.NAdam)"


class NoLearningRate(ConfigError):
    """A run names an optimizer that has no learning rate in this experiment, and gives none (``name@lr``)."""


def recipe(name: str) -> Recipe:
    """The recipe ``name`` names: a built-in one, a registered one, or the class at a dotted path (checked that
    it builds); ``ConfigError`` naming what is valid otherwise."""
    if name in RECIPES:
        return RECIPES[name]
    if name in _registered:
        return _registered[name]
    if "." in name:
        return dotted_recipe(name)
    raise ConfigError(f"unknown optimizer {name!r}; valid: {', '.join(RECIPES)}, or {OTHER_SPECS}")


@functools.cache
def dotted_recipe(path: str) -> Recipe:
    """``Recipe(cls)`` of the class at ``path``, once it is known to build."""
    rule = Recipe(import_optimizer(path))
    check_builds(path, rule)
    return rule


def check_builds(name: str, rule: Recipe) -> None:
    """Refuse (``ConfigError``) a recipe whose class does not take its options, or cannot be built from them on a
    2×2 parameter at its η (1e-3 without one)."""
    try:
        accepted = inspect.signature(rule.cls).parameters
    except (TypeError, ValueError):  # no signature to read: the build below is the whole check
        accepted = {}
    open_ended = not accepted or any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    taken = [p for p in accepted if p not in ("self", "params")]
    for key in ("lr", "weight_decay") if rule.decays else ("lr",):
        if key in rule.options:
            what = "η: give it as the recipe's lr or as name@lr" if key == "lr" else "λ, from --weight-decay (decays)"
            raise ConfigError(f"{name}: options set {key}, which is {what}")
        if not (open_ended or key in accepted):
            raise ConfigError(f"{name}: {class_name(rule.cls)} takes no {key}; it takes: {', '.join(taken)}")
    unknown = [k for k in rule.options if not open_ended and k not in accepted]
    if unknown:
        raise ConfigError(f"{name}: {class_name(rule.cls)} takes no {', '.join(unknown)}; it takes: {', '.join(taken)}")
    decay = {"weight_decay": 0.0} if rule.decays else {}
    try:
        rule.cls([torch.zeros(2, 2, requires_grad=True)], lr=rule.lr or 1e-3, **rule.options, **decay)
    except Exception as e:  # noqa: BLE001 (whatever the class raises for its arguments is the user's to fix)
        said = " ".join(str(e).split())
        raise ConfigError(f"{name}: {rule.describe()} cannot be built: {type(e).__name__}: {said}") from None


def register_recipe(name: str, rule: Recipe) -> None:
    """Make ``name`` a recipe, usable wherever a built-in one is: ``build_optimizer``, ``--optimizers``, a sweep.

    The recipe is checked first: its class must take its ``options`` (and ``weight_decay`` if it ``decays``) and
    build from them. Registering a name again replaces its recipe. A sweep sends the registered recipes its
    optimizers use to its workers, local or Ray.

    Args:
        name: letters, digits, ``_``, ``-`` and ``+``, not a built-in recipe's name (a name means one recipe
            everywhere, so a built-in one is never replaced).
        rule: the recipe, e.g. ``Recipe(torch.optim.NAdam, {"momentum_decay": 0.002}, lr=2e-3)``.

    Raises:
        ConfigError: ``name`` is a built-in recipe's or not a plain name; ``rule`` splits a model (only the
            built-in ``muon+adamw`` does), sets ``lr`` (or ``weight_decay`` while it decays) in ``options``, or
            its class refuses its options.

    Examples:
        >>> import torch
        >>> from optiscope.optim import Recipe, build_optimizer, register_recipe
        >>> register_recipe("nadam-slow", Recipe(torch.optim.NAdam, {"momentum_decay": 0.002}, decays=True))
        >>> optimizer = build_optimizer("nadam-slow", torch.nn.Linear(2, 1), lr=1e-3, weight_decay=0.1)
        >>> type(optimizer).__name__, optimizer.param_groups[0]["weight_decay"]
        ('NAdam', 0.1)
        >>> register_recipe("adamw", Recipe(torch.optim.AdamW))
        Traceback (most recent call last):
        optiscope.errors.ConfigError: recipe 'adamw': the name is a built-in recipe's; choose another name
    """
    check_recipe(name, rule, f"recipe {name!r}")
    _registered[name] = rule


def check_recipe(name: str, rule: Recipe, label: str) -> None:
    """Refuse (``ConfigError`` starting with ``label``) a recipe that may not be registered as ``name``."""
    if name in RECIPES:
        raise ConfigError(f"{label}: the name is a built-in recipe's; choose another name")
    if not (isinstance(name, str) and RECIPE_NAME.fullmatch(name)):
        raise ConfigError(f"{label}: the name must be letters, digits, _, - and + (no '.', '@', ',' or spaces)")
    if rule.splits_model:
        raise ConfigError(f"{label}: splits the model, which only the built-in muon+adamw does")
    check_builds(label, rule)


def load_recipes(path: str | Path) -> dict[str, Recipe]:
    """Register the recipes of a TOML recipes file (``--recipes``) and return them by name.

    Each ``[recipes.NAME]`` table is one recipe: ``class``, a dotted path to a ``torch.optim.Optimizer``
    subclass (required); ``lr``, its default η (optional); ``decays``, whether λ comes from the experiment's
    ``--weight-decay`` (default false: the class's own λ); ``options``, the keyword arguments it always gets
    (TOML arrays become tuples)::

        [recipes.soap]
        class = "pytorch_optimizer.SOAP"
        lr = 3e-3
        decays = true
        options = { betas = [0.95, 0.95], precondition_frequency = 10 }

    Every recipe is checked (``register_recipe``) before any is registered.

    Args:
        path: the TOML file.

    Returns:
        name -> ``Recipe``, in the file's order.

    Raises:
        ConfigError: the file cannot be read or is not TOML, holds no ``[recipes.NAME]`` table or other tables
            beside them, or a recipe is refused (a key other than class, lr, decays and options; a class that
            cannot be imported or refuses its options; a name that is a built-in recipe's).

    Examples:
        >>> from pathlib import Path
        >>> from optiscope.optim import load_recipes
        >>> _ = Path("recipes.toml").write_text('[recipes.nadam]\\nclass = "torch.optim.NAdam"\\nlr = 2e-3\\n')
        >>> load_recipes("recipes.toml")["nadam"].describe()
        'torch.optim.nadam.NAdam(lr=η)'
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--recipes {str(path)!r}: cannot read it ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--recipes {str(path)!r} is not valid TOML: {' '.join(str(e).split())}") from None
    table = data.get("recipes")
    others = [k for k in data if k != "recipes"]
    if not isinstance(table, dict) or not table or others:
        extra = f" (it also holds {', '.join(others)})" if others else ""
        raise ConfigError(f"--recipes {str(path)!r} holds no [recipes.NAME] tables alone{extra}; e.g. [recipes.soap]")
    return register_table(table, f"--recipes {str(path)!r}")


def register_table(table: Mapping[str, Any], where: str = "recipes") -> dict[str, Recipe]:
    """Register the recipes of ``table`` (name -> a recipes file's entry: ``recipe_data``'s shape), each checked
    before any is registered; ``where`` starts each error."""
    rules = {}
    for name, entry in table.items():
        label = f"{where}: [recipes.{name}]"
        rules[name] = recipe_from_data(name, entry, label)
        check_recipe(name, rules[name], label)
    _registered.update(rules)
    return rules


def recipe_from_data(name: str, entry: Any, where: str) -> Recipe:
    """The ``Recipe`` of one recipes-file entry (``class``, ``lr``, ``decays``, ``options``)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table with {', '.join(RECIPE_KEYS)}")
    unknown = [k for k in entry if k not in RECIPE_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(RECIPE_KEYS)}")
    path, lr, decays, options = (entry.get(k) for k in RECIPE_KEYS)
    if not isinstance(path, str):
        raise ConfigError(f'{where} needs class = "module.Class", e.g. "pytorch_optimizer.SOAP"')
    if lr is not None and not (isinstance(lr, int | float) and not isinstance(lr, bool) and 0 < lr < math.inf):
        raise ConfigError(f"{where}: lr = {lr!r} must be a finite number > 0")
    if not isinstance(decays, bool | None):
        raise ConfigError(f"{where}: decays = {decays!r} must be true or false")
    if not isinstance(options, dict | None):
        raise ConfigError(f"{where}: options = {options!r} must be a table, e.g. {{ betas = [0.9, 0.99] }}")
    try:
        cls = import_optimizer(path)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    fixed = {k: as_tuples(v) for k, v in (options or {}).items()}
    return Recipe(cls, fixed, decays=bool(decays), lr=None if lr is None else float(lr))


def as_tuples(value: Any) -> Any:
    """A TOML value with its arrays as tuples, as optimizers take ``betas``."""
    return tuple(as_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def recipe_data(rule: Recipe) -> dict[str, Any]:
    """``rule`` as a recipes file's entry (plain data a worker process turns back into it, ``register_table``)."""
    data = {"class": f"{rule.cls.__module__}.{rule.cls.__qualname__}", "decays": rule.decays, "options": rule.options}
    return data if rule.lr is None else {**data, "lr": rule.lr}


def registered(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Of ``names``, those of registered recipes, with their entries (``recipe_data``): what a worker needs."""
    return {name: recipe_data(_registered[name]) for name in names if name in _registered}


def build_optimizer(
    name: str,
    params: nn.Module | Iterable[Tensor] | Iterable[dict[str, Any]],
    lr: float,
    weight_decay: float = 0.0,
    *,
    decay_vectors: bool = True,
) -> torch.optim.Optimizer:
    """Build the optimizer of recipe ``name`` over ``params`` with learning rate η = ``lr``.

    The result is ``recipe.cls(groups, lr=η, **options)`` with λ = ``weight_decay`` in each group for the
    recipes that decay; the others keep their class's own λ (0 for every built-in recipe).

    Args:
        name: an optimizer spec: a key of ``RECIPES`` (``"sgd"``, ``"adamw"``, ``"muon+adamw"``, …), a recipe
            registered with ``register_recipe`` or ``load_recipes``, or a dotted path to an importable
            ``torch.optim.Optimizer`` subclass (``"torch.optim.NAdam"``: ``cls(params, lr=η)``, every other
            argument the class's default, λ included).
        params: a model (its trainable parameters), tensors, or param groups. ``muon+adamw`` needs the
            model, to find its hidden matrices.
        lr: η.
        weight_decay: λ ≥ 0, for the recipes that decay (``adamw``, ``adaml2``, ``lion``, a user's recipe with
            ``decays``); ignored by the others.
        decay_vectors: with a model, False leaves parameters with fewer than two dimensions (norms, biases)
            undecayed, as nanoGPT does; ignored for tensors and param groups.

    Returns:
        The optimizer, a ``torch.optim.Optimizer`` (a ``MuonWithAdamW`` for ``muon+adamw``).

    Raises:
        ConfigError: ``name`` is no recipe, or a dotted path that cannot be imported, is not an optimizer class,
            or does not build (a ``ValueError``).
        ValueError: the optimizer refuses a value (``lr < 0``, a tensor that is not 2-D for ``muon``).
        TypeError: ``muon+adamw`` with ``params`` that are not an ``nn.Module``.

    Examples:
        >>> import torch
        >>> from optiscope.optim import build_optimizer
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 1))
        >>> optimizer = build_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, decay_vectors=False)
        >>> type(optimizer).__name__, [g["weight_decay"] for g in optimizer.param_groups]  # λ on matrices only
        ('AdamW', [0.1, 0.0])
        >>> type(build_optimizer("torch.optim.NAdam", model, lr=1e-3)).__module__
        'torch.optim.nadam'

    Notes:
        - In param groups a group's own ``weight_decay`` wins for the recipes that decay; the others drop it
          (their class's own λ applies).
        - ``muon+adamw`` ignores ``weight_decay`` and ``decay_vectors`` (λ = 0 in both parts) and gives AdamW
          η/20.
    """
    rule = recipe(name)
    if rule.splits_model:
        if not isinstance(params, nn.Module):
            raise TypeError(f"{name} splits a model into Muon and AdamW parameters: pass the nn.Module")
        return muon_with_adamw(params, lr=lr, adamw_lr=lr * MUON_ADAMW_LR_RATIO)
    if rule.decays:
        groups = param_groups(params, weight_decay, decay_vectors)
    else:  # λ is the class's own: its default (0 for every built-in recipe) or the recipe's options
        groups = [{k: v for k, v in g.items() if k != "weight_decay"} for g in param_groups(params, 0.0, True)]
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
    """One training run as named on the command line: ``optimizer[@lr]`` (an optimizer spec: ``recipe``).
    ``lr`` is None where the experiment chooses it (landscapes: its whole grid)."""

    label: str
    optimizer: str
    lr: float | None


def parse_runs(
    text: str | tuple[str, ...] | list[str],
    default_lr: dict[str, float] | float | None,
    valid: tuple[str, ...] | None = None,
) -> tuple[RunSpec, ...]:
    """``--optimizers``: 'sgd,adam@0.05,torch.optim.NAdam@1e-3' -> RunSpecs. Without ``@lr`` a run takes
    ``default_lr`` (one number, the experiment's learning rate per optimizer, or None); an optimizer missing from
    a per-optimizer table takes its recipe's ``lr``, and without one must be named with ``@lr``
    (``NoLearningRate``). ``valid`` narrows the built-in recipes allowed; a user's recipe or a dotted path is
    always allowed."""
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
        known = name in valid or name in _registered or (name not in RECIPES and "." in name)
        _require(known, f"--optimizers: unknown optimizer {name!r}{where}; valid: {', '.join(valid)}, or {OTHER_SPECS}")
        try:
            rule = recipe(name)
        except ConfigError as e:
            raise ConfigError(f"--optimizers: {e}") from None
        _require(not at or lr_text.strip(), f"--optimizers: {item!r} has no learning rate after '@'; write {name}@0.01")
        lr = default_lr.get(name, rule.lr) if isinstance(default_lr, dict) else default_lr
        if lr is None and isinstance(default_lr, dict) and not lr_text:
            raise NoLearningRate(
                f"--optimizers: {name!r} has no usual learning rate here; name one, e.g. {name}@0.001 (or give its "
                "recipe an lr)"
            )
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
