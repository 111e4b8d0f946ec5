"""The local process pool and Ray run the same trials into the same files: the results equal those of
one in-process worker (wall times aside)."""

import dataclasses
import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from optiscope import runs
from optiscope.errors import ConfigError
from optiscope.sweep import SweepConfig, run_sweep, trial

from .synthetic import without_wall_times

TESTS = str(Path(__file__).resolve().parents[1])


def small(options=None, **kwargs):
    options = {"sgd_optimum": 0.02, "diverge_above": 0.05} if options is None else options
    return SweepConfig(
        experiment="synthetic", optimizers=("sgd",), seeds=2, lrs=(0.01, 0.03, 0.1), options=options, **kwargs
    )


def test_pool_and_ray_give_the_results_of_one_worker(synthetic, tmp_path, monkeypatch, one_ray_at_a_time):
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


def test_a_refusal_on_ray_leaves_the_directory_to_the_corrected_command(
    synthetic, tmp_path, monkeypatch, one_ray_at_a_time
):
    """A trial refused (bad input that every trial meets) stops the sweep. On Ray the trial running beside it was
    killed half-way, its folder left holding its config.json, so the sweep's stayed too and the corrected command
    was refused without --force; the local pool waits for it. Now every backend waits: nothing is left."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    (tmp_path / "hold").mkdir()
    # sgd@0.01 refuses as soon as sgd@0.1 has started, which refuses 3 s later (synthetic.meet)
    options = {"text": "nofile.txt", "hold": str(tmp_path / "hold"), "slow_above": 0.05}
    refused = SweepConfig("synthetic", ("sgd",), seeds=1, lrs=(0.01, 0.1), options=options, backend="ray", workers=2)
    out = tmp_path / "s"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ConfigError, match="corpus file nofile.txt does not exist"):
            run_sweep(refused, out)
        assert [p.name for p in out.rglob("*") if p.is_file() and p.name != runs.LOCK] == []
        corrected = dataclasses.replace(refused, options={})
        assert run_sweep(corrected, out)["optimizers"]["sgd"]["tuned_lr"] == 0.01
    finally:
        ray.shutdown()


def test_a_trial_whose_ray_worker_died_is_its_crash(synthetic, tmp_path, monkeypatch, one_ray_at_a_time):
    """A Ray worker killed while running a trial (for its memory, or its node lost) is that trial's crash, as a
    MemoryError raised in it is: the sweep records it and goes on to the results of one in which the trial raised
    (errors aside). It had stopped the sweep with Ray's WorkerCrashedError."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    options = {"sgd_optimum": 0.01}
    raised = run_sweep(small(options={**options, "crash_at": 0.1}), tmp_path / "raised")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        died = run_sweep(small(options={**options, "die_at": 0.1}, backend="ray", workers=2), tmp_path / "died")
    finally:
        ray.shutdown()
    (record,) = [t for t in died["trials"] if t["status"] == "crashed"]
    assert record["lr"] == 0.1 and record["error"].startswith("WorkerCrashedError: The worker died")
    assert (tmp_path / "died" / record["dir"] / "error.log").is_file()
    assert died["optimizers"] == raised["optimizers"] and died["ranking"] == raised["ranking"]
    assert [(t["lr"], t["seed"], t["status"]) for t in died["trials"]] == [
        (t["lr"], t["seed"], t["status"]) for t in raised["trials"]
    ]


def test_a_trial_whose_pool_worker_died_is_its_crash_and_the_trials_beside_it_finish(synthetic, tmp_path):
    """A local pool worker that dies (killed by the kernel for its memory; here the trial exits its process)
    breaks the whole pool: the sweep stopped with BrokenProcessPool. Now the trials it left unfinished run again
    alone, the one that kills its worker again is recorded as crashed, and the sweep ends with the results of one
    in which that trial raised (errors aside), its later round on a fresh pool."""
    options = {"sgd_optimum": 0.01}
    raised = run_sweep(small(options={**options, "crash_at": 0.1}), tmp_path / "raised")
    died = run_sweep(small(options={**options, "die_at": 0.1}, workers=2), tmp_path / "died")
    (record,) = [t for t in died["trials"] if t["status"] == "crashed"]
    assert record["lr"] == 0.1 and record["error"].startswith("BrokenProcessPool: "), record["error"]
    assert (tmp_path / "died" / record["dir"] / "error.log").is_file()
    assert died["optimizers"] == raised["optimizers"] and died["ranking"] == raised["ranking"]
    assert [(t["lr"], t["seed"], t["status"]) for t in died["trials"]] == [
        (t["lr"], t["seed"], t["status"]) for t in raised["trials"]
    ]


def test_a_broken_pool_stops_the_trials_beside_the_dead_one_and_starts_none(synthetic, tmp_path):
    """A worker that dies breaks the pool, which fails every call it had not finished: the trial running beside
    it is stopped after a step (to run again alone, from its checkpoint) instead of finishing for nothing, and
    the trial the pool had queued does not start in the broken pool (it ran to its end there, with nobody to
    read its record). The markers the trials leave when they start are the oracle: each process that ran it."""
    started, hold = tmp_path / "started", tmp_path / "hold"
    started.mkdir()
    hold.touch()  # the survivor at 0.01 sleeps until the test removes it
    options = {"sgd_optimum": 0.01, "die_at": 0.1, "started": str(started), "sleep_while": str(hold)}
    config = dataclasses.replace(small(options, workers=2), lrs=(0.01, 0.1, 1.0), seeds=1)
    done = []
    sweep = threading.Thread(target=lambda: done.append(run_sweep(config, tmp_path / "s")))
    sweep.start()
    try:
        survivor = started / "sgd@0.01-seed-0"
        deadline = time.monotonic() + 120
        # the survivor stopped and started again alone (a second process id): the broken pool is behind
        while not (survivor.exists() and len(survivor.read_text().split()) == 2):
            assert time.monotonic() < deadline and sweep.is_alive(), "the survivor never ran again alone"
            time.sleep(0.05)
        assert not (started / "sgd@1-seed-0").exists()  # the queued trial did not start in the broken pool
    finally:
        hold.unlink()
        sweep.join(timeout=120)
    tuning = [(t["lr"], t["status"]) for t in done[0]["trials"] if t["seed"] == 0]
    assert sorted(tuning) == [(0.01, "ok"), (0.1, "crashed"), (1.0, "ok")]
    assert len((started / "sgd@1-seed-0").read_text().split()) == 1  # it ran once, alone


def test_a_trial_waits_for_its_folder_held_by_a_stopping_process(synthetic, tmp_path):
    """A worker of a sweep killed outright still holds its trial's folder while it stops: the resumed sweep's trial
    waits for it instead of being recorded as crashed ('in use'). The holder here is an flock on the folder's lock
    file, taken by the test and given back after three times the grace a run waits for a lock."""
    out = tmp_path / "s"
    folder = trial.trial_dir(out, "sgd", 0.01, 0)
    folder.mkdir(parents=True)
    fd = os.open(folder / runs.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(3 * runs.LOCK_GRACE_SECONDS, os.close, (fd,)).start()  # closing the descriptor lets go
    results = run_sweep(dataclasses.replace(small({"sgd_optimum": 0.01}), lrs=(0.01,)), out)
    assert {t["status"] for t in results["trials"]} == {"ok"}
    assert not (folder / runs.ERROR_LOG).exists()
