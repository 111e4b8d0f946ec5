"""The lm experiment end to end on a tiny model and a small local text."""

import random
import subprocess
import sys

import pytest
import torch

from optiscope import cli, runs
from optiscope.experiments import ConfigError, lm

TINY = [  # a 1-layer, 16-wide GPT
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--eval-every",
    "10",
    "--eval-batches",
    "2",
    "--log-every",
    "5",
    "--checkpoint-every",
    "10",
    "--sample-tokens",
    "8",
    "--prompts",
    "the,a cat",
    "--warmup",
    "2",
    "--quiet",
]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    rng = random.Random(0)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "the",
        "dog",
        "ran",
        "to",
        "see",
        "what",
        "it",
        "was",
        "doing",
        "there",
        "today",
    ]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) + "." for _ in range(900)]
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cli(out, text, *extra):
    return cli.main(["run", "lm", "--out", str(out), "--text", str(text), *TINY, *extra])


def test_runs_each_optimizer_and_draws_figures(tmp_path, text):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "20", "--optimizers", "sgd,adamw,muon") == 0
    results = runs.read_json(out / "results.json")
    assert list(results["runs"]) == ["sgd", "adamw", "muon"]
    for run in results["runs"].values():
        assert run["status"] == "ok" and run["final"]["steps"] == 20
        assert run["eval"]["step"] == [10, 20] and len(run["samples"]) == 2
        assert run["eval"]["val_loss"][-1] < run["train"]["loss"][0]  # it learned something
        assert len(run["embedding_rows"]["update"]) == results["corpus"]["vocab_size"]
    records = runs.read_jsonl(out / "metrics.jsonl")
    assert {r["run"] for r in records} == {"sgd", "adamw", "muon"}
    assert {p.name for p in (out / "figures").iterdir()} == {
        "lm_loss.png",
        "lm_update_ratio.png",
        "lm_embedding_rows.png",
        "lm_summary.png",
    }


def test_same_initialisation_and_data_for_every_run(tmp_path, text):
    """Two runs of the same optimizer under different labels must be identical step for step."""
    out = tmp_path / "run"
    run_cli(out, text, "--steps", "10", "--optimizers", "adam,adam@0.001")
    r = runs.read_json(out / "results.json")["runs"]
    assert r["adam"]["train"]["loss"] == r["adam@0.001"]["train"]["loss"]


def test_resume_after_interrupt_is_bit_exact(tmp_path, text, monkeypatch):
    """20 steps, interrupted after 10 (Ctrl-C) and resumed, equal 20 straight steps."""
    straight = tmp_path / "straight"
    run_cli(straight, text, "--steps", "20", "--optimizers", "adamw", "--checkpoint-every", "20")
    interrupted = tmp_path / "interrupted"
    real_sample = lm.sample_batch
    calls = {"n": 0}

    def interrupt_at_11(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(lm, "sample_batch", interrupt_at_11)
    assert run_cli(interrupted, text, "--steps", "20", "--optimizers", "adamw", "--checkpoint-every", "20") == 130
    monkeypatch.setattr(lm, "sample_batch", real_sample)
    assert runs.load_checkpoint(interrupted / "checkpoints" / "adamw.pt")["history"]["step"] == 10
    assert (
        run_cli(interrupted, text, "--steps", "20", "--optimizers", "adamw", "--checkpoint-every", "20", "--resume")
        == 0
    )
    a = runs.load_checkpoint(straight / "checkpoints" / "adamw.pt")
    b = runs.load_checkpoint(interrupted / "checkpoints" / "adamw.pt")
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(a["optimizer"]["state"][0][key], b["optimizer"]["state"][0][key])
    ra, rb = runs.read_json(straight / "results.json"), runs.read_json(interrupted / "results.json")
    assert ra["runs"]["adamw"]["train"]["loss"] == rb["runs"]["adamw"]["train"]["loss"]
    assert ra["runs"]["adamw"]["eval"]["val_loss"] == rb["runs"]["adamw"]["eval"]["val_loss"]
    steps = [r["step"] for r in runs.read_jsonl(interrupted / "metrics.jsonl")]
    assert steps == sorted(set(steps))  # no record logged twice across the resume


def test_divergence_is_reported_and_the_comparison_goes_on(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert run_cli(out, text, "--steps", "30", "--optimizers", "sgd@1000,adamw", "--clip", "1e9") == 0
    results = runs.read_json(out / "results.json")
    bad = results["runs"]["sgd@1000"]
    assert bad["status"].startswith("diverged at step ") and bad["divergence"]["step"] <= 30
    assert results["runs"]["adamw"]["status"] == "ok" and results["status"] == "ok"
    assert (out / "checkpoints" / "sgd_1000.pt").exists() or bad["divergence"]["step"] < 10
    # when every run diverges the command itself fails
    assert (
        run_cli(tmp_path / "all", text, "--steps", "30", "--optimizers", "sgd@1000", "--clip", "1e9")
        == cli.EXIT_DIVERGED
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--optimizers", "adam,sgdd"], "unknown optimizer 'sgdd'"),
        (["--optimizers", "adam@fast"], "learning rate 'fast' that is not a number"),
        (["--optimizers", "adam@-1"], "the learning rate must be > 0"),
        (["--n-embd", "15"], "--n-embd=15 must be divisible by --n-head=2"),
        (["--prompts", "ZQ"], "'ZQ' cannot be encoded"),
        (["--block-size", "100000"], "each needs at least --block-size + 1"),
    ],
)
def test_bad_settings_are_clean_errors(tmp_path, text, capsys, args, message):
    assert run_cli(tmp_path / "bad", text, "--steps", "5", *args) == cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().out.replace("\n", "")


def test_missing_text_file_is_a_clean_error(tmp_path, capsys):
    assert cli.main(["run", "lm", "--out", str(tmp_path / "x"), "--text", str(tmp_path / "none.txt"), *TINY]) == 2
    assert "none.txt" in capsys.readouterr().out


def test_parse_runs():
    specs = lm.parse_runs("sgd, adam@0.05 ,muon")
    assert [(s.label, s.optimizer, s.lr) for s in specs] == [
        ("sgd", "sgd", 0.05),
        ("adam@0.05", "adam", 0.05),
        ("muon", "muon", 0.02),
    ]
    with pytest.raises(ConfigError, match="names a run twice"):
        lm.parse_runs("adam,adam")


def test_two_processes_reproduce_one(tmp_path, text):
    """torchrun with 2 CPU processes (gloo) trains on the same global batch as 1 process: same losses."""
    common = [*TINY, "--text", str(text), "--steps", "6", "--optimizers", "adamw", "--log-every", "1"]
    single = tmp_path / "single"
    assert cli.main(["run", "lm", "--out", str(single), *common]) == 0
    double = tmp_path / "double"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "optiscope",
            "run",
            "lm",
            "--out",
            str(double),
            *common,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    a = runs.read_json(single / "results.json")["runs"]["adamw"]
    b = runs.read_json(double / "results.json")["runs"]["adamw"]
    assert b["final"]["processes"] == 2
    assert b["train"]["loss"] == pytest.approx(a["train"]["loss"], rel=1e-5)
    assert b["eval"]["val_loss"] == pytest.approx(a["eval"]["val_loss"], rel=1e-5)
