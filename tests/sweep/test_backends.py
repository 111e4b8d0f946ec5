"""The local process pool and Ray run the same trials into the same files: the results equal those of
one in-process worker (wall times aside)."""

import os
from pathlib import Path

import pytest

from optiscope import runs
from optiscope.sweep import SweepConfig, run_sweep, trial

from .synthetic import without_wall_times

TESTS = str(Path(__file__).resolve().parents[1])


def small(**kwargs):
    options = {"sgd_optimum": 0.02, "diverge_above": 0.05}
    return SweepConfig(
        experiment="synthetic", optimizers=("sgd",), seeds=2, lrs=(0.01, 0.03, 0.1), options=options, **kwargs
    )


def test_pool_and_ray_give_the_results_of_one_worker(synthetic, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    one = run_sweep(small(), tmp_path / "one")
    pool = run_sweep(small(workers=2), tmp_path / "pool")
    assert without_wall_times(pool) == without_wall_times(one)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_sweep(small(backend="ray", workers=2), tmp_path / "ray")
    finally:
        ray.shutdown()
    assert without_wall_times(on_ray) == without_wall_times(one)
    assert runs.read_json(tmp_path / "ray" / "results.json")["optimizers"]["sgd"]["tuned_lr"] == 0.03
    assert sorted(p.name for p in (tmp_path / "ray" / "trials").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "trials").iterdir()
    )
    # torch's results depend on its thread count: every trial, wherever it ran, ran on the same one
    seen = {runs.read_json(p)["torch_threads"] for p in tmp_path.glob("*/trials/*/*/results.json")}
    assert seen == {trial.TRIAL_THREADS} and len(list(tmp_path.glob("*/trials/*/*/results.json"))) >= 9
