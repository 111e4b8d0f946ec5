"""``optiscope sweep``: tune each optimizer's learning rate on an experiment with several seeds, then
measure it with fresh ones (``grid``).

The sweep directory follows the run-directory rules (``runs.open_run``: a lock, ``--resume``,
``--force``, ``config.json``) and holds::

    DIR/config.json       the sweep's settings
    DIR/trials/<optimizer>@<lr>/seed-<s>/   one ordinary run directory per trial
    DIR/trials.jsonl      one record per finished trial, appended as each finishes
    DIR/results.json      every trial and the per-optimizer summary (``results.summarise``)
    DIR/figures/*.png     drawn by ``figures.sweep``

The protocol (``grid``) decides the next trials from the records alone, so a killed sweep resumed with
``--resume`` re-plans the same trials, skips those recorded, continues a half-finished one from its
checkpoints, and ends with the results an uninterrupted sweep would have (wall times aside). A trial
recorded as crashed is run again by ``--resume`` (its new record supersedes the old one in trials.jsonl).

A trial whose experiment refuses its options (a ``ConfigError``, which every trial meets) stops the sweep with
that error once the other trials of its round have ended by themselves, whatever the backend: a refused trial
leaves nothing behind, so the corrected command needs no ``--force``; a trial that finished is recorded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import experiments, runs
from ..checks import is_count, is_number
from ..errors import ConfigError
from ..experiments import DEFAULT_BUDGET
from ..optim.recipes import NoLearningRate, registered
from . import grid
from .backends import BACKENDS, open_backend
from .results import Results, summarise
from .trial import REFUSED, TRIALS, Trial, trial_dir

RECORDS = "trials.jsonl"
#: The suggestions of a sweep with ``lr_from="suggest"``, written once and read back on resume.
SUGGESTIONS = "suggestion.json"
#: What a sweep directory holds besides a run's own files (``runs.OWNED``).
OWNS = (TRIALS, RECORDS, SUGGESTIONS)
#: Seeds per learning rate at most: far beyond any comparison's need (the grid of trials is held in memory).
MAX_SEEDS = 10_000
#: The sweep's own options (an experiment option of the same name is not offered to its trials).
RESERVED = ("optimizers", "seed", "seeds", "quiet", "verbose")
#: Where an automatic grid may be centred (``lr_from``).
LR_FROM = ("usual", "suggest")
#: The smallest and largest ratio between neighbouring η of the automatic grid.
FACTORS = (1.05, 100.0)


@dataclass
class SweepConfig:
    """The settings of a sweep: which experiment, which optimizers, how many seeds, which learning rates.

    Per optimizer the sweep tries learning rates η_k = η₀ · f^k (rounded to three digits; f = ``factor``, √10 by
    default) around a centre η₀, the experiment's usual η for it or (``lr_from="suggest"``) its suggested one: k =
    −1, 0, 1 first, then further out while the best is at an end of the grid; then ``seeds`` tuning seeds at the
    best η and its two neighbours, and ``seeds`` fresh seeds at the tuned η. Every number the sweep reports for an
    optimizer comes from the fresh seeds.

    Args:
        experiment: an experiment that declares objectives (``experiments.sweepable()``: ``rare-tokens``,
            ``landscapes``, ``lm``, ``adder``, ``mlp``).
        optimizers: optimizer specs, each once (``optim.build_optimizer``'s: a recipe name, a registered recipe or a
            dotted path to a ``torch.optim.Optimizer`` subclass), e.g. ``("adamw", "muon+adamw",
            "torch.optim.NAdam@1e-3")``. ``name@η`` says where its automatic grid starts (the centre η₀), for an
            optimizer the experiment has no usual η for; the sweep chooses the learning rates it runs.
        seeds: N, the tuning seeds per learning rate and the fresh seeds at the tuned one: 1 to 10,000.
        lrs: a fixed grid of distinct finite learning rates > 0, never extended; None: the automatic grid.
        objective: which of the experiment's ``OBJECTIVES`` to tune for; None: its first.
        quick: run every trial with the experiment's ``--quick`` settings.
        options: experiment options for every trial, by ``Config`` field name (``{"steps": 200}``); not
            ``optimizers``, ``seed``, ``seeds``, ``quiet`` or ``verbose``, which the sweep sets itself.
        workers: trials run at a time, >= 1: a local pool of spawned processes (1: in this process, one after
            another), or the CPUs of a local Ray instance. It never changes a result.
        backend: ``"local"`` or ``"ray"`` (``pip install 'optiscope[ray]'``). It never changes a result.
        address: the Ray cluster's address, with ``backend="ray"`` only; None: a local Ray instance.
        factor: f, the ratio between neighbouring η of the automatic grid: a number from 1.05 to 100 (√2 for a
            fine grid; it grows as far in decades, 3.5, whatever f is). Not with ``lrs``.
        lr_from: where each optimizer's automatic grid is centred: ``"usual"`` (the experiment's usual η, or
            ``name@η``) or ``"suggest"`` (its [`suggest_lr`][optiscope.suggest.suggest_lr] on the experiment's own
            model, loss and batches, within ``budget``; written to ``suggestion.json`` and read back on resume).
            Not with ``lrs``.
        budget: with ``lr_from="suggest"``, the share of a trial's steps × batch each suggestion may spend: a
            number in (0, 1].

    Examples:
        >>> from optiscope.sweep import SweepConfig
        >>> config = SweepConfig("lm", ("adamw", "muon+adamw"), quick=True, workers=2)
        >>> config.seeds, config.lrs, config.objective
        (3, None, None)

    Notes:
        ``SweepConfig`` checks nothing itself; ``run_sweep`` refuses a bad setting with a ``ConfigError``.
        ``workers``, ``backend`` and ``address`` do not change results, so ``--resume`` may change them. Tuning
        seeds are the experiment's default ``seed``, +1, …, +N−1, fresh seeds the next N. Every trial runs on one
        torch thread, wherever it runs (torch's numbers depend on its thread count); more cores are used by
        running more trials at once.
    """

    experiment: str
    optimizers: tuple[str, ...]
    seeds: int = 3
    #: None: the automatic grid around each optimizer's usual learning rate
    lrs: tuple[float, ...] | None = None
    objective: str | None = None
    quick: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    workers: int = field(default=1, metadata={"affects_results": False})
    backend: str = field(default="local", metadata={"affects_results": False})
    address: str | None = field(default=None, metadata={"affects_results": False})
    factor: float = grid.FACTOR
    lr_from: str = "usual"
    budget: float = DEFAULT_BUDGET


@dataclass(frozen=True)
class Plan:
    """What the configuration resolves to: per optimizer its grid centre, the seeds that tune and the fresh
    seeds run at the tuned lr (``grid``), the objective."""

    module: str
    objective: str
    objectives: tuple[str, ...]
    centres: dict[str, float]
    seeds: tuple[int, ...]
    fresh: tuple[int, ...]
    #: the optimizers, named without their ``@η`` (the trials', records' and results' names)
    names: tuple[str, ...] = ()
    #: the registered recipes (``optim.register_recipe``, ``--recipes``) among ``names``, as data for the workers
    recipes: dict[str, dict[str, Any]] = field(default_factory=dict)


def check(config: SweepConfig) -> Plan:
    """Validate ``config`` (``ConfigError`` naming the bad value) and resolve it into a ``Plan``."""
    declared = experiments.objectives(config.experiment)
    module = experiments.load(config.experiment)
    objective = next(iter(declared)) if config.objective is None else config.objective
    if objective not in declared:
        raise ConfigError(f"--objective {objective!r}; {config.experiment} declares: {', '.join(declared)}")
    if not (is_count(config.seeds) and config.seeds <= MAX_SEEDS):
        raise ConfigError(f"--seeds {config.seeds!r} must be an integer from 1 to {MAX_SEEDS}")
    if not is_count(config.workers):
        raise ConfigError(f"--workers {config.workers!r} must be an integer >= 1")
    if config.backend not in BACKENDS:
        raise ConfigError(f"--backend {config.backend!r}; valid: {', '.join(BACKENDS)}")
    if config.address is not None and config.backend != "ray":
        raise ConfigError(f"--address {config.address!r} is a Ray cluster's; give it with --backend ray")
    if config.lrs is not None and (not config.lrs or any(not lr > 0 or lr == float("inf") for lr in config.lrs)):
        raise ConfigError(f"--lrs {config.lrs!r}: give auto or finite numbers > 0, e.g. 1e-3,3e-3,1e-2")
    if config.lrs is not None and len(set(config.lrs)) != len(config.lrs):
        raise ConfigError(f"--lrs {config.lrs!r} names a learning rate twice")
    if not (is_number(config.factor) and FACTORS[0] <= config.factor <= FACTORS[1]):
        raise ConfigError(
            f"--factor {config.factor!r} must be a number from {FACTORS[0]} to {FACTORS[1]:g}, e.g. 1.414"
        )
    if config.lr_from not in LR_FROM:
        raise ConfigError(f"--lr-from {config.lr_from!r}; valid: {', '.join(LR_FROM)}")
    if not (is_number(config.budget) and 0 < config.budget <= 1):
        raise ConfigError(f"--budget {config.budget!r} must be a share of a trial's steps in (0, 1], e.g. 0.05")
    if config.lrs is not None and (config.factor != grid.FACTOR or config.lr_from != "usual"):
        given = "--factor" if config.factor != grid.FACTOR else "--lr-from suggest"
        raise ConfigError(f"{given} shapes the automatic grid; --lrs is a fixed one: give one or the other")
    if isinstance(config.optimizers, str) or not all(isinstance(n, str) for n in config.optimizers):
        raise ConfigError(f"optimizers={config.optimizers!r}: give a tuple of names, e.g. ('adamw', 'muon+adamw')")
    spaced = [n for n in config.optimizers if n.strip() and n != n.strip()]
    if spaced:  # the trials and results.json would name it as given, the checks below as stripped
        raise ConfigError(f"--optimizers {spaced[0]!r} has spaces around the name; give {spaced[0].strip()!r}")
    items = [n for n in config.optimizers if n.strip()]
    if not items:
        raise ConfigError("--optimizers is empty; name one or more optimizers, e.g. adamw,muon+adamw")
    if len(items) != len(config.optimizers):
        raise ConfigError(f"--optimizers {','.join(config.optimizers)!r} has an empty name between commas")
    names = [n.partition("@")[0] for n in items]
    if len(set(names)) != len(names):
        raise ConfigError(f"--optimizers names an optimizer twice: {', '.join(items)}")
    reserved = sorted(set(config.options) & set(RESERVED))
    if reserved:
        raise ConfigError(f"the sweep sets {', '.join(reserved)} itself; leave them out")
    centres, seed0 = {}, None
    for item, name in zip(items, names, strict=True):
        if "@" in item and (config.lrs is not None or config.lr_from == "suggest"):
            other = "--lrs" if config.lrs is not None else "--lr-from suggest"
            raise ConfigError(
                f"--optimizers {item!r}: @η says where an automatic grid starts; with {other} give {name}"
            )
        # with --lrs the trials run at its learning rates: the first stands in for an optimizer without a usual one;
        # a suggested centre replaces the usual one (one is named here only for the options' sake)
        run = item if config.lrs is None else f"{name}@{config.lrs[0]:g}"
        run = f"{name}@1" if config.lr_from == "suggest" else run
        try:
            settings = experiments.build_config(module, config.quick, {**config.options, "optimizers": run})
        except NoLearningRate:
            raise ConfigError(
                f"--optimizers {name!r}: {config.experiment} has no usual learning rate for it; say where its grid "
                f"starts ({name}@0.001), give its recipe an lr, or give --lrs"
            ) from None
        (spec,) = module.runs_of(settings)
        centre = spec.lr if spec.lr is not None else getattr(module, "DEFAULT_LR", None)
        if centre is None:
            raise ConfigError(f"{config.experiment} has no usual learning rate for {name}; give --lrs")
        centres[name] = centre
        seed0 = getattr(settings, "seed", 0)
    seeds = tuple(seed0 + i for i in range(config.seeds))
    fresh = tuple(seed0 + config.seeds + i for i in range(config.seeds))
    module_name = experiments.EXPERIMENTS[config.experiment]
    return Plan(module_name, objective, tuple(declared), centres, seeds, fresh, tuple(names), registered(names))


def settings(config: SweepConfig, plan: Plan) -> dict[str, Any]:
    """config.json's content: every option, the grid's factor and the user's recipes (what each name ran) included;
    a sweep without them records none, nor a usual centre's ``lr_from`` and ``budget`` (its config.json is as
    before: a sweep of an earlier version resumes)."""
    recipes = {"recipes": plan.recipes} if plan.recipes else {}
    stored = dataclasses.asdict(config)
    if config.lr_from == "usual":
        del stored["lr_from"], stored["budget"]
    return runs.to_jsonable({**stored, "factor": None if config.lrs else config.factor, **recipes})


def lr_at(config: SweepConfig, plan: Plan, optimizer: str, k: int) -> float:
    if config.lrs:
        return sorted(config.lrs)[k]
    return grid.auto_lr(plan.centres[optimizer], k, config.factor)


def grid_shape(config: SweepConfig) -> tuple[tuple[int, int], tuple[int, ...]]:
    """(bounds, initial positions) of the grid."""
    if config.lrs:
        n = len(config.lrs)
        return (0, n - 1), tuple(range(n))
    reach = grid.reach(config.factor)
    return (-reach, reach), grid.INITIAL


def suggested_centres(config: SweepConfig, plan: Plan, path: Path) -> Plan:
    """``plan`` with each optimizer's centre its suggested η (``lr_from="suggest"``): read from the sweep's
    ``suggestion.json`` when it holds them (a resume: the same grid whatever the machine), else computed on the
    experiment's own model, loss and batches and written there first."""
    stored = runs.read_json(path / SUGGESTIONS) if (path / SUGGESTIONS).is_file() else {}
    missing = [name for name in plan.names if name not in stored.get("optimizers", {})]
    if missing:
        module = experiments.load(config.experiment)
        found = experiments.suggest(
            config.experiment,
            experiments.build_config(
                module, config.quick, {**config.options, "optimizers": ",".join(f"{n}@1" for n in missing)}
            ),
            config.budget,
        )
        stored = {
            "budget": config.budget,
            "optimizers": {**stored.get("optimizers", {}), **{n: s.to_dict() for n, s in found.items()}},
        }
        runs.atomic_write_json(path / SUGGESTIONS, stored)
    return dataclasses.replace(plan, centres={n: stored["optimizers"][n]["lr"] for n in plan.names})


def pending(config: SweepConfig, plan: Plan, out: Path, records: dict[tuple, dict[str, Any]]) -> list[Trial]:
    """The trials the protocol asks for next, given the records so far (none left: the sweep is done)."""
    bounds, initial = grid_shape(config)
    sign = 1 if experiments.objectives(config.experiment)[plan.objective].direction == "min" else -1
    trials = []
    for optimizer in plan.names:
        positions, missed = {}, set()
        for k in range(bounds[0], bounds[1] + 1):
            lr = lr_at(config, plan, optimizer, k)
            for seed in plan.seeds + plan.fresh:
                if (record := records.get((optimizer, lr, seed))) is not None:
                    positions[(k, seed)] = sign * record["objective"]
                    if seed == plan.seeds[0] and record["status"] == "ok" and positions[(k, seed)] == math.inf:
                        missed.add(k)  # finished without reaching its target
        for k, seed in grid.next_trials(positions, plan.seeds, bounds, initial, plan.fresh, missed):
            lr = lr_at(config, plan, optimizer, k)
            trials.append(
                Trial(
                    experiment=config.experiment,
                    module=plan.module,
                    optimizer=optimizer,
                    lr=lr,
                    seed=seed,
                    quick=config.quick,
                    options=dict(config.options),
                    objectives=plan.objectives,
                    out=str(trial_dir(out, optimizer, lr, seed)),
                    primary=plan.objective,
                    recipes=plan.recipes,
                )
            )
    return trials


def run_sweep(
    config: SweepConfig,
    out: Path,
    *,
    resume: bool = False,
    force: bool = False,
    report: Callable[[dict[str, Any]], None] = lambda record: None,
    then: Callable[[Results], None] | None = None,
) -> Results:
    """Run the sweep ``config`` in the directory ``out``: tune each optimizer's η, then measure it with fresh seeds.

    The protocol (``optiscope.sweep.grid``) decides the next trials from the records so far, round by round, until
    none is left: per optimizer η_k = η₀ · √10^k for k = −1, 0, 1 at the first seed, extended while the best is at
    an end; every tuning seed at the best η and its two neighbours; the fresh seeds at the tuned η (the best mean
    of the three; ties: the lower η). Each trial is one optimizer at one η and seed, an ordinary run directory of
    the experiment.

    Args:
        config: the sweep's settings.
        out: the sweep directory: ``config.json``, ``trials/<optimizer>@<η>/seed-<s>/`` (one run directory per
            trial), ``trials.jsonl`` (one record per finished trial) and ``results.json``.
        resume: continue the sweep in ``out``: re-plan from ``trials.jsonl``, skip the recorded trials, continue a
            half-finished one from its checkpoints, and run a trial recorded as crashed again.
        force: first remove what a sweep owns in ``out`` (``trials/``, ``trials.jsonl`` and a run's own files),
            then start afresh. Not with ``resume``.
        report: called with each trial's record as it is appended to ``trials.jsonl`` (the console's line).
        then: called with the results after ``results.json`` is written, while the directory is still held (the
            figures); None: nothing.

    Returns:
        The sweep's results, as written to ``out/results.json`` ([`Results`][optiscope.sweep.Results]).

    Raises:
        ConfigError: a bad setting: an experiment that declares no objective, an unknown ``objective``, ``seeds``
            outside 1 to 10,000, ``workers`` < 1, an unknown ``backend``, ``address`` without Ray, ``lrs`` empty,
            not finite and > 0, or named twice, ``optimizers`` empty, repeated, spaced, not a tuple of names, an
            unknown or unimportable optimizer, or with ``@η`` beside ``lrs``, an ``options`` key the sweep sets
            itself, an option the experiment refuses, no usual η and neither ``@η`` nor ``lrs``. Also a trial whose
            experiment refused its options when it ran: the sweep stops once the other trials of that round have
            ended.
        RunDirError: ``out`` cannot be used as asked (it holds another run without ``resume`` or ``force``, both
            given, another process holds it, a resume with settings that change results).
        UserError: ``backend="ray"`` and Ray is not installed.
        KeyboardInterrupt: Ctrl-C: every trial running stops after a complete step, with its checkpoint;
            ``resume=True`` continues the sweep.

    Examples:
        >>> from optiscope.sweep import SweepConfig, run_sweep
        >>> options = {"steps": 300, "tolerance": 1e-2, "bias_steps": 10, "decay_steps": 10}
        >>> config = SweepConfig("landscapes", ("adam",), seeds=1, lrs=(0.1, 0.3), options=options)
        >>> results = run_sweep(config, "sweep")
        >>> results["optimizers"]["adam"]["tuned_lr"], len(results["trials"])
        (0.3, 3)
        >>> run_sweep(SweepConfig("entropy", ("adam",)), "sweep-entropy")
        Traceback (most recent call last):
        optiscope.errors.ConfigError: experiment 'entropy' declares no objective to tune for; ...

    Notes:
        A killed sweep resumed with ``resume=True`` ends with the results an uninterrupted sweep would have (wall
        times aside). A trial that crashed (memory that ran out, a machine lost) is recorded with its error
        (traceback in its ``error.log``), counts as the worst value and the sweep goes on; a diverged trial counts
        as the worst value too. A refused trial leaves nothing behind, so the corrected call needs no ``force``; a
        trial of that round that finished is recorded. A last record cut short in ``trials.jsonl`` (a full disk)
        is dropped on resume, so the next record does not run into it.

        A local pool whose worker dies runs the unfinished trials of that round again one at a time, each alone
        in a fresh worker; one that kills its worker again is recorded as crashed. On Ray a trial whose worker
        died (its memory, its node) is recorded as crashed after Ray's own retries.

        A sweep stopped by Ctrl-C or SIGTERM asks each pool worker once to stop its trial after a complete step,
        starts no other, and waits for them (killing any still running after 2 minutes, from its last
        checkpoint; a second Ctrl-C stops them at once). Workers of a sweep killed outright stop the same way by
        themselves, and a trial resumed meanwhile waits up to 2 minutes for its folder to be let go.
    """
    plan = check(config)
    ignored = tuple(f.name for f in dataclasses.fields(SweepConfig) if f.metadata.get("affects_results") is False)
    with (
        runs.open_run(
            out, "sweep", settings(config, plan), resume=resume, force=force, ignored=ignored, owned=OWNS
        ) as run_dir,
        open_backend(config.backend, config.workers, config.address) as backend,
    ):
        path = run_dir.path
        if config.lr_from == "suggest":
            plan = suggested_centres(config, plan, path)
        records = {(r["optimizer"], r["lr"], r["seed"]): r for r in runs.read_jsonl(path / RECORDS)}
        # a trial that crashed in an earlier invocation is planned again: a crash is no result of the
        # optimizer (memory that ran out, a machine lost), and its run directory continues from its checkpoints
        records = {key: r for key, r in records.items() if r["status"] != "crashed"}
        if resume:  # a last line cut short (a full disk) would run into the next record appended after it
            runs.truncate_jsonl(path / RECORDS, lambda record: True)
        while batch := pending(config, plan, path, records):
            refused = None
            for record in backend.run(batch):
                # a refusal stops the sweep once the round's other trials have ended by themselves: a trial
                # stopped half-way (a Ray task killed) would leave its folder behind, and one that finished keeps
                # its results, recorded
                if record["status"] == REFUSED:
                    refused = refused or record
                    continue
                record["dir"] = str(trial_dir(Path(), record["optimizer"], record["lr"], record["seed"]))
                runs.append_jsonl(path / RECORDS, record)
                records[(record["optimizer"], record["lr"], record["seed"])] = record
                report(record)
            if refused is not None:
                raise ConfigError(f"{refused['error']} (trial {refused['label']} seed {refused['seed']})")
        declared = experiments.objectives(config.experiment)[plan.objective]
        objective = {
            "name": plan.objective,
            "description": declared.description,
            "direction": declared.direction,
            "curve": declared.curve_label or declared.description,
        }
        factor = None if config.lrs else config.factor
        results = summarise(
            config.experiment,
            list(records.values()),
            plan.names,
            plan.centres,
            plan.seeds,
            plan.fresh,
            objective,
            factor,
        )
        runs.atomic_write_json(path / runs.RESULTS, results)
        if then is not None:
            then(results)
    return results
