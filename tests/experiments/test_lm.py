"""The lm experiment end to end on a tiny model and a small local text."""

import json
import math
import subprocess
import sys

import pytest
import torch

from optiscope import cli, runs
from optiscope.experiments import ConfigError, build_config, lm
from support import write_tiny_corpus

TINY = [  # a 1-layer, 16-wide GPT
    *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4"),
    *("--eval-every", "10", "--eval-batches", "2", "--log-every", "5", "--checkpoint-every", "10"),
    *("--sample-tokens", "8", "--prompts", "the|a cat", "--quiet"),  # the warmup follows --steps
]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus") / "tiny.txt")


def run_cli(out, text, *extra):
    return cli.main(["run", "lm", "--out", str(out), "--text", str(text), *TINY, *extra])


def test_a_warmup_not_given_follows_steps():
    """A short run needs no --warmup-steps of its own: a tenth of --steps, at most nanoGPT's 100; one given
    is kept, and one that does not fit is still refused."""
    assert lm.Config().warmup_steps == 100 and lm.Config(steps=5000).warmup_steps == 100
    assert lm.Config(steps=20).warmup_steps == 2 and lm.Config(steps=5).warmup_steps == 0
    assert build_config(lm, True, {}).warmup_steps == 30  # --quick's 300 steps
    assert build_config(lm, True, {"steps": 20}).warmup_steps == 2
    assert lm.Config(steps=20, warmup_steps=7).warmup_steps == 7
    with pytest.raises(ConfigError, match=r"--warmup-steps=20 must be in \[0, --steps=20\)"):
        lm.Config(steps=20, warmup_steps=20)


def test_runs_each_optimizer_and_draws_figures(tmp_path, text):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "20", "--optimizers", "sgd,adamw,muon+adamw") == 0
    results = runs.read_json(out / "results.json")
    assert list(results["runs"]) == ["sgd", "adamw", "muon+adamw"]
    for run in results["runs"].values():
        assert run["status"] == "ok" and run["final"]["steps"] == 20
        assert run["eval"]["step"] == [10, 20] and len(run["samples"]) == 2
        assert run["eval"]["val_loss"][-1] < run["train"]["loss"][0]  # it learned something
        assert len(run["embedding_rows"]["update"]) == results["corpus"]["vocab_size"]
    assert results["runs"]["muon+adamw"]["setting"].startswith(
        "Muon(lr=η, weight_decay=0) on hidden matrices + AdamW(lr=η/20, betas=(0.9, 0.95)"
    )
    records = runs.read_jsonl(out / "metrics.jsonl")
    assert {r["run"] for r in records} == {"sgd", "adamw", "muon+adamw"}
    assert {p.name for p in (out / "figures").iterdir()} == {
        "lm_loss.png",
        "lm_update_ratio.png",
        "lm_embedding_rows.png",
        "lm_summary.png",
    }


def test_same_initialisation_and_data_for_every_run(tmp_path, text):
    """Two runs of one update rule under different names (Adam+L2 at λ = 0 is Adam; one run written twice is
    refused) must be identical step for step: the same initial weights and the same batches."""
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "10", "--optimizers", "adam,adaml2", "--weight-decay", "0") == 0
    r = runs.read_json(out / "results.json")["runs"]
    assert r["adam"]["train"]["loss"] == r["adaml2"]["train"]["loss"]


def test_a_certain_divergence_is_reported_and_the_comparison_goes_on(tmp_path, text):
    """SGD at η = 1e30 overflows on any machine; where exactly does not matter: the run is recorded as
    diverged (the step it diverged at, the reason), the other runs go on, and every figure is drawn."""
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "30", "--optimizers", "sgd@1e30,adamw") == 0
    results = runs.read_json(out / "results.json")
    bad = results["runs"]["sgd@1e30"]
    assert bad["status"] == "diverged" and 1 <= bad["divergence"]["step"] <= 30 and bad["divergence"]["reason"]
    assert results["runs"]["adamw"]["status"] == "ok" and results["status"] == "ok"
    assert len(list((out / "figures").glob("*.png"))) == 4 and not (out / "error.log").exists()
    # when every run diverges the command itself fails
    assert run_cli(tmp_path / "all", text, "--steps", "30", "--optimizers", "sgd@1e30") == cli.EXIT_DIVERGED


def test_a_last_step_whose_harm_shows_only_in_the_evaluation_is_a_divergence(tmp_path, text):
    """Adam's first step moves every weight by η = 1e30 (finite weights, whose products overflow float32): the
    training loss before it was finite, the evaluation after it is not, on any machine. The run is diverged at
    step 1, not "ok" with a validation loss of NaN."""
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "1", "--optimizers", "adam@1e30") == cli.EXIT_DIVERGED
    run = runs.read_json(out / "results.json")["runs"]["adam@1e30"]
    assert not math.isfinite(run["eval"]["val_loss"][-1])  # what the divergence is judged on
    assert run["status"] == "diverged" and run["divergence"]["step"] == 1
    assert "at the evaluation after step 1" in run["divergence"]["reason"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--optimizers", "adam,sgdd"], "unknown optimizer 'sgdd'"),
        (["--optimizers", "muon"], "unknown optimizer 'muon'; valid: sgd"),
        (["--optimizers", "adam@fast"], "learning rate 'fast' that is not a number"),
        (["--optimizers", "adam@-1"], "the learning rate must be a finite number > 0"),
        (["--n-embd", "15"], "--n-embd=15 must be divisible by --n-head=2"),
        (["--prompts", "ZQ"], "'ZQ' cannot be encoded"),
        (["--block-size", "100000"], "at least 100001 (a window of 100000 + 1): use a longer text or a smaller"),
        (["--clip", "inf"], "--clip=inf must be a finite number > 0"),
        (["--weight-decay", "inf"], "--weight-decay=inf must be a finite number >= 0"),
        (["--curvature-batch", "4"], "--curvature-batch=4 has no effect without --curvature-every N"),
    ],
)
def test_bad_settings_are_clean_errors(tmp_path, text, capsys, args, message):
    assert run_cli(tmp_path / "bad", text, "--steps", "5", *args) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "bad" / "config.json").exists()


def test_missing_text_file_leaves_the_run_there_untouched(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "10", "--optimizers", "adam") == 0
    stored = (out / "config.json").read_text()
    missing = ["run", "lm", "--out", str(out), "--text", str(tmp_path / "none.txt"), *TINY, "--resume"]
    assert cli.main(missing) == cli.EXIT_BAD_INPUT
    assert "--text" in capsys.readouterr().err  # the stored run was made with another --text
    assert (out / "config.json").read_text() == stored


def test_a_corrupt_checkpoint_is_a_one_line_error(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "20", "--optimizers", "adam", "--checkpoint-every", "5") == 0
    path = out / "checkpoints" / "adam.pt"
    path.write_bytes(path.read_bytes()[:1000])
    assert run_cli(out, text, "--steps", "20", "--optimizers", "adam", "--resume") == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{path} is not a readable checkpoint" in lines[0]


def test_a_rerun_cannot_mix_two_runs(tmp_path, text, capsys):
    """The issue's reproduction: a re-run with another seed is refused; replaced with --force and stopped
    half way, its resumed results are its own (not the first run's), and no record is logged twice."""
    out = tmp_path / "run"
    common = ["--steps", "40", "--optimizers", "adam,sgd", "--checkpoint-every", "5"]
    assert run_cli(out, text, *common) == 0
    first = runs.read_json(out / "results.json")["runs"]["adam"]["final"]["val_loss"]
    assert run_cli(out, text, *common, "--seed", "7") == cli.EXIT_BAD_INPUT
    assert "--resume" in capsys.readouterr().err
    script = (
        "import os, signal, sys\n"
        "from optiscope import cli\nfrom optiscope.experiments import lm\n"
        "real, calls = lm.sample_batch, [0]\n"
        "def batch(*a):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 55:\n"  # adam has finished; sgd is at step 15
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(*a)\n"
        "lm.sample_batch = batch\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = ["run", "lm", "--out", str(out), "--text", str(text), *TINY, *common, "--seed", "7", "--force"]
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == cli.EXIT_INTERRUPTED, done.stderr
    assert not (out / "results.json").exists()
    assert run_cli(out, text, *common, "--seed", "7", "--resume") == 0
    results = runs.read_json(out / "results.json")
    assert runs.read_json(out / "config.json")["config"]["seed"] == 7
    assert results["runs"]["adam"]["final"]["val_loss"] != first
    keys = [(r["run"], r["step"], "diverged" in r) for r in runs.read_jsonl(out / "metrics.jsonl")]
    assert len(keys) == len(set(keys))


def test_two_processes_reproduce_one(tmp_path, text):
    """torchrun with 2 CPU processes (gloo) trains on the same global batch as 1 process: same losses."""
    common = [*TINY, "--text", str(text), "--steps", "6", "--optimizers", "adamw", "--log-every", "1"]
    common += ["--device", "cpu"]  # gloo: on a machine with one GPU, two processes could not each have one
    single = tmp_path / "single"
    assert cli.main(["run", "lm", "--out", str(single), *common]) == 0
    double = tmp_path / "double"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + ["-m", "optiscope", "run", "lm", "--out", str(double), *common],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]  # what torchrun and the processes said, if it failed
    a = runs.read_json(single / "results.json")["runs"]["adamw"]
    b = runs.read_json(double / "results.json")["runs"]["adamw"]
    assert b["final"]["processes"] == 2
    assert b["train"]["loss"] == pytest.approx(a["train"]["loss"], rel=1e-5)
    assert b["eval"]["val_loss"] == pytest.approx(a["eval"]["val_loss"], rel=1e-5)


def test_the_checkpoint_holds_the_whole_run(tmp_path, text):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "10", "--optimizers", "adamw") == 0
    saved = runs.load_checkpoint(lm.checkpoint_path(out, "adamw"))
    assert saved["step"] == 10 and saved["history"]["status"] == "ok"
    assert set(saved["training"]) == {"model", "optimizer", "scheduler", "data", "rng", "monitor"}
    assert json.dumps(saved["history"]["final"]) == json.dumps(
        runs.read_json(out / "results.json")["runs"]["adamw"]["final"]
    )
    assert torch.is_tensor(saved["training"]["data"])


def test_curvature_every_records_preconditioned_sharpness(tmp_path, text):
    options = ["--steps", "20", "--optimizers", "adam", "--log-every", "5", "--eval-every", "20"]
    assert run_cli(tmp_path, text, *options, "--curvature-every", "10", "--curvature-batch", "4") == 0
    c = runs.read_json(tmp_path / runs.RESULTS)["runs"]["adam"]["curvature"]
    assert c["step"] == [10, 20] and all(s > 0 for s in c["sharpness"])
    assert c["label"] == "38/η" and c["preconditioned"]
    assert c["threshold"] == [pytest.approx(38 / lm.LEARNING_RATES["adam"])] * 2
    written = [r for r in runs.read_jsonl(tmp_path / runs.METRICS) if "sharpness/threshold" in r]
    assert [r["step"] for r in written] == [10, 20]


def test_a_last_measurement_without_threshold_keeps_the_runs_label(tmp_path, text):
    """Cosine to lr 0: the last measurement has no threshold, the run's label stays that of the others."""
    options = ["--steps", "20", "--optimizers", "adam", "--log-every", "10", "--eval-every", "20"]
    cosine = ("--schedule", "warmup_cosine", "--min-lr-ratio", "0")
    assert run_cli(tmp_path, text, *options, "--curvature-every", "10", *cosine) == 0
    c = runs.read_json(tmp_path / runs.RESULTS)["runs"]["adam"]["curvature"]
    assert c["threshold"][0] > 0 and c["threshold"][-1] is None
    assert c["label"] == "38/η" and c["preconditioned"]


def test_curvature_every_must_be_a_multiple_of_log_every_and_within_the_run():
    with pytest.raises(lm.ConfigError, match="multiple of --log-every"):
        lm.Config(log_every=10, curvature_every=15)
    with pytest.raises(lm.ConfigError, match="--curvature-every=100 exceeds --steps=40: nothing would be measured"):
        lm.Config(steps=40, log_every=10, curvature_every=100)


def test_the_first_step_of_the_run_is_the_trainees(text, tmp_path):
    """The loss of the run's first step (the monitor's record at step 1) is the trainee's loss on its first batch at
    its weights: suggest-lr probes the GPT, the batches and the order this experiment trains on."""
    options = ["--optimizers", "adamw", "--steps", "4", "--log-every", "1"]
    assert run_cli(tmp_path / "run", text, *options) == 0
    first = runs.read_json(tmp_path / "run" / "results.json")["runs"]["adamw"]["train"]["loss"][0]
    parsed = cli.make_parser().parse_args(["run", "lm", "--out", "x", "--text", str(text), *TINY, *options])
    config = build_config(lm, False, cli.config_overrides(parsed))
    trainee = lm.trainee(config, lm.runs_of(config)[0])
    with torch.no_grad():
        assert float(trainee.loss_fn(trainee.model, next(iter(trainee.batches)))) == pytest.approx(first, rel=1e-6)
    assert (trainee.steps, trainee.batch_size, trainee.decay_vectors) == (4, 4, False)
