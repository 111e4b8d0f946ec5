"""The sweep's figures draw any sweep: diverged and crashed trials, one optimizer, every trial failed."""

import pytest

from optiscope import experiments, figures
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
    if "diverge_above" in options and options["diverge_above"] < 1e-3:
        assert results["status"] == "diverged" and results["comparison"] is None
