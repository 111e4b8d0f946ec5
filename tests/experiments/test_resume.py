"""Ctrl-C, SIGTERM or kill -9 in the middle of ``lm`` and ``adder``, then ``--resume``: the same weights,
optimizer state, results and logged records as the uninterrupted run, bit for bit (one machine).

The signal is sent by the run's own process while it draws the batch of a chosen step (a wrapper
script patches the experiment's batch function), so the test does not depend on timing."""

import subprocess
import sys

import pytest
import torch

from optiscope import cli, runs

from .test_lm import TINY, text  # noqa: F401  (the text fixture)

#: Wall-clock measurements (and that the last session resumed, which they are of): all a resume may change.
CLOCKS = {"seconds", "wall_seconds", "cpu_minutes", "wall_minutes", "tokens_per_s", "steps_per_s", "timings", "resumed"}

SCRIPT = """
import os, signal, sys
from optiscope import cli
from optiscope.experiments import {module} as experiment
real, calls = experiment.{batch}, [0]
def batch(*args):
    calls[0] += 1
    if calls[0] == {at}:
        os.kill(os.getpid(), signal.{signal})
    return real(*args)
experiment.{batch} = batch
sys.exit(cli.main(sys.argv[1:]))
"""


def without_clocks(value):
    if isinstance(value, dict):
        return {k: without_clocks(v) for k, v in value.items() if k not in CLOCKS}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


def everything(run_dir):
    """Checkpoint tensors, results.json and metrics.jsonl of a run directory, clocks left out."""
    tensors = {}
    for path in sorted((run_dir / "checkpoints").glob("*.pt")):
        saved = runs.load_checkpoint(path)
        training = saved.get("training") or saved  # the adder's "-best" files are plain model exports
        for part in ("model", "optimizer"):
            if part in training:
                tensors[(path.name, part)] = training[part]
    return (
        tensors,
        without_clocks(runs.read_json(run_dir / "results.json")),
        without_clocks(runs.read_jsonl(run_dir / "metrics.jsonl")),
    )


def assert_equal_runs(a, b):
    tensors_a, results_a, metrics_a = everything(a)
    tensors_b, results_b, metrics_b = everything(b)
    assert tensors_a.keys() == tensors_b.keys()
    for key, state in tensors_a.items():
        other = tensors_b[key]
        if key[1] == "model":
            for name, tensor in state.items():
                assert torch.equal(tensor, other[name]), (key, name)
        else:
            for i, s in state["state"].items():
                for name, value in s.items():
                    assert torch.equal(value, other["state"][i][name]), (key, i, name)
    assert results_a == results_b
    assert metrics_a == metrics_b


def interrupt(argv, module, batch, at, signal):
    script = SCRIPT.format(module=module, batch=batch, at=at, signal=signal)
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)


EXPECTED_CODE = {"SIGINT": cli.EXIT_INTERRUPTED, "SIGTERM": cli.EXIT_INTERRUPTED, "SIGKILL": -9}


# each experiment stopped gracefully (SIGINT/SIGTERM: a checkpoint at the stop) and killed (SIGKILL: from the last
# periodic checkpoint) in make test; every other pairing under make test-slow
@pytest.mark.parametrize("signal", [pytest.param("SIGINT", marks=pytest.mark.slow), "SIGTERM", "SIGKILL"])
def test_lm(tmp_path, text, signal):  # noqa: F811
    options = [*TINY, "--text", str(text), "--steps", "30", "--optimizers", "adamw,sgd", "--checkpoint-every", "10"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert cli.main(["run", "lm", "--out", str(straight), *options]) == 0
    # batch 47 is step 17 of sgd, the second run: adamw is finished, sgd has a checkpoint at step 10
    done = interrupt(["run", "lm", "--out", str(stopped), *options], "lm", "sample_batch", 47, signal)
    assert done.returncode == EXPECTED_CODE[signal], done.stderr
    assert not (stopped / "results.json").exists()
    assert cli.main(["run", "lm", "--out", str(stopped), *options, "--resume"]) == 0
    assert_equal_runs(straight, stopped)


@pytest.mark.parametrize(
    "signal",
    ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow), pytest.param("SIGKILL", marks=pytest.mark.slow)],
)
def test_adder(tmp_path, signal):
    options = [
        *("--steps", "40", "--eval-every", "10", "--log-every", "5", "--warmup-steps", "5", "--carry-steps", "20"),
        *("--batch-size", "32", "--optimizers", "adamw,lion@0.002", "--quiet"),
    ]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert cli.main(["run", "adder", "--out", str(straight), *options]) == 0
    # batch 57 is step 17 of lion: adamw is finished, lion has a checkpoint at step 10
    done = interrupt(["run", "adder", "--out", str(stopped), *options], "adder", "training_batch", 57, signal)
    assert done.returncode == EXPECTED_CODE[signal], done.stderr
    assert cli.main(["run", "adder", "--out", str(stopped), *options, "--resume"]) == 0
    assert_equal_runs(straight, stopped)


def test_lm_under_torchrun_with_dropout(tmp_path, text):  # noqa: F811
    """Two processes (gloo) draw their own dropout masks from their own RNG streams: a job stopped by
    SIGTERM on rank 1 resumes both streams, so it ends bit for bit as the job that was never stopped."""
    options = [*TINY, "--text", str(text), "--steps", "20", "--optimizers", "adamw", "--dropout", "0.2"]
    options += ["--device", "cpu"]  # gloo: on a machine with one GPU, two processes could not each have one
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    script = tmp_path / "stop_rank_1.py"
    script.write_text(
        SCRIPT.format(module="lm", batch="sample_batch", at=12, signal="SIGTERM").replace(
            "if calls[0] ==", "if os.environ['RANK'] == '1' and calls[0] =="
        )
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for argv in ([*torchrun, "-m", "optiscope"], [*torchrun, str(script)]):
        out = straight if argv[-1] == "optiscope" else stopped
        subprocess.run([*argv, "run", "lm", "--out", str(out), *options], capture_output=True, timeout=300)
    assert (straight / "results.json").exists() and not (stopped / "results.json").exists()
    assert runs.load_checkpoint(stopped / "checkpoints" / "adamw.pt")["step"] == 12
    resumed = subprocess.run(
        [*torchrun, "-m", "optiscope", "run", "lm", "--out", str(stopped), *options, "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert_equal_runs(straight, stopped)
