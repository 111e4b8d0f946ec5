"""Figures draw any valid result: the results.json of a real (tiny) run of every experiment, perturbed the
ways a finished run can come out — a run diverged at any step, measured values that are NaN, infinite, zero
or negative (on log axes too), a single run, a single step — and drawn by ``optiscope plot``: every
figure must be drawn (a panel with nothing to show says so), none may fail.

Only *measured* numbers are perturbed (the paths below); inputs such as learning rates or token
frequencies stay valid, as they are in any real results file."""

import copy
import math

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from figure_checks import overlaps
from optiscope import cli, contracts, experiments, figures, runs
from optiscope.figures import style

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e300, 1e-300]

MEASURED = {
    "lm": [
        "runs.*.train.loss.*",
        "runs.*.eval.val_loss.*",
        "runs.*.eval.train_loss.*",
        "runs.*.eval.perplexity.*",
        "runs.*.eval.seconds.*",
        "runs.*.update_ratio.layers.*.*",
        "runs.*.embedding_rows.update.*",
        "runs.*.embedding_rows.spearman",
        "runs.*.final.*",
    ],
    "rare-tokens": [
        "optimizers.*.final_weight.*",
        "optimizers.*.final_error.*",
        "optimizers.*.tail_rms_error.*",
        "optimizers.*.tail_std.*",
        "optimizers.*.effective_lr.*",
        "optimizers.*.effective_lr_fit.*",
        "optimizers.*.trajectory.weights.*.*",
        "lr_sweep.sgd.*.tail_rms_error.*",
        "lr_sweep.adam.*.tail_rms_error.*",
        "lr_sweep.sgd.*.tail_std.*",
        "lr_sweep.adam.*.tail_std.*",
        "lr_sweep.findings.rescue_jitter_ratio",
        "lr_sweep.findings.rescue_common_tail_std",
        "occurrences.*",
    ],
    "landscapes": [
        "surfaces.*.runs.*.final_gap",
        "surfaces.*.runs.*.grid.*.final_gap",
        "surfaces.*.runs.*.gap_curve.values.*",
        "surfaces.*.runs.*.path.*.*",
        "surfaces.*.contours.gap.*.*",
        "bias_correction.runs.*.x.*",
        "bias_correction.runs.*.first_step",
        "bias_correction.runs.*.largest_step",
        "bias_correction.runs.*.overshoot",
        "bias_correction.predicted_uncorrected_step_ratio.*",
        "weight_decay.runs.*.final_weights.*",
        "weight_decay.runs.*.stats.*",
        "weight_decay.runs.*.effective_decay.*",
        "weight_decay.runs.*.effective_decay_median.*",
        "weight_decay.runs.*.rms_distance_to_l2_optimum",
    ],
    "entropy": [
        "optimizers.*.runs.*.curve.true.*",
        "optimizers.*.runs.*.curve.linear.*",
        "optimizers.*.runs.*.curve.quadratic.*",
        "optimizers.*.runs.*.true.entries.*.delta_h_true",
        "optimizers.*.runs.*.subsets.errors.*",
        "optimizers.*.runs.*.subsets.mean",
        "optimizers.*.runs.*.loss_probe.true.*.delta",
        "optimizers.*.fits.*.*",
        "optimizers.*.aggregate.true_mean.*",
        "optimizers.*.aggregate.true_std.*",
        "optimizers.*.real_step.*",
    ],
    "adder": [
        "runs.*.train.loss.*",
        "runs.*.cpu_minutes",
        "explain.token_vectors.*.*",
        "explain.positions.*.*",
        "explain.norm_gains.*.*",
        "explain.example.attention.*.*.*",
        "explain.weights.*.*",
        "explain.weights.*.*.*",
    ],
    "edge-of-stability": [
        "runs.*.sharpness.*",
        "runs.*.ratio.*",
        "runs.*.loss.*",
        "runs.*.threshold",
        "runs.*.equilibrium",
        "runs.*.max_ratio",
    ],
    "mlp": ["runs.*.train.loss.*", "runs.*.eval.val_loss.*", "runs.*.eval.accuracy.*", "runs.*.final.*"],
}


def places(tree, pattern):
    """(container, key) of every float leaf that ``pattern`` ('a.*.b') matches; * is any key or index."""
    found = []

    def walk(node, parts):
        if not parts:
            return
        head, rest = parts[0], parts[1:]
        keys = (range(len(node)) if isinstance(node, list) else list(node)) if head == "*" else [head]
        for key in keys:
            if isinstance(node, list) and not (isinstance(key, int) and key < len(node)):
                continue
            if isinstance(node, dict) and key not in node:
                continue
            if rest:
                if isinstance(node[key], dict | list):
                    walk(node[key], rest)
            elif isinstance(node[key], float):  # measurements; ints are counts, steps and indices
                found.append((node, key))

    walk(tree, pattern.split("."))
    return found


# --------------------------------------------------------------------------------- structural changes
def single_run(name, r):
    if name in ("lm", "entropy"):
        key = "runs" if name == "lm" else "optimizers"
        first = next(iter(r[key]))
        r[key] = {first: r[key][first]}
    elif name == "rare-tokens":
        r["optimizers"] = {label: r["optimizers"][label] for label in set(r["pair"].values())}
    elif name == "landscapes":
        for surface in r["surfaces"].values():
            first = next(iter(surface["runs"]))
            surface["runs"] = {first: surface["runs"][first]}
            surface["fastest"] = [k for k in surface["fastest"] if k == first]
    elif name == "adder":
        best = r["best"]
        r["runs"] = [x for x in r["runs"] if (x["label"], x["seed"]) == (best["label"], best["seed"])]
        r["success"] = {best["label"]: {"perfect": 0, "tried": 1, "rate": 0.0}}
    elif name == "edge-of-stability":
        r["runs"] = r["runs"][:1]
    elif name == "mlp":
        r["runs"] = dict(list(r["runs"].items())[:1])


def single_step(name, r):
    if name == "lm":
        for run in r["runs"].values():
            for series in ("train", "eval"):
                run[series] = {k: v[:1] for k, v in run[series].items()}
            run["samples"] = run["samples"][:1]
            ratios = run["update_ratio"]
            ratios["step"] = ratios["step"][:1]
            ratios["layers"] = {k: v[:1] for k, v in ratios["layers"].items()}
    elif name == "rare-tokens":
        for run in r["optimizers"].values():
            run["trajectory"] = {
                "steps": run["trajectory"]["steps"][:1],
                "weights": [w[:1] for w in run["trajectory"]["weights"]],
            }
    elif name == "landscapes":
        for surface in r["surfaces"].values():
            for run in surface["runs"].values():
                if run["gap_curve"] is not None:
                    run["gap_curve"] = {k: v[:1] for k, v in run["gap_curve"].items()}
                    run["path"] = run["path"][:1]
    elif name == "adder":
        for run in r["runs"]:
            run["train"] = {k: v[:1] for k, v in run["train"].items()}
            run["evals"] = run["evals"][:1]
    elif name == "edge-of-stability":
        for run in r["runs"]:
            for key in ("step", "sharpness", "ratio", "loss", "hvps"):
                run[key] = run[key][:1]
    elif name == "mlp":
        for run in r["runs"].values():
            for series in ("train", "eval"):
                run[series] = {k: v[:1] for k, v in run[series].items()}


def diverge(name, r, step, which):
    divergence = {"step": step, "loss": math.nan, "reason": "loss is nan", "exploded_first": []}
    if name == "lm":
        label = list(r["runs"])[which % len(r["runs"])]
        run = r["runs"][label]
        run.update(status="diverged", divergence=divergence)
        keep = [i for i, s in enumerate(run["train"]["step"]) if s <= step]
        run["train"] = {k: [v[i] for i in keep] for k, v in run["train"].items()}
        keep = [i for i, s in enumerate(run["eval"]["step"]) if s <= step]
        run["eval"] = {k: [v[i] for i in keep] for k, v in run["eval"].items()}
        run["samples"] = [s for s in run["samples"] if s["step"] <= step]
    elif name == "rare-tokens":
        label = list(r["optimizers"])[which % len(r["optimizers"])]
        run = r["optimizers"][label]
        run.update(diverged_at=step, final_weight=None, final_error=None, tail_rms_error=None, effective_lr=None)
        run["effective_lr_fit"] = None
        steps = run["trajectory"]["steps"]
        run["trajectory"]["weights"] = [
            [w if s <= step else math.nan for s, w in zip(steps, ws, strict=True)]
            for ws in run["trajectory"]["weights"]
        ]
    elif name == "landscapes":
        surface = list(r["surfaces"].values())[which % len(r["surfaces"])]
        label = list(surface["runs"])[which % len(surface["runs"])]
        run = surface["runs"][label]
        run.update(best_lr=None, reached_at=None, final_gap=None, end=None, path=None, gap_curve=None)
        for entry in run["grid"]:
            entry.update(reached_at=None, diverged_at=step, final_gap=math.inf)
        surface["fastest"] = [k for k in surface["fastest"] if k != label]
    elif name == "adder":
        run = r["runs"][which % len(r["runs"])]
        run.update(status="diverged", divergence=divergence)
        keep = [i for i, s in enumerate(run["train"]["step"]) if s <= step]
        run["train"] = {k: [v[i] for i in keep] for k, v in run["train"].items()}
        run["evals"] = [e for e in run["evals"] if e["step"] <= step]
    elif name == "edge-of-stability":
        run = r["runs"][which % len(r["runs"])]
        run.update(status="diverged", divergence=divergence)
        keep = [i for i, s in enumerate(run["step"]) if s <= step]
        for key in ("step", "sharpness", "ratio", "loss", "hvps"):
            run[key] = [run[key][i] for i in keep]
    elif name == "mlp":
        run = r["runs"][list(r["runs"])[which % len(r["runs"])]]
        run.update(status="diverged", divergence=divergence)
        for series in ("train", "eval"):
            keep = [i for i, s in enumerate(run[series]["step"]) if s <= step]
            run[series] = {k: [v[i] for i in keep] for k, v in run[series].items()}


@pytest.fixture(autouse=True)
def small_figures(monkeypatch):
    monkeypatch.setattr(style, "DPI", 20)  # the layout is what can fail; pixels only cost time


@pytest.mark.parametrize("name", list(MEASURED))
@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example draws every figure of a run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_figure_draws_a_perturbed_result(name, tiny_results, tmp_path_factory, data):
    results = copy.deepcopy(tiny_results[name])
    if name != "entropy" and data.draw(st.booleans(), label="single run"):
        single_run(name, results)
    if name != "entropy" and data.draw(st.booleans(), label="single step"):
        single_step(name, results)
    if name != "entropy" and data.draw(st.booleans(), label="diverged"):
        diverge(name, results, data.draw(st.integers(0, 25), label="at step"), data.draw(st.integers(0, 5)))
    for pattern in data.draw(st.lists(st.sampled_from(MEASURED[name]), max_size=4, unique=True), label="measured"):
        leaves = places(results, pattern)
        if not leaves:
            continue
        value = data.draw(st.sampled_from(SPECIAL), label=pattern)
        if data.draw(st.booleans(), label="every leaf"):
            chosen = leaves
        else:
            chosen = [leaves[data.draw(st.integers(0, len(leaves) - 1))]]
        for container, key in chosen:
            container[key] = value
    assert not contracts.problems(results, experiments.load(name).Results)
    out = tmp_path_factory.mktemp(name)
    runs.atomic_write_json(out / runs.RESULTS, results)
    assert cli.main(["plot", str(out)]) == 0, (out / runs.ERROR_LOG).read_text()
    assert len(list((out / runs.FIGURES).glob("*.png"))) == len(figures.module_for(results).FIGURES)


# ------------------------------------------------------------------------------ layout on every figure
def every_measured(name, r, value):
    for pattern in MEASURED[name]:
        for container, key in places(r, pattern):
            container[key] = value


CASES = {
    "real": lambda name, r: None,
    "diverged": lambda name, r: diverge(name, r, 5, 0) if name != "entropy" else None,
    "single step": lambda name, r: single_step(name, r) if name != "entropy" else None,
    "every measured number NaN": lambda name, r: every_measured(name, r, math.nan),
    "every measured number 0": lambda name, r: every_measured(name, r, 0.0),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(MEASURED))
def test_no_text_of_any_figure_overlaps_another_or_leaves_its_panel(name, case, tiny_results):
    """Every figure of every experiment, from a real tiny run and from degenerate versions of it, lays out its
    titles, labels, tick labels, legends and notes without one covering another or being cut by its panel. The
    oracle: matplotlib's renderer extents of each text (``figure_checks.overlaps``)."""
    results = copy.deepcopy(tiny_results[name])
    CASES[case](name, results)
    assert not contracts.problems(results, experiments.load(name).Results)
    style.apply()
    for file, draw in figures.module_for(results).FIGURES.items():
        fig = draw(results)
        style.finish(fig)
        found = overlaps(fig)
        style.close_all()
        assert not found, f"{file}: {found}"


@pytest.mark.parametrize("value", [math.nan, 0.0])
@pytest.mark.parametrize("name", list(MEASURED))
def test_results_whose_every_number_is_nan_or_zero_are_refused_or_drawn(name, value, tiny_results, tmp_path):
    """A results.json whose every float is NaN (or 0): where a number the experiment was given (a learning rate, a
    frequency) is among them, ``optiscope plot`` refuses the file (exit 2) naming that field; otherwise it draws
    every figure (exit 0)."""

    def every_float(node):
        if isinstance(node, dict):
            return {k: every_float(v) for k, v in node.items()}
        if isinstance(node, list):
            return [every_float(v) for v in node]
        return value if isinstance(node, float) else node

    results = every_float(tiny_results[name])
    found = contracts.problems(results, experiments.load(name).Results)
    runs.atomic_write_json(tmp_path / runs.RESULTS, results)
    code = cli.main(["plot", str(tmp_path)])
    if found:
        assert code == 2 and all("not a finite number > 0" in p for p in found), found
    else:
        assert code == 0, (tmp_path / runs.ERROR_LOG).read_text()
