"""The charts of one experiment's section: its run directories' results and metrics, overlaid.

Several directories of one experiment share each chart (a line is labelled ``dir: run``, a run that a
``Monitor`` wrote without a ``run`` label ``dir``); charts drawn from ``metrics.jsonl`` are the ones that grow
under ``--watch``. Each builder returns (title, chart) pairs, leaving out a chart with nothing to draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import charts, series
from .charts import Sources
from .rundir import RunDir

Charts = list[tuple[str, Any]]


def named(group: list[RunDir]) -> Iterator[tuple[str, str, RunDir]]:
    """(name, prefix, run dir): ``name`` is as much of each directory's path as tells them apart (``a/lm`` and
    ``b/lm``, not ``lm`` twice, whose lines would replace each other's), and what a run without a ``run`` label
    of its own in ``metrics.jsonl`` is called; with several directories every other run is labelled
    ``prefix + run``, the prefix being ``"name: "``."""
    names = distinct_names([run.path for run in group])
    for run, name in zip(group, names, strict=True):
        yield name, f"{name}: " if len(group) > 1 else "", run


def labelled(group: list[RunDir]) -> Iterator[tuple[Callable[[str], str], RunDir]]:
    """(label function, run dir): with several directories, each run is named ``dir: run``, ``dir`` being
    ``named``'s name of its directory."""
    for _, prefix, run in named(group):
        yield (lambda label, prefix=prefix: prefix + label), run


def distinct_names(paths: list[Path]) -> list[str]:
    """Each path's last components, as few as make every name differ from the others' (the whole path at
    most)."""
    parts = [Path(p).resolve().parts or (str(p),) for p in paths]
    depth = [1] * len(paths)
    while True:
        names = [str(Path(*ps[-d:])) for ps, d in zip(parts, depth, strict=True)]
        clashing = [i for i, name in enumerate(names) if names.count(name) > 1 and depth[i] < len(parts[i])]
        if not clashing:
            return names
        for i in clashing:
            depth[i] += 1


#: The title of a section's one loss chart (training and validation loss against step, and against time, as tabs)
#: and of the monitor's loss at each logged step, which becomes one more tab of it where the results give one.
LOSS, LOGGED_LOSS = "Loss", "Loss at each logged step"
#: The charts of one run (a title ``"<prefix>, <run>"``): the page folds them away under the run's name.
PER_RUN = ("u/w per parameter", "u/w per parameter over training", "Adam's effective learning rate", "u/w per layer")


def per_run(title: str) -> str | None:
    """The run a chart of one run is about (``PER_RUN``), None for a chart of the whole section."""
    return next((title[len(p) + 2 :] for p in PER_RUN if title.startswith(p + ", ")), None)


def section_charts(sources: Sources, experiment: str, group: list[RunDir], key: str) -> Charts:
    """One chart per question: the results' charts, then the monitor's, the monitor's loss at each logged step a
    tab of the results' loss chart, and a scalar given to ``Monitor.step`` left out where it is a line the results'
    loss chart draws already (lm's ``mean_loss`` is its training loss)."""
    out: Charts = []
    results_builder = RESULT_CHARTS.get(experiment)
    with_results = [(f, r) for f, r in labelled(group) if r.results is not None]
    if results_builder is not None and with_results:  # none yet (running, stopped early): the metrics' charts only
        out += results_builder(sources, with_results, key)
    drawn = dict(out)
    monitored = metrics_charts(sources, group, key, drawn=drawn.get(LOSS))
    logged = dict(monitored).get(LOGGED_LOSS)
    if drawn.get(LOSS) is not None and logged is not None:
        merged = charts.tabbed(f"{key}-losses", [("", drawn[LOSS]), ("each logged step (metrics.jsonl)", logged)])
        out = [(title, merged if title == LOSS else chart) for title, chart in out]
        monitored = [(title, chart) for title, chart in monitored if title != LOGGED_LOSS]
    return [(title, chart) for title, chart in out + monitored if chart is not None]


# --------------------------------------------------------------------------------------------- metrics
def metrics_charts(sources: Sources, group: list[RunDir], key: str, drawn: Any = None) -> Charts:
    """Charts every monitored run has: loss, gradient norm, curvature against its threshold when recorded, each
    scalar given to ``Monitor.step`` against step (one chart per scalar, every run a line, none for a scalar whose
    every line the chart ``drawn`` has already), and per run the u/w heatmap with per-parameter lines and Adam's
    effective-learning-rate bands."""

    def overlaid(field: str, positive: bool = False) -> dict[str, dict[str, list]]:
        out = {}
        for name, prefix, run in named(group):
            out.update(series.scalar(run.metrics, field, positive, unnamed=name, prefix=prefix))
        return out

    diverged, warned = set(), {}
    for name, prefix, run in named(group):
        diverged |= series.diverged(run.metrics, unnamed=name, prefix=prefix)
        warned.update(series.warnings(run.metrics, unnamed=name, prefix=prefix))
    # the gradient the optimizer used (clipped, where the loop clips) and, recorded beside it, the one before
    gradient = overlaid("grad_norm", True)
    gradient.update({f"{label} before clipping": pts for label, pts in overlaid("grad_norm_before_clip", True).items()})
    out: Charts = [
        (
            LOGGED_LOSS,
            charts.lines(
                sources,
                f"{key}-loss",
                "loss (metrics.jsonl)" + (", early warnings marked" if warned else ""),
                {**overlaid("loss"), **warned},
                "step",
                "loss",
                live=True,
                diverged=diverged,
                points=warned,
            ),
        ),
        (
            "Gradient norm",
            charts.lines(
                sources,
                f"{key}-grad",
                "global gradient norm (as the optimizer used it, after any clipping)",
                gradient,
                "step",
                "‖g‖",
                y_log=True,
                live=True,
            ),
        ),
    ]
    # log y: GD's 2/η and Adam's 38/η differ by orders of magnitude on one chart
    curvature = {f"{label} sharpness": pts for label, pts in overlaid("sharpness", True).items()}
    curvature.update({f"{label} threshold": pts for label, pts in overlaid("threshold", True).items()})
    out.append(
        (
            "Sharpness against its stability threshold",
            charts.lines(
                sources, f"{key}-sharp", "sharpness and threshold", curvature, "step", "λ", y_log=True, live=True
            ),
        )
    )
    out.append(
        (
            "Sharpness / threshold",
            charts.lines(
                sources,
                f"{key}-ratio",
                "sharpness / threshold",
                overlaid("sharpness/threshold"),
                "step",
                "ratio",
                live=True,
                diverged=diverged,
            ),
        )
    )
    # the scalars a loop gave monitor.step (train_acc=0.8, val_loss=…): a chart each, their scales need not agree
    given = dict.fromkeys(field for _, _, run in named(group) for field in series.given_scalar_names(run.metrics))
    for field in (f for f in given if not charts.draws(drawn, overlaid(f))):
        out.append(
            (
                f"{field} at each logged step",
                charts.lines(
                    sources,
                    f"{key}-given-{field}",
                    f"{field} (given to monitor.step)",
                    overlaid(field),
                    "step",
                    field,
                    live=True,
                    diverged=diverged,
                ),
            )
        )
    runs = [
        (i, j, directory, run, name, rows)
        for i, (directory, prefix, run) in enumerate(named(group))
        for j, (name, rows) in enumerate(series.by_run(run.metrics, unnamed=directory, prefix=prefix).items())
    ]
    # the section's heatmaps are compared with one another: one colour scale, one colour for one u/w in each
    grids = [series.ratio_heatmap(rows) for *_, rows in runs]
    scale = charts.shared_scale(grids) if len(runs) > 1 else None
    shared = f" (one colour scale for the section's {len(runs)} runs)" if len(runs) > 1 else ""
    for (i, j, directory, run, name, rows), grid in zip(runs, grids, strict=True):
        out.append(
            (
                f"u/w per parameter, {name}",
                charts.heatmap(
                    sources, f"{key}-heat-{i}-{j}", f"update/weight ratio, {name}{shared}", grid, scale=scale
                ),
            )
        )
        # lm's results already give them per layer
        if not has_layer_lines(run, series.run_label(rows[0], unnamed=directory)):
            out.append(
                (
                    f"u/w per parameter over training, {name}",
                    charts.many_lines(
                        sources,
                        f"{key}-uw-{i}-{j}",
                        f"u/w, {name}",
                        series.ratio_lines(rows),
                        "step",
                        "u/w",
                        y_log=True,
                    ),
                )
            )
        bands = series.effective_lr_bands(rows)
        out.append(
            (
                f"Adam's effective learning rate, {name}",
                charts.bands(
                    sources,
                    f"{key}-eff-{i}-{j}",
                    f"effective learning rate per parameter (min–max, median), {name}",
                    bands,
                ),
            )
        )
    return out


def has_layer_lines(run: RunDir, label: str) -> bool:
    """Whether the run's results.json has its u/w per layer (lm), drawn among the result charts."""
    entry = (run.results or {}).get("runs", {})
    return isinstance(entry, dict) and isinstance(entry.get(label, {}).get("update_ratio"), dict)


# --------------------------------------------------------------------------------------------- results
Labelled = list[tuple[Callable[[str], str], RunDir]]


def lm_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    train, timed, val, val_timed, rows = {}, {}, {}, {}, {}
    diverged = {f(name) for f, run in group for name, r in run.results["runs"].items() if r["status"] == "diverged"}
    # every run's layers in one order (an optimizer may list its parameter groups in another): a layer has one
    # colour in every run's per-layer chart
    every = [r["update_ratio"].get("layers", {}) for _, run in group for r in run.results["runs"].values()]
    layers = list(dict.fromkeys(layer for found in every for layer in found))
    for f, run in group:
        for name, r in run.results["runs"].items():
            train[f(name)] = series.thin(r["train"]["step"], r["train"]["loss"])
            timed[f(name)] = series.thin(r["train"]["seconds"], r["train"]["loss"])
            val[f(name)] = series.thin(r["eval"]["step"], r["eval"]["val_loss"])
            val_timed[f(name)] = series.thin(r["eval"].get("seconds", []), r["eval"]["val_loss"])
            rows[f(name)] = series.thin(r["embedding_rows"]["count"], r["embedding_rows"]["update"], positive=True)
    return [
        losses(sources, key, train, timed, diverged, val, val_timed),
        (
            "Rare-token rows",
            charts.lines(
                sources,
                f"{key}-rows",
                "embedding row movement per measured step against token count",
                rows,
                "token count",
                "mean update of its row",
                x_log=True,
                y_log=True,
                markers=True,
                line=False,
            ),
        ),
        *[
            (
                f"u/w per layer, {f(name)}",
                charts.many_lines(
                    sources,
                    f"{key}-layers-{i}-{j}",
                    f"u/w per layer, {f(name)}",
                    {layer: layer_points(r["update_ratio"], layer) for layer in layers},
                    "step",
                    "u/w",
                    y_log=True,
                    live=False,
                ),
            )
            for i, (f, run) in enumerate(group)
            for j, (name, r) in enumerate(run.results["runs"].items())
        ],
    ]


Points = dict[str, dict[str, list]]


def losses(
    sources: Sources,
    key: str,
    train: Points,
    timed: Points,
    diverged: set[str],
    val: Points | None = None,
    val_timed: Points | None = None,
) -> tuple[str, Any]:
    """The (title, chart) of the section's one loss chart: each run's training loss, and its validation loss
    (``run val``, marked) where there is one, against step and, on a second tab, against training time."""
    val, val_timed = val or {}, val_timed or {}
    both = bool(val)
    said = "training (faint; mean over each logging window) and validation (marked)" if both else "training"
    validated = {f"{label} val" for label in val}
    diverged = diverged | {f"{label} val" for label in val if label in diverged}

    def view(name: str, against: str, trained: Points, validation: Points) -> Any:
        lines = {**trained, **{f"{label} val": pts for label, pts in validation.items()}}
        return charts.lines(
            sources,
            f"{key}-{name}",
            f"{said} loss against {against}",
            lines,
            against,
            "loss",
            diverged=diverged,
            faint=set(trained) if both else (),
            marked=validated,
        )

    step, time = view("train", "step", train, val), view("time", "seconds", timed, val_timed)
    return LOSS, charts.tabbed(f"{key}-losses", [("against step", step), ("against training time", time)])


def layer_points(update_ratio: dict[str, Any], layer: str) -> dict[str, list]:
    """One layer's u/w against step (none where the run has no such layer)."""
    return series.thin(update_ratio["step"], update_ratio.get("layers", {}).get(layer, []), positive=True)


def rare_tokens_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    errors, rarest, eff, diverged = {}, {}, {}, set()
    for f, run in group:
        r = run.results
        for name, opt in r["optimizers"].items():
            if opt["diverged_at"] is not None:
                diverged.add(f(name))
            if opt["final_error"] is not None:
                errors[f(name)] = series.thin(r["frequencies"], opt["final_error"], positive=True)
            if opt["effective_lr"] is not None:
                eff[f(name)] = series.thin(r["frequencies"], opt["effective_lr"], positive=True)
            weights = opt["trajectory"].get("weights") or []
            if len(weights) > r["rarest"]:
                rarest[f(name)] = series.thin(opt["trajectory"]["steps"], weights[r["rarest"]])
    return [
        (
            "Final error against token frequency",
            charts.lines(
                sources,
                f"{key}-err",
                "|w − w*| at the end against token frequency",
                errors,
                "frequency",
                "final error",
                x_log=True,
                y_log=True,
                markers=True,
            ),
        ),
        (
            "The rarest token's weight",
            charts.lines(
                sources,
                f"{key}-rare",
                "the rarest token's weight during training",
                rarest,
                "step",
                "w",
                diverged=diverged,
            ),
        ),
        (
            "Effective learning rate against frequency",
            charts.lines(
                sources,
                f"{key}-eff",
                "Adam-family effective learning rate at the end",
                eff,
                "frequency",
                "η/(√v̂ + ε)",
                x_log=True,
                y_log=True,
                markers=True,
            ),
        ),
    ]


def landscapes_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    views = []
    surfaces = dict.fromkeys(s for _, run in group for s in run.results["surfaces"])
    for k, surface in enumerate(surfaces):
        gaps = {}
        for f, run in group:
            for name, r in run.results["surfaces"].get(surface, {}).get("runs", {}).items():
                if r.get("gap_curve"):
                    gaps[f(name)] = series.thin(r["gap_curve"]["steps"], r["gap_curve"]["values"], positive=True)
        chart = charts.lines(sources, f"{key}-gap-{k}", f"{surface}: f − f*", gaps, "step", "f − f*", y_log=True)
        views.append((surface, chart))
    return [("f − f* at each optimizer's best η (a tab per surface)", charts.tabbed(f"{key}-gap", views))]


def entropy_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    out: Charts = []
    optimizers = dict.fromkeys(o for _, run in group for o in run.results["optimizers"])
    for k, opt in enumerate(optimizers):
        signed, absolute = {}, {}
        for f, run in group:
            for i, r in enumerate(run.results["optimizers"].get(opt, {}).get("runs", [])):
                curve = r.get("curve", {})
                for kind in ("true", "linear", "quadratic"):
                    if kind in curve:
                        label = f(f"{opt} run {i} {kind}")
                        signed[label] = series.thin(curve["eta"], curve[kind])
                        absolute[label] = series.thin(
                            curve["eta"],
                            [abs(v) if isinstance(v, float | int) else v for v in curve[kind]],
                            positive=True,
                        )
        out.append(
            (
                f"ΔH true vs predicted, {opt}",
                charts.loglog_toggle(
                    sources, f"{key}-dh-{k}", f"entropy change against η, {opt}", signed, absolute, "η", "ΔH"
                ),
            )
        )
    return out


def adder_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    correct, loss, timed, wrong, carry, diverged = {}, {}, {}, {}, {}, set()
    for f, run in group:
        for r in run.results["runs"]:
            name = f(f"{r['label']} seed {r['seed']}")
            if r["status"] == "diverged":
                diverged.add(name)
            cases = run.results["cases"]
            correct[name] = series.thin([e["step"] for e in r["evals"]], [e["correct"] / cases for e in r["evals"]])
            loss[name] = series.thin(r["train"].get("step", []), r["train"].get("loss", []))
            timed[name] = series.thin(r["train"].get("seconds", []), r["train"].get("loss", []))
            by_position = r["report"].get("wrong_digits_by_position", [])
            wrong[name] = series.thin(list(range(len(by_position))), by_position)
            chains = r["report"].get("by_carry_chain", [])
            carry[name] = series.thin(
                [c["chain"] for c in chains], [c["correct"] / c["cases"] if c["cases"] else None for c in chains]
            )
    return [
        (
            "Suite accuracy during training",
            charts.lines(
                sources,
                f"{key}-acc",
                "share of the suite's cases correct at each evaluation",
                correct,
                "step",
                "accuracy",
                markers=True,
                y_range=charts.FRACTION,
            ),
        ),
        losses(sources, key, loss, timed, diverged),
        (
            "Wrong digits by answer position",
            charts.bars(
                sources,
                f"{key}-wrong",
                "wrong digits by answer position (best checkpoint)",
                wrong,
                "answer digit position",
                "wrong answers",
            ),
        ),
        (
            "Accuracy by carry-chain length",
            charts.lines(
                sources,
                f"{key}-carry",
                "exact accuracy by longest carry chain (best checkpoint)",
                carry,
                "carry-chain length",
                "accuracy",
                markers=True,
                y_range=charts.FRACTION,
            ),
        ),
    ]


def sweep_charts(sources: Sources, group: Labelled, key: str) -> Charts:
    """Per experiment swept and objective (sweeps of lm and of landscapes measure different things), the tuning
    curves and every trial against η."""
    by_objective: dict[tuple[str, str], Labelled] = {}
    for f, run in group:
        measured = (run.results.get("swept", "sweep"), run.results["objective"]["description"])
        by_objective.setdefault(measured, []).append((f, run))
    several = len(by_objective) > 1
    return [
        chart
        for i, ((swept, objective), runs) in enumerate(by_objective.items())
        for chart in sweep_charts_of_one_objective(
            sources, runs, f"{key}-{i}", objective, f"{swept} ({objective}): " if several else ""
        )
    ]


def sweep_charts_of_one_objective(sources: Sources, group: Labelled, key: str, objective: str, prefix: str) -> Charts:
    """The charts of sweeps that measured ``objective``, their titles after ``prefix``."""
    means, seeds = {}, {}
    failed = 0  # trials at ±inf (diverged, crashed, never got there): no point to draw, so counted in the title
    for f, run in group:
        failed += sum(1 for t in run.results["trials"] if not math.isfinite(t["objective"]))
        for name, tuned in run.results["optimizers"].items():
            points = tuned["sensitivity"]
            means[f(f"{name} mean")] = series.thin([p["lr"] for p in points], [p["mean"] for p in points])
            pairs = [(p["lr"], v) for p in points for v in p["values"]]
            fresh = "fresh_seeds" in run.results and tuned["tuned_lr"] is not None
            seeds[f(f"{name} tuning seeds" if fresh else f"{name} seeds")] = series.thin(
                [x for x, _ in pairs], [v for _, v in pairs]
            )
            if fresh:  # the seeds every reported number comes from, at the tuned η
                values = tuned["values"]
                seeds[f(f"{name} fresh seeds")] = series.thin([tuned["tuned_lr"]] * len(values), values)
    return [
        (
            f"{prefix}Objective against learning rate (tuning)",
            charts.lines(
                sources, f"{key}-lr", f"{objective} against η", means, "learning rate η", objective, x_log=True
            ),
        ),
        (
            f"{prefix}Every trial",
            charts.lines(
                sources,
                f"{key}-seeds",
                f"{objective}, every seed" + (f" ({failed} that failed, at ±∞, not drawn)" if failed else ""),
                seeds,
                "learning rate η",
                objective,
                x_log=True,
                markers=True,
                line=False,
            ),
        ),
    ]


RESULT_CHARTS: dict[str, Callable[[Sources, Labelled, str], Charts]] = {
    "lm": lm_charts,
    "sweep": sweep_charts,
    "rare-tokens": rare_tokens_charts,
    "landscapes": landscapes_charts,
    "entropy": entropy_charts,
    "adder": adder_charts,
}
