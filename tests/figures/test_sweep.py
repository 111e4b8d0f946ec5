"""The sweep's figures draw any sweep: diverged and crashed trials, one optimizer, every trial failed; and lay out
their text without overlaps (``figure_checks.overlaps``)."""

import pytest

from figure_checks import overlaps
from optiscope import experiments, figures
from optiscope.figures import style
from optiscope.figures import sweep as sweep_figures
from optiscope.sweep import SweepConfig, run_sweep


@pytest.fixture
def synthetic(monkeypatch):
    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")


@pytest.mark.parametrize(
    "optimizers, options",
    [
        (("sgd", "adam"), {"adam_optimum": 0.1, "diverge_above": 0.05, "crash_at": 0.00316}),
        (("sgd",), {}),
        (("sgd", "adam"), {"diverge_above": 1e-9}),  # every trial diverged: nothing tuned
    ],
)
def test_every_sweep_figure_is_drawn(synthetic, tmp_path, optimizers, options):
    results = run_sweep(SweepConfig("synthetic", optimizers, seeds=2, options=options), tmp_path / "s")
    drawn = figures.draw(results, tmp_path / "figures")
    assert not drawn.failures and len(drawn.paths) == 3
    for name, draw in sweep_figures.FIGURES.items():  # no text covers another or is cut by its panel
        fig = draw(results)
        style.finish(fig)
        found = overlaps(fig)
        style.close_all()
        assert not found, f"{name}: {found}"
    if "diverge_above" in options and options["diverge_above"] < 1e-3:
        assert results["status"] == "diverged" and results["comparison"] is None


def test_steps_to_target_says_how_many_seeds_never_reached_it(synthetic, tmp_path):
    """The target is the worst tuned mean: of that optimizer's two seeds (objective η-term + seed/1000), seed 1
    ends above its mean and never reaches it; its point cannot be drawn, so the figure says so."""
    options = {"sgd_optimum": 0.01, "adam_optimum": 0.013}
    results = run_sweep(SweepConfig("synthetic", ("sgd", "adam"), seeds=2, options=options), tmp_path / "s")
    worst = max(results["optimizers"], key=lambda name: results["optimizers"][name]["mean"])
    found = results["steps_to_target"]["optimizers"]
    assert found[worst]["seed_steps"][1] == float("inf")
    fig = figures.sweep.steps_to_target(results)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["1 of 2\nseeds never\nreached it"]
    assert "≤" in fig.axes[0].get_title()


def test_a_sweep_written_before_fresh_seeds_is_still_read_and_drawn(synthetic, tmp_path):
    """Its results.json has no fresh_seeds nor tuning_mean (values were the tuning seeds'): the contract takes
    it, the figures draw it, the page says it."""
    from optiscope import cli, runs
    from optiscope.report.headlines import headlines

    out = tmp_path / "s"
    results = run_sweep(SweepConfig("synthetic", ("sgd", "adam"), seeds=2, options={"adam_optimum": 0.1}), out)
    del results["fresh_seeds"]
    for tuned in results["optimizers"].values():
        del tuned["tuning_mean"]
    runs.atomic_write_json(out / "results.json", results)
    read = cli.read_results(out)
    drawn = figures.draw(read, tmp_path / "figures")
    assert not drawn.failures and len(drawn.paths) == 3
    said = ["".join(p if isinstance(p, str) else str(p.value) for p in s) for s in headlines(read)]
    assert any(" over its seeds (" in s for s in said) and not any("fresh" in s for s in said)


def test_long_optimizer_names_are_laid_out_without_overlaps(synthetic, tmp_path):
    """Seven optimizers named as users name theirs (a recipe 'schedule-free-adamw', a class path): the tuned and
    steps-to-target figures label each one legibly, no name running into its neighbour's."""
    results = run_sweep(SweepConfig("synthetic", ("sgd", "adam"), seeds=2, options={}), tmp_path / "s")
    names = ["adamw", "muon+adamw", "soap", "schedule-free-adamw", "ademamix", "pytorch_optimizer.Prodigy", "adopt"]
    tuned, reached = results["optimizers"]["adam"], results["steps_to_target"]["optimizers"]["adam"]
    results["optimizers"] = {name: dict(tuned) for name in names}
    results["steps_to_target"]["optimizers"] = {name: dict(reached) for name in names}
    for name in ("sweep_tuned.png", "sweep_steps_to_target.png"):
        fig = sweep_figures.FIGURES[name](results)
        style.finish(fig)
        found = overlaps(fig)
        style.close_all()
        assert not found, f"{name}: {found}"
