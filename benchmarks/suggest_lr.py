"""How good is ``optiscope.suggest_lr``? Its suggestions, and the baselines', scored against tuned sweeps.

Every case is one task at one batch size with one optimizer (3 tasks × 2 batch sizes × 5 optimizers). The ground
truth of a case is a real ``optiscope sweep`` of it on a grid of ratio √2 with 3 tuning seeds and 3 fresh ones:
η* is its tuned η, the flat band the grid's η whose mean over the tuning seeds is within one standard error of the
best mean (the band is widened position by position while its edge is in it, each with the tuning seeds). Each
method then suggests an η from at most 5 % of the run's steps × batch (a Hessian-vector product counts as two
forward+backward passes), never seeing the sweep; its final loss is the tuning seeds' mean at the grid η nearest to
it (within 2^¼; trials run there when the sweep did not). Stages, each resumable (results are appended as they come):

    python benchmarks/suggest_lr.py truth --out runs/suggest-lr         # the sweeps (hours on one core)
    python benchmarks/suggest_lr.py suggest --out runs/suggest-lr       # every method and lr_find on every case
    python benchmarks/suggest_lr.py score --out runs/suggest-lr         # σ fitted; trials at the suggestions
    python benchmarks/suggest_lr.py from-suggest --out runs/suggest-lr  # sweeps --lr-from suggest (held-out task)
    python benchmarks/suggest_lr.py report --out runs/suggest-lr        # the page's tables (Markdown)

Every process runs on one torch thread; run it under ``nice -n 10`` on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from optiscope import experiments, runs
from optiscope.optim import load_recipes
from optiscope.optim.recipes import recipe, registered
from optiscope.sweep import SweepConfig, run_sweep
from optiscope.sweep.grid import auto_lr
from optiscope.sweep.trial import Trial, run_trial

ROOT = Path(__file__).resolve().parents[1]
#: The zoo's recipes (``docs/experiments/zoo.toml``): ADOPT is a case's optimizer, Prodigy and Schedule-Free AdamW
#: the parameter-free baselines.
ZOO = ROOT / "docs" / "experiments" / "zoo.toml"
FACTOR = math.sqrt(2)
SEEDS = 3
#: The optimizers of every task: momentum, AdamW, Adam+L2, NAdam (threshold known) and ADOPT (from the zoo: none).
OPTIMIZERS = ("momentum", "adamw", "adaml2", "torch.optim.NAdam", "adopt")
#: The parameter-free baselines, each at its recipe's default η.
PARAMETER_FREE = ("prodigy", "schedule-free-adamw")


@dataclass(frozen=True)
class Task:
    """An experiment in the configuration the evaluation runs, at its two batch sizes."""

    experiment: str
    quick: bool
    objective: str
    batch_sizes: tuple[int, int]
    #: where each optimizer's sweep starts (the experiment's usual η, or a usual one for an optimizer it has none for)
    centres: dict[str, float]

    def options(self, batch_size: int) -> dict[str, Any]:
        if self.experiment == "lm":  # the published reduced configuration, evaluated at its end only (the objective
            # is the last evaluation's, which evaluating more often does not change); the same 96 validation sequences
            return {
                "steps": 400,
                "eval_every": 400,
                "warmup_steps": 40,
                "sample_tokens": 0,
                "batch_size": batch_size,
                "eval_batches": max(1, 96 // batch_size),
            }
        if self.experiment == "adder":  # the quick model (295 parameters) for 1,000 steps; the suite scored at the end
            return {"steps": 1000, "carry_steps": 500, "eval_every": 1000, "batch_size": batch_size}
        return {"batch_size": batch_size}


TASKS = {
    "lm": Task(
        "lm", True, "val_loss", (12, 4), {"momentum": 0.05, "adamw": 1e-3, "adaml2": 1e-3, "torch.optim.NAdam": 2e-3}
    ),
    "adder": Task("adder", True, "train_loss", (256, 64), {}),
    "mlp": Task("mlp", False, "val_loss", (32, 128), {"torch.optim.NAdam": 2e-3}),
}


@dataclass(frozen=True)
class Case:
    task: str
    batch_size: int
    optimizer: str

    @property
    def name(self) -> str:
        return f"{self.task}-bs{self.batch_size}-{self.optimizer}"


#: The order the cases run in: the calibration tasks' first.
ORDER = (("lm", 12), ("mlp", 32), ("mlp", 128), ("adder", 256), ("adder", 64), ("lm", 4))


def cases() -> list[Case]:
    return [Case(t, b, o) for t, b in ORDER for o in OPTIMIZERS]


# ------------------------------------------------------------------------------------------------- ground truth
def sweep_config(case: Case, lr_from: str = "usual") -> SweepConfig:
    task = TASKS[case.task]
    centre = task.centres.get(case.optimizer)
    named = f"{case.optimizer}@{centre:g}" if centre is not None and lr_from == "usual" else case.optimizer
    return SweepConfig(
        task.experiment,
        (named,),
        seeds=SEEDS,
        objective=task.objective,
        quick=task.quick,
        options=task.options(case.batch_size),
        factor=FACTOR,
        lr_from=lr_from,
    )


def sweep_dir(out: Path, case: Case, lr_from: str = "usual") -> Path:
    return out / ("truth" if lr_from == "usual" else "from-suggest") / case.name


def swept(out: Path, case: Case, lr_from: str = "usual") -> dict[str, Any]:
    """The case's sweep (run, or continued, or read back when done)."""
    path = sweep_dir(out, case, lr_from)
    if (path / runs.RESULTS).is_file():
        return runs.read_json(path / runs.RESULTS)
    return run_sweep(sweep_config(case, lr_from), path, resume=path.exists())


def trial(out: Path, case: Case, optimizer: str, lr: float, seed: int, cache: str = "extra.jsonl") -> dict[str, Any]:
    """One more trial of the case's task (the sweep's own trial runner), cached in ``cache``."""
    cache = out / cache
    key = (case.task, case.batch_size, optimizer, lr, seed)
    for record in runs.read_jsonl(cache) if cache.is_file() else []:
        if tuple(record["key"]) == key:
            return record
    task = TASKS[case.task]
    module = experiments.EXPERIMENTS[task.experiment]
    declared = tuple(experiments.objectives(task.experiment))
    record = run_trial(
        Trial(
            task.experiment,
            module,
            optimizer,
            lr,
            seed,
            task.quick,
            task.options(case.batch_size),
            declared,
            str(out / "extra" / f"{case.task}-bs{case.batch_size}" / f"{optimizer}@{lr:g}" / f"seed-{seed}"),
            task.objective,
            registered([optimizer]),
        )
    )
    record = {"key": list(key), **{k: record[k] for k in ("status", "objective", "wall_seconds", "error")}}
    runs.append_jsonl(cache, record)
    return record


def values_at(out: Path, case: Case, sweep: dict[str, Any], lr: float) -> list[float]:
    """The objective of each tuning seed at ``lr``: from the sweep's trials, else run."""
    done = {(t["lr"], t["seed"]): t["objective"] for t in sweep["trials"]}
    return [
        done[(lr, s)] if (lr, s) in done else trial(out, case, case.optimizer, lr, s)["objective"]
        for s in sweep["seeds"]
    ]


def mean_se(values: list[float]) -> tuple[float, float, float]:
    """(mean, standard deviation, standard error) of ``values``; inf for a value that is."""
    if not all(math.isfinite(v) for v in values):
        return math.inf, math.inf, math.inf
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std, std / math.sqrt(len(values))


def truth(out: Path, case: Case) -> dict[str, Any]:
    """η*, the flat band and the grid's tuning-seed means around it, from the case's sweep (and trials beside it).

    The sweep names the best of the three η it ran with every tuning seed; η* is the best tuning-seed mean on the
    grid once each neighbour of it has been run with every seed too (where one is better, η* moves there and its
    next neighbour is run). The band then widens from η* one position at a time while the position is within one
    standard error of η*'s mean (at most 6 positions, √2⁶ = 8×, each way)."""
    sweep = swept(out, case)
    tuned = sweep["optimizers"][case.optimizer]
    centre = tuned["centre_lr"]
    if tuned["tuned_lr"] is None:
        return {"case": case.name, "eta_star": None, "trials": len(sweep["trials"])}
    grid: dict[int, tuple[float, float, float]] = {}

    def stats(k: int) -> tuple[float, float, float]:
        if k not in grid:
            grid[k] = mean_se(values_at(out, case, sweep, auto_lr(centre, k, FACTOR)))
        return grid[k]

    k_star = round(math.log(tuned["tuned_lr"] / centre) / math.log(FACTOR))
    while True:  # η*: a position whose measured neighbours are both worse
        best = min((k_star - 1, k_star, k_star + 1), key=lambda k: (stats(k)[0], k))
        if best == k_star:
            break
        k_star = best
    best_mean, best_std, best_se = stats(k_star)
    band = [k_star, k_star]
    for side in (-1, 1):
        k = k_star
        while abs(k - k_star) < 6 and stats(k + side)[0] <= best_mean + best_se:
            k += side
        band[0 if side < 0 else 1] = k
    return {
        "case": case.name,
        "centre": centre,
        "eta_star": auto_lr(centre, k_star, FACTOR),
        "k_star": k_star,
        "sweep_tuned_lr": tuned["tuned_lr"],
        "tuned_mean": best_mean,
        "seed_std": best_std,
        "seed_se": best_se,
        "band": [auto_lr(centre, band[0], FACTOR), auto_lr(centre, band[1], FACTOR)],
        "interior": tuned["interior"],
        "fresh_mean": tuned["mean"],
        "grid": {
            str(k): {"lr": auto_lr(centre, k, FACTOR), "mean": m, "std": s} for k, (m, s, _) in sorted(grid.items())
        },
        "trials": len(sweep["trials"]),
        "search_trials": sum(1 for t in sweep["trials"] if t["seed"] == sweep["seeds"][0]),
    }


def stage_truth(out: Path, only: str | None, again: bool = False) -> None:
    """Each case's ground truth, appended to ``truth.jsonl`` (``again``: recomputed for the cases already there, from
    their sweeps and the trials cached beside them; the last record of a case is the one read)."""
    path = out / "truth.jsonl"
    done = {r["case"] for r in runs.read_jsonl(path)} if path.is_file() and not again else set()
    for case in cases():
        if case.name in done or (only and only not in case.name):
            continue
        started = time.perf_counter()
        record = truth(out, case)
        runs.append_jsonl(path, record)
        print(
            f"{case.name}: η* {record['eta_star']}, band {record.get('band')}, {record['trials']} trials, "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )


# ------------------------------------------------------------------------------------------------- suggestions
#: The share of a run's steps × batch a suggestion may spend.
BUDGET = 0.05
#: What the evaluation runs for each case besides suggest_lr's methods: Lightning's lr_find at the same budget
#: (its steepest-slope suggestion, and the valley rule on its curve) and at its default 100 steps.
LR_FIND = ("lr_find", "lr_find-valley", "lr_find-100", "lr_find-100-valley")


def trainee_of(case: Case) -> tuple[Any, experiments.Trainee]:
    task = TASKS[case.task]
    module = experiments.load(task.experiment)
    options = {**task.options(case.batch_size), "optimizers": f"{case.optimizer}@1"}
    config = experiments.build_config(module, task.quick, options)
    return config, module.trainee(config, module.runs_of(config)[0])


def budget_of(trainee: experiments.Trainee) -> int:
    return int(BUDGET * trainee.steps)


def run_method(case: Case, method: str) -> dict[str, Any]:
    """suggest_lr's ``method`` on the case, within the budget: its edge (σ is fitted later), what it spent."""
    from optiscope.suggest import suggest_lr

    _, trainee = trainee_of(case)
    started = time.thread_time()
    try:
        s = suggest_lr(
            trainee.model,
            case.optimizer,
            trainee.loss_fn,
            trainee.batches,
            steps=budget_of(trainee),
            method=method,
            weight_decay=trainee.weight_decay,
            decay_vectors=trainee.decay_vectors,
        )
    except ValueError as e:  # a method that reads no edge here (SuggestionError) is a failure of it, recorded
        return {"edge": None, "error": " ".join(str(e).split()), "seconds": time.thread_time() - started}
    measured = [p["sharpness"] for p in s.probes if p["kind"] in ("sharpness", "curvature")]
    return {
        "edge": s.edge,
        "method_used": s.method,
        "steps_used": s.steps_used,
        "steps": s.steps,
        "threshold": s.threshold,
        "measured": measured,
        "seconds": time.thread_time() - started,
    }


def run_lr_find(case: Case, steps: int) -> dict[str, dict[str, Any]]:
    """Lightning's own ``Tuner.lr_find`` on the case's model, loss, batches and optimizer (its defaults but
    ``num_training=steps``, and the run's gradient clipping), its default suggestion and the valley rule on its
    curve."""
    import logging

    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader

    from optiscope.optim import build_optimizer
    from optiscope.suggest.methods import valley

    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    config, trainee = trainee_of(case)
    batches = [b for _, b in zip(range(steps), trainee.batches, strict=False)]

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = trainee.model
            self.lr = 1e-3

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            return trainee.loss_fn(self.model, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return build_optimizer(
                case.optimizer, self.model, self.lr, trainee.weight_decay, decay_vectors=trainee.decay_vectors
            )

    clip = getattr(config, "clip", None)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=clip,
        default_root_dir=str(Path("/tmp") / "suggest-lr-lightning"),
    )
    started = time.thread_time()
    finder = Tuner(trainer).lr_find(
        Module(), train_dataloaders=DataLoader(batches, batch_size=None), num_training=steps
    )
    seconds = time.thread_time() - started
    steepest = finder.suggestion() if finder is not None else None
    curve = (finder.results["lr"], finder.results["loss"]) if finder is not None else ([], [])
    found = valley(*curve)
    used = len(curve[0])
    return {
        "steepest": {"edge": steepest, "steps_used": used, "steps": steps, "seconds": seconds},
        "valley": {"edge": found, "steps_used": used, "steps": steps, "seconds": seconds},
    }


def stage_suggest(out: Path, only: str | None) -> None:
    from optiscope.suggest.methods import METHODS

    path = out / "suggest.jsonl"
    done = {(r["case"], r["method"]) for r in runs.read_jsonl(path)} if path.is_file() else set()
    torch.manual_seed(0)
    for case in cases():
        if only and only not in case.name:
            continue
        for method in METHODS:
            if (case.name, method) not in done:
                runs.append_jsonl(path, {"case": case.name, "method": method, **run_method(case, method)})
        _, trainee = trainee_of(case)
        for steps, names in ((budget_of(trainee), LR_FIND[:2]), (100, LR_FIND[2:])):
            if all((case.name, n) in done for n in names):
                continue
            found = run_lr_find(case, steps)
            for name, rule in zip(names, ("steepest", "valley"), strict=True):
                runs.append_jsonl(path, {"case": case.name, "method": name, **found[rule]})
        print(f"{case.name}: suggestions recorded", flush=True)


# ------------------------------------------------------------------------------------------------------ scores
#: The tasks σ is fitted on; the third is held out (and each is held out in turn: ``loto``).
CALIBRATION = ("lm", "adder")
#: How many seed standard deviations above the tuned mean a single seed's value must be for the position to count
#: as outside the seed noise without running the other seeds.
CLEARLY_WORSE = 3.0
#: The loss is measured (trials run) at the suggestions of these: the default method and the baselines.
LOSS_MEASURED = ("sharpness", "limits", "lr_find", "lr_find-valley")


def latest(path: Path, key: str) -> dict[str, dict[str, Any]]:
    """The last record per ``key`` of a JSONL file (later ones supersede earlier ones)."""
    return {r[key]: r for r in runs.read_jsonl(path)} if path.is_file() else {}


def by_name(name: str) -> Case:
    return next(c for c in cases() if c.name == name)


def fit(points: list[tuple[float, float]]) -> tuple[float, tuple[float, float]] | None:
    """σ = exp(median log(η*/edge)) over (edge, η*) pairs, and the band (10th, 90th percentile of η*/(σ·edge))."""
    logs = sorted(math.log(star / edge) for edge, star in points if edge and star)
    if not logs:
        return None
    sigma = math.exp(statistics.median(logs))
    spread = [math.exp(v) / sigma for v in logs]
    q = statistics.quantiles(spread, n=10, method="inclusive") if len(spread) > 1 else [spread[0]] * 9
    return sigma, (q[0], q[-1])


def position(record: dict[str, Any], lr: float) -> int:
    """The grid position nearest ``lr`` (in log η): within 2^¼ of it."""
    return round(math.log(lr / record["centre"]) / math.log(FACTOR))


def loss_at(out: Path, record: dict[str, Any], lr: float) -> dict[str, Any]:
    """The tuning seeds' mean loss at the grid η nearest ``lr`` and its distance from the tuned mean in seed standard
    deviations: from the sweep's and the band's trials, else run (one seed first: a value ``CLEARLY_WORSE`` above
    the tuned mean is outside the noise whatever the other seeds give)."""
    case = by_name(record["case"])
    k = position(record, lr)
    grid_lr = auto_lr(record["centre"], k, FACTOR)
    sweep = swept(out, case)
    seeds = sweep["seeds"]
    done = {(t["lr"], t["seed"]): t["objective"] for t in sweep["trials"]}
    first = done.get((grid_lr, seeds[0]))
    if first is None:
        first = trial(out, case, case.optimizer, grid_lr, seeds[0])["objective"]
    std = max(record["seed_std"], 1e-12)
    if not math.isfinite(first) or first > record["tuned_mean"] + CLEARLY_WORSE * std:
        values = [first]
    else:
        values = values_at(out, case, sweep, grid_lr)
    mean = statistics.fmean(values) if all(math.isfinite(v) for v in values) else math.inf
    return {"grid_lr": grid_lr, "k": k, "mean": mean, "seeds": len(values), "z": (mean - record["tuned_mean"]) / std}


def score(record: dict[str, Any], lr: float | None) -> dict[str, Any]:
    """|log₂(η/η*)|, within 2× of η*, and inside the band (the nearest grid η between the band's ends)."""
    if lr is None or not lr > 0:
        return {"lr": None, "log2": None, "within_2x": False, "in_band": False}
    low, high = (position(record, b) for b in record["band"])
    return {
        "lr": lr,
        "log2": abs(math.log2(lr / record["eta_star"])),
        "within_2x": abs(math.log2(lr / record["eta_star"])) <= 1,
        "in_band": low <= position(record, lr) <= high,
    }


def stage_score(out: Path) -> None:
    """Fit σ (calibration tasks; and each task left out in turn), score every method and baseline on every case,
    measure the loss at the suggestions of ``LOSS_MEASURED``, and write ``scores.json``."""
    truths = {name: r for name, r in latest(out / "truth.jsonl", "case").items() if r.get("eta_star")}
    raw: dict[str, dict[str, Any]] = {}
    for r in runs.read_jsonl(out / "suggest.jsonl"):
        raw.setdefault(r["case"], {})[r["method"]] = r
    methods = [m for m in next(iter(raw.values())) if m not in LR_FIND]
    fits: dict[str, dict[str, Any]] = {}
    for method in methods:
        for held in (None, *TASKS):  # None: the shipped fit (calibration tasks); a task: fitted without it
            seen = CALIBRATION if held is None else tuple(t for t in TASKS if t != held)
            points = [
                (raw[c][method]["edge"], truths[c]["eta_star"])
                for c in truths
                if by_name(c).task in seen and method in raw.get(c, {}) and raw[c][method].get("method_used") == method
            ]
            found = fit(points)
            fits.setdefault(method, {})[held or "shipped"] = (
                None if found is None else {"sigma": found[0], "band": found[1], "cases": len(points)}
            )
    rows = []
    for name, record in truths.items():
        case = by_name(name)
        for method, r in raw.get(name, {}).items():
            row = {
                "case": name,
                "task": case.task,
                "batch_size": case.batch_size,
                "optimizer": case.optimizer,
                "method": method,
            }
            if method in LR_FIND:
                row["shipped"] = score(record, r["edge"])
                row["loto"] = row["shipped"]
                row["fallback"] = False
            else:
                used = r.get("method_used") or method
                kind = method if used == method else FALLBACK_METHOD
                for which, held in (("shipped", "shipped"), ("loto", case.task)):
                    fitted = fits.get(kind, {}).get(held)
                    lr = None if fitted is None or r["edge"] is None else fitted["sigma"] * r["edge"]
                    row[which] = score(record, lr)
                row["fallback"] = used != method
            row["steps_used"] = r.get("steps_used")
            row["steps"] = r.get("steps")
            if method in LOSS_MEASURED:
                for which in ("shipped", "loto"):
                    if row[which]["lr"] is not None:
                        row[which]["loss"] = loss_at(out, record, row[which]["lr"])
            rows.append(row)
            print(f"{name} {method}: {row['shipped']}", flush=True)
    runs.atomic_write_json(
        out / "scores.json", {"fits": fits, "rows": rows, "truth": truths, "parameter_free": parameter_free(out)}
    )


def parameter_free(out: Path) -> dict[str, dict[str, Any]]:
    """Prodigy and Schedule-Free AdamW at their recipes' default η on every task and batch size, with the tuning
    seeds (trials cached in ``free.jsonl``)."""
    free = {}
    for task_name, task in TASKS.items():
        for b in task.batch_sizes:
            for optimizer in PARAMETER_FREE:
                case = Case(task_name, b, optimizer)
                lr = recipe(optimizer).lr
                values = [trial(out, case, optimizer, lr, s, "free.jsonl")["objective"] for s in seeds_of(task_name)]
                free[f"{task_name}-bs{b}-{optimizer}"] = {"lr": lr, "values": values}
    return free


#: The fallback's fitted method (an optimizer without a threshold gets the range test).
FALLBACK_METHOD = "range-test"


def seeds_of(task: str) -> list[int]:
    """The tuning seeds of a task's sweeps (the experiment's default seed and the next two)."""
    module = experiments.load(TASKS[task].experiment)
    seed = module.Config().seed
    return [seed + i for i in range(SEEDS)]


# ------------------------------------------------------------------------------------------ --lr-from suggest
#: The cases whose sweep is run again from the suggestion: the held-out task's (a sweep costs ~15 trials a case).
FROM_SUGGEST = ("mlp",)


def stage_from_suggest(out: Path, only: str | None) -> None:
    """``optiscope sweep --lr-from suggest --factor 1.414`` on the held-out task's cases, for its trial count and its
    tuned η against the full sweep's."""
    path = out / "from-suggest.jsonl"
    done = {r["case"] for r in runs.read_jsonl(path)} if path.is_file() else set()
    for case in cases():
        if case.task not in FROM_SUGGEST or case.name in done or (only and only not in case.name):
            continue
        results = swept(out, case, lr_from="suggest")
        tuned = results["optimizers"][case.optimizer]
        record = {
            "case": case.name,
            "centre": tuned["centre_lr"],
            "tuned_lr": tuned["tuned_lr"],
            "trials": len(results["trials"]),
            "search_trials": sum(1 for t in results["trials"] if t["seed"] == results["seeds"][0]),
        }
        runs.append_jsonl(path, record)
        print(f"{case.name}: from the suggestion {record}", flush=True)


# ------------------------------------------------------------------------------------------------------ report
def share(values: list[bool]) -> str:
    return f"{sum(values)}/{len(values)}" if values else "—"


def median(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.2f}" if values else "—"


def stage_report(out: Path) -> None:
    """The tables of the evaluation page, in Markdown, from ``scores.json`` (and ``from-suggest.jsonl``)."""
    scores = runs.read_json(out / "scores.json")
    rows, fits, truths = scores["rows"], scores["fits"], scores["truth"]
    print("## σ fitted (shipped: on " + ", ".join(CALIBRATION) + ")\n")
    print("| method | σ (shipped) | band (×) | cases | σ without lm | σ without adder | σ without mlp |")
    print("|---|---|---|---|---|---|---|")
    for method, fitted in fits.items():
        shipped = fitted.get("shipped")
        loto = [fitted.get(t) for t in TASKS]
        cells = [f"{f['sigma']:.3g}" if f else "—" for f in loto]
        band = f"{shipped['band'][0]:.2f} … {shipped['band'][1]:.2f}" if shipped else "—"
        sigma = f"{shipped['sigma']:.3g}" if shipped else "—"
        print(f"| {method} | {sigma} | {band} | {shipped['cases'] if shipped else 0} | " + " | ".join(cells) + " |")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for which, title in (("shipped", "shipped σ"), ("loto", "σ fitted without the task")):
        print(f"\n## Scores, {title}\n")
        print("| method | task | median abs(log₂ η/η*) | within 2× | in the band | loss within the noise |")
        print("|---|---|---|---|---|---|")
        for method in methods:
            for task in TASKS:
                chosen = [r for r in rows if r["method"] == method and r["task"] == task]
                got = [r[which] for r in chosen]
                losses = [g["loss"]["z"] <= 1 for g in got if g.get("loss")]
                print(
                    f"| {method} | {task} | {median([g['log2'] for g in got])} | "
                    f"{share([g['within_2x'] for g in got])} | {share([g['in_band'] for g in got])} | "
                    f"{share(losses)} |"
                )
    print("\n## Every case (shipped σ)\n")
    print("| case | η* | band | seed std | " + " | ".join(methods) + " |")
    print("|---|---|---|---|" + "---|" * len(methods))
    for name, truth in truths.items():
        cells = []
        for method in methods:
            row = next((r for r in rows if r["case"] == name and r["method"] == method), None)
            got = row["shipped"] if row else {}
            if not got or got.get("lr") is None:
                cells.append("—")
                continue
            z = f", z {got['loss']['z']:.1f}" if got.get("loss") else ""
            mark = "" if got["in_band"] else ("°" if got["within_2x"] else "✗")
            cells.append(f"{got['lr']:.3g}{mark}{z}")
        band = f"{truth['band'][0]:.3g} … {truth['band'][1]:.3g}"
        print(f"| {name} | {truth['eta_star']:.3g} | {band} | {truth['seed_std']:.3f} | " + " | ".join(cells) + " |")
    print("\n## Parameter-free baselines at their defaults (z against each case's tuned mean)\n")
    for key, free in scores["parameter_free"].items():
        task, batch, optimizer = key.split("-", 2)
        mean = statistics.fmean(free["values"]) if all(math.isfinite(v) for v in free["values"]) else math.inf
        zs = []
        for name, truth in truths.items():
            if name.startswith(f"{task}-{batch}-"):
                zs.append(f"{name.split('-', 2)[2]} {(mean - truth['tuned_mean']) / truth['seed_std']:.1f}")
        print(f"- {key}: mean {mean:.4g} (η {free['lr']:g}); z: " + (", ".join(zs) or "no tuned case to compare"))
    print("\n## What it cost\n")
    for kind in ("truth", "from-suggest"):
        records = [r for d in sorted((out / kind).glob("*")) for r in runs.read_jsonl(d / "trials.jsonl")]
        hours = sum(r["wall_seconds"] for r in records) / 3600
        print(f"- {kind} sweeps: {len(records)} trials, {hours:.1f} hours of trial time")
    for cache in ("extra.jsonl", "free.jsonl"):
        records = runs.read_jsonl(out / cache) if (out / cache).is_file() else []
        hours = sum(r["wall_seconds"] for r in records) / 3600
        print(f"- {cache}: {len(records)} trials, {hours:.1f} hours of trial time")
    path = out / "from-suggest.jsonl"
    if path.is_file():
        print("\n## --lr-from suggest against the full sweep\n")
        print("| case | η* (full) | trials (full) | centre | tuned η | in the band | trials |")
        print("|---|---|---|---|---|---|---|")
        for r in runs.read_jsonl(path):
            truth = truths.get(r["case"])
            if truth is None:
                continue
            same = score(truth, r["tuned_lr"])["in_band"]
            print(
                f"| {r['case']} | {truth['eta_star']:.3g} | {truth['trials']} | {r['centre']:.3g} | "
                f"{r['tuned_lr']:.3g} | {same} | {r['trials']} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("truth", "suggest", "free", "score", "from-suggest", "report"))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "suggest-lr")
    parser.add_argument("--only", default=None, help="only the cases whose name contains this")
    parser.add_argument("--again", action="store_true", help="truth: recompute the cases already recorded")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_recipes(ZOO)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage == "truth":
        stage_truth(args.out, args.only, args.again)
    elif args.stage == "suggest":
        stage_suggest(args.out, args.only)
    elif args.stage == "free":
        parameter_free(args.out)
    elif args.stage == "score":
        stage_score(args.out)
    elif args.stage == "from-suggest":
        stage_from_suggest(args.out, args.only)
    else:
        stage_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
