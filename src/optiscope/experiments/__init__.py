"""Experiments: one module each, every one reachable as ``optiscope run <name> --out DIR [--quick]``.

An experiment module defines

* ``SUMMARY`` — one line for ``optiscope list``;
* ``Config`` — a dataclass whose fields become command-line options (``field(metadata={"help": ...})``;
  ``NO_EFFECT`` in the metadata marks options such as ``--quiet`` that ``--resume`` may change) and whose
  ``__post_init__`` raises ``ConfigError`` naming any bad value and the valid ones. Every one takes
  ``--quiet``, so that one command line silences any of them;
* ``QUICK`` — field overrides for ``--quick`` (what ``make demo`` runs: well under a minute on a laptop);
* ``Results`` — the ``TypedDict`` of its ``results.json``, the contract its figures are drawn from;
* ``run(config, run_dir) -> Results`` — does the work. Experiments that train go through
  ``optiscope.train``; their checkpoints live in ``run_dir/checkpoints`` and a run directory that has
  them is being resumed (``runs.open_run`` guarantees that nothing else is there).

Optional: ``OWNS`` (more files or folders the run owns besides ``runs.OWNED``); ``OBJECTIVES`` (name ->
``Objective``, the first the default: what ``optiscope sweep`` tunes a learning rate for, read from the
results of a run of one optimizer); ``DEFAULT_LR`` (where a sweep's grid is centred when ``runs_of`` of a
lone optimizer gives no learning rate); ``trainee(config, spec) -> Trainee`` (the model, loss, batches and
optimizer a run of ``spec`` would train: what ``optiscope suggest-lr`` and ``sweep --lr-from suggest`` probe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .. import __version__, runs
from ..checks import is_count, non_negative, positive
from ..errors import ConfigError
from ..optim.recipes import registered
from .objective import Objective, only_run

if TYPE_CHECKING:
    from ..suggest import LRSuggestion

__all__ = [
    "load",
    "build_config",
    "execute",
    "objectives",
    "sweepable",
    "Objective",
    "only_run",
    "ConfigError",
    "Trainee",
    "suggestable",
    "suggest",
]

EXPERIMENTS: dict[str, str] = {
    "rare-tokens": "optiscope.experiments.rare_tokens",
    "landscapes": "optiscope.experiments.landscapes",
    "lm": "optiscope.experiments.lm",
    "entropy": "optiscope.experiments.entropy",
    "adder": "optiscope.experiments.adder",
    "edge-of-stability": "optiscope.experiments.edge_of_stability",
    "mlp": "optiscope.experiments.mlp",
}


def load(name: str) -> ModuleType:
    """The module of experiment ``name``, imported on first use.

    An experiment module holds ``SUMMARY`` (one line), ``Config`` (a dataclass whose fields are the command
    line's options), ``QUICK`` (the overrides of ``--quick``), ``Results`` (the ``TypedDict`` of its
    results.json) and ``run(config, run_dir) -> Results``; those that train also ``OBJECTIVES``.

    Args:
        name: the experiment's name as ``optiscope list`` prints it, e.g. ``"landscapes"``.

    Returns:
        The module, e.g. ``optiscope.experiments.landscapes``.

    Raises:
        ConfigError: ``name`` is no experiment; the message lists the valid ones.

    Examples:
        >>> from optiscope import experiments
        >>> experiments.load("landscapes").SUMMARY
        'SGD → momentum → Adam → AdamW on a ravine, a saddle and Rosenbrock; ...'
        >>> experiments.load("landscape")
        Traceback (most recent call last):
        optiscope.errors.ConfigError: unknown experiment 'landscape'; valid experiments: adder, ...

    Notes:
        The optional module entries: ``OWNS`` (files or folders the run owns besides a run's own, which
        ``--force`` removes too), ``OBJECTIVES`` (name -> [`Objective`][optiscope.experiments.Objective], the
        first the default: what ``optiscope sweep`` tunes a learning rate for, read from the results of a run of
        one optimizer), ``DEFAULT_LR`` (where a sweep's grid is centred when the lone optimizer gets no learning
        rate of its own). A Config field with ``NO_EFFECT`` in its metadata (``--quiet``) may change on
        ``--resume``; every Config takes ``--quiet``, so that one command line silences any of them.
    """
    if name not in EXPERIMENTS:
        valid = ", ".join(sorted(EXPERIMENTS)) or "(none yet)"
        raise ConfigError(f"unknown experiment {name!r}; valid experiments: {valid}")
    return importlib.import_module(EXPERIMENTS[name])


def owned_files(name: str) -> tuple[str, ...]:
    """What a run of ``name`` keeps in its directory besides a run's own files (``OWNS`` in the module)."""
    return tuple(getattr(load(name), "OWNS", ()))


def data_parallel() -> list[str]:
    """The experiments that train data-parallel under torchrun (``DATA_PARALLEL`` in the module)."""
    return [name for name in EXPERIMENTS if getattr(load(name), "DATA_PARALLEL", False)]


def sweepable() -> list[str]:
    """The experiments that declare an objective to tune for: what ``optiscope sweep`` takes.

    Returns:
        Their names, in the order ``optiscope list`` gives them.

    Examples:
        >>> from optiscope import experiments
        >>> experiments.sweepable()
        ['rare-tokens', 'landscapes', 'lm', 'adder', 'mlp']

    Notes:
        It imports every experiment's module to look (``entropy`` and ``edge-of-stability`` declare none).
    """
    return [name for name in EXPERIMENTS if getattr(load(name), "OBJECTIVES", None)]


def objectives(name: str) -> dict[str, Objective]:
    """The objectives experiment ``name`` declares: what a sweep can tune a learning rate for.

    Args:
        name: the experiment, e.g. ``"lm"``.

    Returns:
        Objective name -> [`Objective`][optiscope.experiments.Objective], the default (what a sweep tunes for
            without ``--objective``) first.

    Raises:
        ConfigError: ``name`` is no experiment, or it declares no objective (the message names those that do).

    Examples:
        >>> from optiscope import experiments
        >>> list(experiments.objectives("landscapes"))
        ['steps_ravine', 'steps_saddle', 'steps_rosenbrock']
        >>> experiments.objectives("landscapes")["steps_ravine"].direction
        'min'
    """
    declared = getattr(load(name), "OBJECTIVES", None)
    if not declared:
        raise ConfigError(
            f"experiment {name!r} declares no objective to tune for; experiments that do: {', '.join(sweepable())}"
        )
    return declared


def build_config(module: Any, quick: bool, overrides: dict[str, Any]) -> Any:
    """The experiment's ``Config``: its defaults, then ``QUICK`` (with ``quick``), then ``overrides``.

    Args:
        module: the experiment's module (``load(name)``).
        quick: apply the module's ``QUICK`` overrides (what ``--quick`` runs: well under a minute on a laptop).
        overrides: field name -> value, as the command line's options give them (``weight_decay`` for
            ``--weight-decay``); they win over ``QUICK``.

    Returns:
        The module's ``Config`` instance, validated.

    Raises:
        ConfigError: a value the experiment refuses (its ``Config.__post_init__``); the message names the option
            and the valid values.
        TypeError: an override that is no field of the ``Config``.

    Examples:
        >>> from optiscope import experiments
        >>> landscapes = experiments.load("landscapes")
        >>> config = experiments.build_config(landscapes, True, {"optimizers": "adam"})
        >>> config.steps, config.optimizers
        (1500, 'adam')
        >>> experiments.build_config(landscapes, False, {"steps": 0})
        Traceback (most recent call last):
        optiscope.errors.ConfigError: --steps=0 must be an integer >= 1
    """
    values = dict(getattr(module, "QUICK", {})) if quick else {}
    values.update(overrides)
    return module.Config(**values)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's CPU threads set to ``n`` for the duration (tiny models run fastest on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def flag(name: str) -> str:
    """The command-line option of a Config field: ``weight_decay`` -> ``--weight-decay``."""
    return "--" + name.replace("_", "-")


def require_counts(config: Any, *names: str, minimum: int = 1) -> None:
    """Each named field of ``config`` is an integer (not a bool) >= ``minimum``."""
    for name in names:
        value = getattr(config, name)
        require(is_count(value, minimum), f"{flag(name)}={value!r} must be an integer >= {minimum}")


def require_threads(config: Any) -> None:
    """``config.threads`` is a count torch can run: at most 4 per CPU of this machine (more only contend)."""
    limit = 4 * (os.cpu_count() or 1)
    require(
        is_count(config.threads) and config.threads <= limit,
        f"--threads={config.threads!r} must be an integer from 1 to {limit} (4 per CPU of this machine)",
    )


def require_rates(config: Any, name: str) -> tuple[float, ...]:
    """The named field as a tuple of one or more distinct finite numbers > 0 (a list of learning rates)."""
    rates = tuple(getattr(config, name))
    bad = [rate for rate in rates if not positive(rate)]
    require(bool(rates) and not bad, f"{flag(name)}={rates!r}: give one or more finite numbers > 0")
    require(len(set(rates)) == len(rates), f"{flag(name)}={rates!r} names a learning rate twice")
    return rates


def require_positive(config: Any, *names: str) -> None:
    """Each named field of ``config`` is a finite number > 0."""
    for name in names:
        value = getattr(config, name)
        require(positive(value), f"{flag(name)}={value!r} must be a finite number > 0")


def require_non_negative(config: Any, *names: str) -> None:
    """Each named field of ``config`` is a finite number >= 0."""
    for name in names:
        value = getattr(config, name)
        require(non_negative(value), f"{flag(name)}={value!r} must be a finite number >= 0")


# --------------------------------------------------------------------------------------------- running
#: the metadata of a Config field that does not change results (``--resume`` ignores differences in it)
NO_EFFECT = {"affects_results": False}


def optimizers_help(runs: str, names: Iterable[str], recipes: str = "recipes") -> str:
    """An experiment's ``--optimizers`` help: what its runs are (``runs``), the built-in recipes it offers
    (``names``, under the heading ``recipes``), and what every experiment takes besides (as ``parse_runs``)."""
    others = "a recipe of --recipes, or a dotted class path (torch.optim.NAdam)"
    return f"{runs}; {recipes}: {', '.join(names)}; or {others}"


def config_dict(config: Any) -> dict[str, Any]:
    """What config.json records of an experiment's ``config``: its fields and, under ``recipes``, the user's recipes
    its optimizers name (``optim.register_recipe``, ``--recipes``), as a recipes file's entries: what each name
    ran, and all that ``--resume`` needs to build them again."""
    record = runs.to_jsonable(dataclasses.asdict(config))
    runs_of = getattr(importlib.import_module(type(config).__module__), "runs_of", None)
    used = registered(spec.optimizer for spec in runs_of(config)) if runs_of is not None else {}
    return {**record, "recipes": runs.to_jsonable(used)} if used else record


def options_without_effect(config_cls: type) -> tuple[str, ...]:
    """The Config fields that do not change results (``--resume`` ignores differences in them)."""
    return tuple(f.name for f in dataclasses.fields(config_cls) if f.metadata.get("affects_results") is False)


def execute(
    name: str,
    config: Any,
    out: Path,
    *,
    resume: bool = False,
    force: bool = False,
    quick: bool = False,
    then: Callable[[dict[str, Any]], None] | None = None,
):
    """Run experiment ``name`` with ``config`` in the run directory ``out`` and write its ``results.json``.

    What ``optiscope run`` does, figures aside: the directory is held (a lock) while the experiment runs, its
    ``config.json`` written when the run starts, and ``results.json`` written atomically at the end.

    Args:
        name: the experiment, e.g. ``"landscapes"``.
        config: its ``Config`` (``build_config``).
        out: the run directory; created if missing. It holds one run.
        resume: continue the run in ``out`` from its checkpoints (its stored options must equal ``config``'s but
            in options without effect, such as ``quiet``); on a directory with no run yet, start one.
        force: first remove every file a run of ``name`` owns in ``out`` (files of your own are left), then start
            afresh. Not with ``resume``.
        quick: record ``"quick": true`` in the results; the ``QUICK`` settings themselves are ``build_config``'s.
        then: called with the results after ``results.json`` is written, while the directory is still held (the
            figures: a ``--force`` run must not take it from under them); None: nothing.

    Returns:
        (dict[str, Any]): The results as written: the experiment's ``Results`` plus ``experiment`` (``name``),
            ``optiscope`` (the version), ``quick``, ``status`` (``"ok"`` unless the experiment said otherwise),
            ``wall_seconds`` (this session's) and ``resumed`` (True, when it resumed).

    Raises:
        RunDirError: ``out`` cannot be used as asked: it holds another run (without ``resume`` or ``force``),
            both ``resume`` and ``force``, another process holds it, it is not a directory, a resume with
            options that change results, a ``config.json`` that is not optiscope's.
        ConfigError: ``name`` is no experiment, or the experiment refuses an input only when it runs (a corpus
            file that is not there).
        CheckpointError: a checkpoint in ``out`` that is damaged, foreign, or of another run.

    Examples:
        >>> from optiscope import experiments
        >>> landscapes = experiments.load("landscapes")
        >>> options = {"optimizers": "adam@0.1", "steps": 300, "tolerance": 1e-2, "bias_steps": 10, "decay_steps": 10}
        >>> config = experiments.build_config(landscapes, False, options)
        >>> results = experiments.execute("landscapes", config, "runs/landscapes")
        >>> results["experiment"], results["status"]
        ('landscapes', 'ok')
        >>> experiments.objectives("landscapes")["steps_ravine"].value(results) < 300  # steps to f − f* ≤ 0.01
        True
        >>> experiments.execute("landscapes", config, "runs/landscapes")
        Traceback (most recent call last):
        optiscope.runs.RunDirError: runs/landscapes already holds a run of 'landscapes'; pass --resume ...

    Notes:
        ``config.json`` is written only when the run really starts: an option or input file that turns out to be
        bad, or a Ctrl-C before the run wrote anything, leaves the directory free for the corrected call. A
        ``config.json`` that is not optiscope's (a 🤗 model's) is never replaced, not even with ``force``. A
        resume that names an option whose default follows another one (``lm``'s ``warmup_steps`` follows
        ``steps``) says so when it is refused. Resumed results count only this session's seconds.

        Under torchrun only rank 0 touches the directory; the other ranks run the experiment and return its
        results unwritten.
    """
    module = load(name)
    if not runs.is_rank_zero():
        return module.run(config, Path(out))
    with runs.open_run(
        out,
        name,
        config_dict(config),
        resume=resume,
        force=force,
        ignored=options_without_effect(type(config)),
        owned=owned_files(name),
        # a field whose default follows another option (lm's --warmup-steps follows --steps): a resume refused
        # for the other says so of it too, rather than ask for a value the user never gave
        follows={f.name: f.metadata["follows"] for f in dataclasses.fields(config) if "follows" in f.metadata},
    ) as run_dir:
        started = time.perf_counter()
        results = module.run(config, run_dir.path)
        results = {"experiment": name, "optiscope": __version__, "quick": quick, **results}
        results.setdefault("status", "ok")
        results["wall_seconds"] = round(time.perf_counter() - started, 3)
        if run_dir.resuming:  # the seconds are this session's: the earlier ones were not kept (an interrupt)
            results["resumed"] = True
        runs.atomic_write_json(run_dir.path / runs.RESULTS, results)
        if then is not None:
            then(results)
    return results


# ------------------------------------------------------------------------------------ learning-rate suggestions
#: The share of a run's steps × batch a learning-rate suggestion may spend, by default (the issue's 5 %).
DEFAULT_BUDGET = 0.05


@dataclass(frozen=True)
class Trainee:
    """What a run of one optimizer would train, for a learning-rate suggestion to probe before it starts.

    An experiment that trains declares ``trainee(config, spec) -> Trainee`` in its module: the model as the run
    starts it, the run's loss and batches (in the run's order), and the λ and groups the run builds its optimizer
    with (``optim.build_optimizer(spec.optimizer, model, lr, weight_decay, decay_vectors=...)``); the probe runs
    on a copy and leaves the model as it was. ``steps`` × ``batch_size`` is the run's size, of which a suggestion
    spends a share (``suggest``'s ``budget``).

    Args:
        model: the model at the run's initial weights.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the run's training loss.
        batches: the run's training batches, in its order (as many as the run takes).
        steps: the run's optimizer steps.
        batch_size: examples per batch.
        weight_decay: λ of the recipes that decay, as the run gives it.
        decay_vectors: whether λ reaches parameters of fewer than two dimensions (``build_optimizer``'s).

    Examples:
        >>> from optiscope import experiments
        >>> mlp = experiments.load("mlp")
        >>> config = experiments.build_config(mlp, True, {"optimizers": "adamw"})
        >>> trainee = mlp.trainee(config, mlp.runs_of(config)[0])
        >>> trainee.steps, trainee.batch_size, trainee.weight_decay
        (300, 32, 0.01)
    """

    model: nn.Module
    loss_fn: Callable[[nn.Module, Any], Tensor]
    batches: Iterable[Any]
    steps: int
    batch_size: int
    weight_decay: float = 0.0
    decay_vectors: bool = True


def suggestable() -> list[str]:
    """The experiments whose runs a learning-rate suggestion can probe (they declare ``trainee``).

    Returns:
        Their names, in the order ``optiscope list`` gives them.

    Examples:
        >>> from optiscope import experiments
        >>> experiments.suggestable()
        ['lm', 'adder', 'mlp']
    """
    return [name for name in EXPERIMENTS if callable(getattr(load(name), "trainee", None))]


def suggest(
    name: str, config: Any, budget: float = DEFAULT_BUDGET, method: str | None = None
) -> dict[str, LRSuggestion]:
    """A learning-rate suggestion for each optimizer of ``config``, probed on the experiment's own run.

    For each run ``optimizer[@lr]`` of ``config``, [`suggest_lr`][optiscope.suggest.suggest_lr] probes a copy of the
    model that run would train, on its loss and its batches, with its optimizer, within ``budget`` × the run's
    steps (in forward+backward passes on one batch: a Hessian-vector product counts as two).

    Args:
        name: an experiment that declares ``trainee`` (``suggestable()``: ``lm``, ``adder``, ``mlp``).
        config: its ``Config`` (``build_config``); each run's ``@lr`` is not used.
        budget: the share of a run's steps × batch a suggestion may spend, in (0, 1].
        method: ``suggest_lr``'s method (``suggest.METHODS``); None: its default.

    Returns:
        Optimizer name -> [`LRSuggestion`][optiscope.suggest.LRSuggestion], in the runs' order.

    Raises:
        ConfigError: ``name`` declares no ``trainee`` (the message names those that do), ``budget`` is not in
            (0, 1], or ``method`` is none of ``suggest.METHODS``.
        SuggestionError: a suggestion cannot be made: the budget is below what one measurement needs (the
            message says the least), an optimizer without an lr, or a loss that is not finite at the first step.

    Examples:
        >>> from optiscope import experiments
        >>> mlp = experiments.load("mlp")
        >>> config = experiments.build_config(mlp, True, {"optimizers": "adamw"})
        >>> suggestion = experiments.suggest("mlp", config, budget=0.1)["adamw"]
        >>> 1e-5 < suggestion.lr < 1, suggestion.steps_used <= 30
        (True, True)
    """
    from ..suggest import suggest_lr
    from ..suggest.methods import DEFAULT_METHOD, METHODS  # the probes import torch's autograd machinery: when asked

    module = load(name)
    if not callable(getattr(module, "trainee", None)):
        raise ConfigError(
            f"{name} has no run to probe for a learning rate; experiments that do: {', '.join(suggestable())}"
        )
    if not (isinstance(budget, int | float) and not isinstance(budget, bool) and 0 < budget <= 1):
        raise ConfigError(f"--budget {budget!r} must be a share of a run's steps in (0, 1], e.g. 0.05")
    method = DEFAULT_METHOD if method is None else method
    if method not in METHODS:
        raise ConfigError(f"--method {method!r}; valid: {', '.join(METHODS)}")
    found = {}
    for spec in module.runs_of(config):
        trainee = module.trainee(config, spec)
        steps = max(1, int(budget * trainee.steps))
        with torch_threads(getattr(config, "threads", 1)):
            found[spec.optimizer] = suggest_lr(
                trainee.model,
                spec.optimizer,
                trainee.loss_fn,
                trainee.batches,
                steps=steps,
                weight_decay=trainee.weight_decay,
                decay_vectors=trainee.decay_vectors,
                method=method,
            )
    return found
