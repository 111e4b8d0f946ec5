"""The edge-of-stability experiment: full-batch GD's sharpness reaches 2/η (a measured invariant, checked
against our own exact-Hessian oracle's threshold formula), results follow the contract, figures redraw."""

import pytest
import torch

from figure_checks import assert_figures_drawn_and_replotted
from optiscope import cli, contracts, runs
from optiscope.experiments import ConfigError, build_config
from optiscope.experiments import edge_of_stability as eos
from optiscope.figures import edge_of_stability as figures

FIGURES = ["sharpness.png", "preconditioned.png"]


def check_run(out):
    results = runs.read_json(out / runs.RESULTS)
    assert not contracts.problems(results, eos.Results)
    return results


def test_gd_reaches_its_edge_and_hovers_there(tmp_path):
    out = tmp_path / "eos"
    options = ["--optimizers", "sgd@0.3,adam@0.01", "--steps", "300", "--measure-every", "25", "--quiet"]
    assert cli.main(["run", "edge-of-stability", "--out", str(out), *options]) == 0
    results = check_run(out)
    gd, adam = results["runs"]
    assert gd["threshold"] == pytest.approx(2 / 0.3) and gd["threshold_label"] == "2/η" and not gd["preconditioned"]
    assert adam["threshold"] == pytest.approx(38 / 0.01) and adam["preconditioned"]
    assert gd["step"] == list(range(25, 301, 25))
    assert max(gd["sharpness"]) >= 0.9 * 2 / 0.3  # progressive sharpening up to the edge
    assert gd["sharpness"][0] < 0.9 * 2 / 0.3  # ... from below it
    assert gd["edge_step"] is not None and 0.9 <= gd["equilibrium"] <= 1.3
    written = [r for r in runs.read_jsonl(out / runs.METRICS) if r.get("run") == "sgd@0.3" and "sharpness" in r]
    assert [r["sharpness"] for r in written] == gd["sharpness"]  # the monitor's records are the source
    assert_figures_drawn_and_replotted(out, FIGURES)


@pytest.mark.slow
def test_quick_run_reaches_the_edge(tmp_path):
    out = tmp_path / "quick"
    assert cli.main(["run", "edge-of-stability", "--out", str(out), "--quick", "--quiet"]) == 0
    results = check_run(out)
    reached = {r["optimizer"] for r in results["runs"] if r["edge_step"] is not None}
    assert {"sgd", "momentum", "adam"} <= reached  # each family sharpens to its own threshold
    momentum = next(r for r in results["runs"] if r["optimizer"] == "momentum")
    assert min(momentum["ratio"]) < 0.9 <= momentum["ratio"][-1] <= 1.3  # sharpens from below to its edge
    assert_figures_drawn_and_replotted(out, FIGURES)


def test_weight_decay_reaches_adamw_only(tmp_path):
    """--weight-decay λ: AdamW (decoupled) then moves its weights by −ηλθ more per step than Adam; at λ = 0 the
    two recipes are the same run, bit for bit."""
    tiny = dict(optimizers="adam@0.01,adamw@0.01", steps=10, measure_every=10, examples=16, width=8, quiet=True)
    for decay in (0.0, 0.5):
        results = eos.run(eos.Config(**tiny, weight_decay=decay), tmp_path / str(decay))
        adam, adamw = results["runs"]
        assert results["task"]["weight_decay"] == decay
        assert (adam["loss"] == adamw["loss"]) is (decay == 0.0)


def test_a_diverged_run_has_no_equilibrium_and_its_title_says_so(tmp_path):
    """momentum@5 leaves its (2 + 2β)/η at once and diverges: its ratio above the edge is no equilibrium, so
    results.json holds none and the figure's title names the divergence instead of a median."""
    tiny = dict(optimizers="momentum@5", steps=200, measure_every=10, examples=16, width=8, quiet=True)
    results = eos.run(eos.Config(**tiny), tmp_path)
    (run,) = results["runs"]
    assert run["status"] == "diverged" and run["max_ratio"] > 1  # it did pass its threshold
    assert run["equilibrium"] is None
    step = run["divergence"]["step"]
    assert f"momentum@5 (diverged at step {step})" in figures.sharpness(results).texts[0].get_text()
    # the other panel has no run: its title says so, rather than that no run reached the edge
    title = figures.preconditioned(results).texts[0].get_text()
    assert title == "Adam: preconditioned sharpness: no run of this kind in these results"


def test_teacher_data_is_deterministic_and_normalised():
    config = eos.Config(examples=64)
    (x1, y1), (x2, y2) = eos.teacher_data(config), eos.teacher_data(config)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert float(y1.std()) == pytest.approx(1.0)


def test_summarize_finds_the_edge_and_the_median_after_it():
    assert eos.summarize([10, 20, 30, 40], [0.5, 0.95, 1.1, 1.0], 0.9) == (20, 1.0, 1.1)
    # a start-up overshoot that falls back is not the edge: three in a row are (or all that are left)
    assert eos.summarize([10, 20, 30, 40, 50, 60], [0.96, 0.6, 0.95, 0.91, 0.98, 1.0], 0.9) == (30, 0.965, 1.0)
    assert eos.summarize([10, 20, 30], [0.5, 0.6, 0.95], 0.9) == (None, None, 0.95)  # not seen to hold
    assert eos.summarize([10, 20, 30, 40], [0.5, 0.91, 0.95, 0.6], 0.9) == (None, None, 0.95)
    assert eos.summarize([10, 20], [0.5, None], 0.9) == (None, None, 0.5)
    assert eos.summarize([], [], 0.9) == (None, None, None)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"optimizers": "lion"}, "lion"),  # no known threshold: not offered
        ({"measure_every": 0}, "measure-every"),
        ({"tol": 2.0}, "tol"),
        ({"edge": 0.0}, "edge"),
        ({"steps": 5, "measure_every": 20}, "--measure-every=20 exceeds --steps=5"),
        ({"examples": 1}, "--examples=1 must be an integer >= 2"),
        ({"examples": 0}, "--examples=0 must be an integer >= 2"),
        ({"weight_decay": -0.1}, "--weight-decay=-0.1 must be a finite number >= 0"),
        ({"weight_decay": float("inf")}, "--weight-decay=inf must be a finite number >= 0"),
    ],
)
def test_bad_options_are_refused(kwargs, named):
    with pytest.raises(ConfigError, match=named):
        eos.Config(**kwargs)


def test_a_run_shorter_than_the_guards_warm_up_is_still_judged(tmp_path):
    """adam@10 blows up within 20 steps (loss 2.0 → thousands): reported as diverged (exit 3), with no
    'equilibrium' read from its blown-up ratios, even though the default guard waits 20 steps."""
    from optiscope import cli, runs

    argv = ["run", "edge-of-stability", "--out", str(tmp_path / "r"), "--quiet", "--optimizers", "adam@10"]
    assert cli.main([*argv, "--steps", "20", "--measure-every", "10"]) == cli.EXIT_DIVERGED
    (run,) = runs.read_json(tmp_path / "r" / "results.json")["runs"]
    assert run["status"] == "diverged" and run["equilibrium"] is None


def test_a_measure_every_not_given_follows_steps():
    """A short run needs no --measure-every of its own: a 70th of --steps, from 1 to 20 (the default 2,500
    steps and --quick's 700 keep 20 and 10); one given is kept."""
    assert eos.Config().measure_every == 20 and eos.Config(steps=10_000).measure_every == 20
    assert build_config(eos, True, {}).measure_every == 10
    assert eos.Config(steps=140).measure_every == 2 and eos.Config(steps=10).measure_every == 1
    assert build_config(eos, True, {"steps": 5}).measure_every == 1
    assert eos.Config(steps=140, measure_every=7).measure_every == 7
