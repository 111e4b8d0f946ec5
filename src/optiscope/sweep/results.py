"""A sweep's ``results.json``: every trial, and per optimizer the tuned learning rate, the statistics of
its fresh seeds (``grid``: seeds that chose nothing) and the sensitivity curve of the tuning seeds; which
optimizer is best and whether the best two differ beyond the seed noise; and, for objectives read from a
curve, the steps each tuned optimizer needs to reach a common target. Computed here from the trial
records; ``figures.sweep`` only draws it."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from .grid import tuned_position
from .stats import difference_interval, mean_interval, mean_std


class TrialRecord(TypedDict):
    """One trial as results.json keeps it (``trial.run_trial``'s record)."""

    optimizer: str
    lr: float
    seed: int
    status: str
    objective: float
    objectives: dict[str, float]
    steps: int | None
    wall_seconds: float
    error: str | None
    dir: str


class Point(TypedDict):
    lr: float
    values: list[float]
    mean: float
    seeds: list[int]


class Tuned(TypedDict):
    centre_lr: float
    tuned_lr: float | None
    interior: bool
    #: the fresh seeds' values at the tuned lr, their mean, std and Student's interval of the mean
    values: list[float]
    mean: float
    std: float
    interval: list[float]
    #: the mean of the tuning seeds at the tuned lr: the best of the means that chose it (biased); absent from
    #: results written before sweeps ran fresh seeds, whose ``values`` are the tuning seeds'
    tuning_mean: NotRequired[float]
    #: the tuning seeds' values at every lr
    sensitivity: list[Point]


class Results(TypedDict):
    """A sweep's ``results.json``: every trial, and per optimizer the tuned η and its fresh seeds' statistics.

    Per optimizer, over its N fresh seeds' values x₁ … x_N at the tuned η: the mean x̄, the standard deviation s
    and Student's 95 % interval x̄ ± t₀.₉₇₅(N−1) · s/√N. Each optimizer is compared with the next in the
    ranking by the difference of their means and Welch's 95 % interval of it: "beyond seed noise" when the
    interval excludes 0 (Welch's t test at 5 %).

    Attributes:
        experiment: ``"sweep"``.
        swept: the experiment swept, e.g. ``"lm"``.
        status: ``"ok"`` while any trial has a finite value; else ``"diverged"`` when every trial diverged,
            ``"failed"`` otherwise (the command line then exits 3).
        objective: ``name``, ``description``, ``direction`` (``"min"``/``"max"``) and ``curve`` (what its curve
            shows).
        factor: the ratio between neighbouring η of the automatic grid (√10); None for a fixed grid (``lrs``).
        seeds: the tuning seeds.
        fresh_seeds: the fresh seeds, run at the tuned η (absent from results written before sweeps ran them).
        optimizers: per optimizer: ``centre_lr`` (η₀), ``tuned_lr`` (None: no η has a value for every tuning
            seed), ``interior`` (False: the tuned η is at an end of the grid run, the optimum may lie beyond),
            ``values`` (the fresh seeds'), ``mean``, ``std``, ``interval`` (Student's 95 % interval of the mean;
            NaN from one seed), ``tuning_mean`` (the tuning seeds' mean at the tuned η: biased to the good side)
            and ``sensitivity`` (per η, increasing: ``lr``, the tuning seeds' ``values``, their ``mean`` and
            ``seeds``).
        ranking: the optimizers with a tuned η, best mean first; one whose fresh seeds failed (a mean that is not
            finite) last.
        comparison: the best two compared (the first of ``neighbours``), or None with fewer than two ranked.
        neighbours: each ranked optimizer against the next: ``best``, ``second``, ``difference`` of means,
            ``interval`` (Welch's 95 %), ``differ`` (beyond seed noise) and ``verdict`` (one sentence).
        steps_to_target: for objectives read from a curve: ``target`` (the worst tuned mean, which every tuned
            optimizer reaches), ``slowest``, and per optimizer ``steps`` (on its fresh seeds' mean curve),
            ``seed_steps`` (each seed's own curve; +∞: never), ``seeds`` and ``fraction_of_slowest``; else None.
        trials: every trial's record: ``optimizer``, ``lr``, ``seed``, ``status`` (``"ok"``, ``"diverged"``,
            ``"crashed"``), ``objective`` (±∞: diverged, crashed or missed the target), ``objectives`` (every
            declared one), ``steps``, ``wall_seconds``, ``error`` and ``dir`` (relative to the sweep directory).

    Examples:
        >>> import json
        >>> from pathlib import Path
        >>> from optiscope.sweep import SweepConfig, run_sweep
        >>> options = {"steps": 300, "tolerance": 1e-2, "bias_steps": 10, "decay_steps": 10}
        >>> _ = run_sweep(SweepConfig("landscapes", ("adam",), seeds=1, lrs=(0.1, 0.3), options=options), "sweep")
        >>> results = json.loads(Path("sweep/results.json").read_text())
        >>> results["ranking"], results["objective"]["name"], results["seeds"], results["fresh_seeds"]
        (['adam'], 'steps_ravine', [0], [1])
        >>> adam = results["optimizers"]["adam"]
        >>> adam["tuned_lr"], adam["interior"], [point["lr"] for point in adam["sensitivity"]]
        (0.3, False, [0.1, 0.3])

    Notes:
        Fresh seeds that all give one value while the seed changes the value elsewhere in the sweep (an objective
        read at evaluations, such as steps to a target, ties seeds by chance) get no interval and no verdict
        beyond "the seed noise is not measured"; only where every seed gives one value at every η (landscapes'
        surfaces) is a difference called exact. An optimizer with a fresh seed that diverged, crashed or missed
        the target gets no interval. Both intervals assume normally scattered seeds; t₀.₉₇₅ with 2 degrees of
        freedom is 4.30, so three seeds give wide intervals. Non-finite numbers are written as JSON's ``NaN``
        and ``Infinity``, which Python's ``json`` reads.
    """

    experiment: str
    swept: str
    status: str
    objective: dict[str, Any]
    factor: float | None
    seeds: list[int]
    fresh_seeds: NotRequired[list[int]]  # absent from results written before sweeps ran fresh seeds
    optimizers: dict[str, Tuned]
    ranking: list[str]
    comparison: dict[str, Any] | None
    neighbours: list[dict[str, Any]]
    steps_to_target: dict[str, Any] | None
    trials: list[TrialRecord]


def _signed(value: float, direction: str) -> float:
    """Lower is better: a maximised objective is compared by its negative."""
    return value if direction == "min" else -value


def sensitivity(trials: Sequence[dict[str, Any]]) -> list[Point]:
    """Per learning rate (increasing): every seed's value and their mean."""
    by_lr: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        by_lr[t["lr"]].append(t)
    points = []
    for lr in sorted(by_lr):
        chosen = sorted(by_lr[lr], key=lambda t: t["seed"])
        values = [t["objective"] for t in chosen]
        points.append({"lr": lr, "values": values, "mean": mean_std(values)[0], "seeds": [t["seed"] for t in chosen]})
    return points


def tuned(
    trials: Sequence[dict[str, Any]], seeds: Sequence[int], fresh: Sequence[int], direction: str, centre: float
) -> Tuned:
    """The learning rate the tuning ``seeds`` choose (``grid.tuned_position``, the lr standing for its
    position) and the values of the ``fresh`` seeds there."""
    tuning = [t for t in trials if t["seed"] in seeds]
    points = sensitivity(tuning)
    best = tuned_position({(t["lr"], t["seed"]): _signed(t["objective"], direction) for t in tuning}, seeds)
    at = sorted((t for t in trials if t["lr"] == best and t["seed"] in fresh), key=lambda t: t["seed"])
    values = [t["objective"] for t in at]
    mean, std = mean_std(values) if values else (math.nan, math.nan)
    lrs = [p["lr"] for p in points]
    found: Tuned = {
        "centre_lr": centre,
        "tuned_lr": best,
        "interior": best is not None and min(lrs) < best < max(lrs),
        "values": values,
        "mean": mean,
        "std": std,
        "interval": list(mean_interval(values)) if values else [math.nan, math.nan],
        "tuning_mean": next((p["mean"] for p in points if p["lr"] == best), math.nan),
        "sensitivity": points,
    }
    if len(values) > 1 and len(set(values)) == 1 and not seed_free(found):
        # fresh seeds that tie by chance (a coarse objective) while the seed matters elsewhere measured no spread:
        # Student's interval of zero width would call the mean exact
        found["interval"] = [math.nan, math.nan]
    return found


def seed_free(t: Tuned) -> bool:
    """Whether the seed changed nothing measured for this optimizer: its fresh seeds, its tuning seeds at every
    lr and the two at the tuned lr each gave one value. (Fresh seeds alone that tie prove little: an objective
    read at evaluations, such as steps to a target, ties seeds that differ.)"""
    fresh = set(t["values"])
    points = t.get("sensitivity", [])
    at = [set(p["values"]) for p in points if p["lr"] == t.get("tuned_lr")]
    return len(fresh) == 1 and all(len(set(p["values"])) == 1 for p in points) and all(s == fresh for s in at)


def pair(optimizers: dict[str, Tuned], better: str, worse: str) -> dict[str, Any]:
    """``better`` against ``worse`` at their tuned lrs: the difference of means, its Welch 95 %
    interval, and whether that interval excludes zero (a difference beyond the seed noise)."""
    values = optimizers[better]["values"], optimizers[worse]["values"]
    low, high = difference_interval(*values)
    difference = optimizers[better]["mean"] - optimizers[worse]["mean"]
    failed = {name: sum(not math.isfinite(v) for v in optimizers[name]["values"]) for name in (better, worse)}
    if any(failed.values()):  # a fresh seed diverged, crashed or missed the target: no mean to compare
        differ = False
        said = [f"{n} of {len(optimizers[name]['values'])} fresh seeds of {name}" for name, n in failed.items() if n]
        verdict = f"{better} vs {worse}: {'; '.join(said)} diverged, crashed or missed the target — no interval"
    elif min(len(v) for v in values) < 2:  # one seed measures no seed noise: claim nothing
        differ = False
        verdict = f"{better} vs {worse}: Δ = {difference:.3g} from one seed — the seed noise is not measured"
    elif all(seed_free(optimizers[name]) for name in (better, worse)):  # landscapes' surfaces
        differ = difference != 0
        verdict = (
            f"{better} vs {worse}: Δ = {difference:.3g} — every seed gave the same value, so the objective does "
            "not depend on the seed and the difference is exact"
        )
    elif all(len(set(v)) == 1 for v in values):  # a coarse objective (steps at the evaluations) may tie by chance
        differ, low, high = False, math.nan, math.nan  # Welch's interval of zero width would call Δ exact
        verdict = (
            f"{better} vs {worse}: Δ = {difference:.3g} — the fresh seeds of each gave one value, but the seed "
            "changes the value elsewhere in the sweep: the seed noise is not measured"
        )
    else:
        differ = not (low <= 0 <= high) if math.isfinite(low) else False
        verdict = f"{better} vs {worse}: Δ = {difference:.3g}, 95% CI [{low:.3g}, {high:.3g}] — " + (
            "beyond seed noise" if differ else "within seed noise"
        )
    return {
        "best": better,
        "second": worse,
        "difference": difference,
        "interval": [low, high],
        "differ": differ,
        "verdict": verdict,
    }


def compare(optimizers: dict[str, Tuned], direction: str) -> tuple[list[str], dict[str, Any] | None, list]:
    """The optimizers ranked by tuned mean; the best two compared; and each against the next one down."""
    ranked = sorted(  # one whose fresh seeds failed (a mean that is not finite) last
        (name for name, t in optimizers.items() if t["tuned_lr"] is not None),
        key=lambda name: (not math.isfinite(optimizers[name]["mean"]), _signed(optimizers[name]["mean"], direction)),
    )
    neighbours = [pair(optimizers, a, b) for a, b in zip(ranked, ranked[1:], strict=False)]
    return ranked, (neighbours[0] if neighbours else None), neighbours


def first_reaching(curve: dict[str, list] | None, target: float, direction: str) -> float:
    """The first step at which the curve is at least as good as ``target`` (+inf: never)."""
    if not curve:
        return math.inf
    for step, value in zip(curve["step"], curve["value"], strict=True):
        if value is not None and math.isfinite(value) and _signed(value, direction) <= _signed(target, direction):
            return float(step)
    return math.inf


def mean_curve(curves: Sequence[dict[str, list] | None]) -> dict[str, list] | None:
    """The seeds' curves averaged at the steps they all have (None if a seed has no curve)."""
    if not curves or any(not c for c in curves):
        return None
    common = sorted(set.intersection(*(set(c["step"]) for c in curves)))
    at = [dict(zip(c["step"], c["value"], strict=True)) for c in curves]
    values = [mean_std([a[step] if a[step] is not None else math.nan for a in at])[0] for step in common]
    return {"step": common, "value": values}


def steps_to_target(
    trials: Sequence[dict[str, Any]], optimizers: dict[str, Tuned], direction: str, fresh: Sequence[int]
) -> dict[str, Any] | None:
    """Steps each tuned optimizer needs to reach the target every tuned optimizer reaches: the worst of
    the tuned means. Read from the mean over the ``fresh`` seeds of the curves at the tuned lr (which ends
    at the tuned mean, so every tuned optimizer gets there), and from each seed's own curve (which may not)."""
    means = [t["mean"] for t in optimizers.values() if t["tuned_lr"] is not None and math.isfinite(t["mean"])]
    # a curve of one point (evaluated only at the end) cannot tell when a run got somewhere: nothing to say
    if not means or not any(len((t.get("curve") or {}).get("step", ())) >= 2 for t in trials):
        return None
    target = max(means) if direction == "min" else min(means)
    found: dict[str, Any] = {}
    for name, t in optimizers.items():
        if t["tuned_lr"] is None:
            continue
        at = sorted(
            (x for x in trials if x["optimizer"] == name and x["lr"] == t["tuned_lr"] and x["seed"] in fresh),
            key=lambda x: x["seed"],
        )
        found[name] = {
            "steps": first_reaching(mean_curve([x.get("curve") for x in at]), target, direction),
            "seed_steps": [first_reaching(x.get("curve"), target, direction) for x in at],
            "seeds": [x["seed"] for x in at],
        }
    reached = {name: f["steps"] for name, f in found.items() if math.isfinite(f["steps"])}
    slowest = max(reached, key=reached.get) if reached else None
    for name, f in found.items():
        f["fraction_of_slowest"] = f["steps"] / reached[slowest] if slowest and name in reached else None
    return {"target": target, "slowest": slowest, "optimizers": found}


def _ended(trial: dict[str, Any]) -> str:
    if trial["status"] != "ok":
        return trial["status"]
    return "finished" if math.isfinite(trial["objective"]) else "missed the target"


def what_trials_did(results: dict[str, Any], optimizer: str) -> str:
    """How ``optimizer``'s trials ended, in words: for an optimizer without a tuned η.

    Each trial counts as ``diverged`` or ``crashed`` (its status), ``missed the target`` (it ran, and its value is
    ±∞) or ``finished`` (it has a value, yet no η has a value for every tuning seed).

    Args:
        results: a sweep's results (``Results``, or a dict with its ``trials``).
        optimizer: the optimizer's name as the sweep gave it.

    Returns:
        One phrase, e.g. ``"of its 3 trials 2 diverged, 1 missed the target"`` (the kinds in alphabetical order).

    Examples:
        >>> import math
        >>> from optiscope.sweep import what_trials_did
        >>> trials = [
        ...     {"optimizer": "sgd", "status": "diverged", "objective": math.inf},
        ...     {"optimizer": "sgd", "status": "diverged", "objective": math.inf},
        ...     {"optimizer": "sgd", "status": "ok", "objective": math.inf},
        ... ]
        >>> what_trials_did({"trials": trials}, "sgd")
        'of its 3 trials 2 diverged, 1 missed the target'
    """
    trials = [t for t in results["trials"] if t["optimizer"] == optimizer]
    ended = Counter(_ended(t) for t in trials)
    said = ", ".join(f"{count} {what}" for what, count in sorted(ended.items()))
    return f"of its {len(trials)} trial{'s' if len(trials) != 1 else ''} {said}"


def summarise(
    name: str,
    records: Sequence[dict[str, Any]],
    optimizers: Sequence[str],
    centres: dict[str, float],
    seeds: Sequence[int],
    fresh: Sequence[int],
    objective: dict[str, Any],
    factor: float | None,
) -> Results:
    direction = objective["direction"]
    order = {opt: i for i, opt in enumerate(optimizers)}
    records = sorted(records, key=lambda r: (order[r["optimizer"]], r["lr"], r["seed"]))
    per = {
        opt: tuned([r for r in records if r["optimizer"] == opt], seeds, fresh, direction, centres[opt])
        for opt in optimizers
    }
    ranking, comparison, neighbours = compare(per, direction)
    # "ok" while any trial has a value (a finite objective: one that finished but missed its target has none);
    # otherwise "diverged" only when every trial did, else "failed"
    valued = any(math.isfinite(r["objective"]) for r in records)
    status = "ok" if valued else "diverged" if all(r["status"] == "diverged" for r in records) else "failed"
    return {
        "experiment": "sweep",
        "swept": name,
        "status": status,
        "objective": objective,
        "factor": factor,
        "seeds": list(seeds),
        "fresh_seeds": list(fresh),
        "optimizers": per,
        "ranking": ranking,
        "comparison": comparison,
        "neighbours": neighbours,
        "steps_to_target": steps_to_target(records, per, direction, fresh),
        "trials": records,
    }
