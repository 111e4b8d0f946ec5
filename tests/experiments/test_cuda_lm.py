"""The lm experiment with ``--device cuda`` (skipped without a CUDA device): the same run as on the CPU up to
float32 rounding, curvature on the GPU, and a run stopped on the GPU resumed exactly there, or on the CPU."""

import pytest

from optiscope import cli, runs
from support import needs_cuda

from .test_lm import TINY, text  # noqa: F401  (the text fixture)
from .test_resume import assert_equal_runs, interrupt

pytestmark = needs_cuda


def options(text, *extra):  # noqa: F811
    return [*TINY, "--text", str(text), "--steps", "20", *extra]


def test_a_cuda_run_is_the_cpu_run_up_to_rounding(tmp_path, text):  # noqa: F811
    """SGD and AdamW (float32 on both devices) end where the CPU's runs end; Muon orthogonalises in bfloat16
    on a GPU, so its run is only checked to learn; curvature is measured on the GPU."""
    extra = ("--optimizers", "sgd,adamw,muon+adamw", "--curvature-every", "10")
    results = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        assert cli.main(["run", "lm", "--out", str(out), *options(text, *extra), "--device", device]) == 0
        results[device] = runs.read_json(out / "results.json")["runs"]
    for name in ("sgd", "adamw"):
        cpu, gpu = results["cpu"][name], results["cuda"][name]
        assert gpu["train"]["loss"][0] == pytest.approx(cpu["train"]["loss"][0], rel=1e-5)
        assert gpu["eval"]["val_loss"] == pytest.approx(cpu["eval"]["val_loss"], rel=1e-3)
        assert gpu["curvature"]["sharpness"] == pytest.approx(cpu["curvature"]["sharpness"], rel=1e-2)
    muon = results["cuda"]["muon+adamw"]
    assert muon["status"] == "ok" and muon["eval"]["val_loss"][-1] < muon["train"]["loss"][0]


def test_a_run_stopped_on_cuda_resumes_exactly_there_and_finishes_on_the_cpu(tmp_path, text):  # noqa: F811
    argv = options(text, "--optimizers", "adamw,sgd", "--dropout", "0.1", "--device", "cuda")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert cli.main(["run", "lm", "--out", str(straight), *argv]) == 0
    done = interrupt(["run", "lm", "--out", str(stopped), *argv], "lm", "sample_batch", 35, "SIGTERM")
    assert done.returncode == cli.EXIT_INTERRUPTED, done.stderr
    assert cli.main(["run", "lm", "--out", str(stopped), *argv, "--resume"]) == 0
    assert_equal_runs(straight, stopped)
    elsewhere = tmp_path / "elsewhere"
    done = interrupt(["run", "lm", "--out", str(elsewhere), *argv], "lm", "sample_batch", 35, "SIGTERM")
    assert done.returncode == cli.EXIT_INTERRUPTED, done.stderr
    cpu = [a if a != "cuda" else "cpu" for a in argv]
    assert cli.main(["run", "lm", "--out", str(elsewhere), *cpu, "--resume"]) == 0
    assert runs.read_json(elsewhere / "results.json")["status"] == "ok"
