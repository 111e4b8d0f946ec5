"""The entropy experiment on a tiny GPT: the seed's results layout, linearity at small η, clean errors."""

import math
import shutil

import pytest

from optiscope import cli, runs
from optiscope.experiments import entropy

from .test_lm import TINY, run_cli, text  # noqa: F401  (the text fixture)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, text):  # noqa: F811
    out = tmp_path_factory.mktemp("lm") / "run"
    assert run_cli(out, text, "--steps", "30", "--optimizers", "adamw,sgd") == 0
    return out


PROBE = [
    "--E",
    "24",
    "--runs",
    "2",
    "--seq-len",
    "12",
    "--n-etas",
    "5",
    "--subset-size",
    "8",
    "--subsets",
    "50",
    "--warm-steps",
    "3",
    "--quiet",
]


def test_results_keep_the_seed_layout_and_small_steps_are_linear(tmp_path, lm_dir):
    out = tmp_path / "probe"
    args = ["run", "entropy", "--out", str(out), "--checkpoint", str(lm_dir), "--optimizers", "sgd,adamw", *PROBE]
    assert cli.main([*args, "--eta-decades", "4"]) == 0
    results = runs.read_json(out / "results.json")
    finals = {k: r["final"]["val_loss"] for k, r in runs.read_json(lm_dir / "results.json")["runs"].items()}
    assert results["model"].endswith(f"run {min(finals, key=finals.get)}")  # the lm run with the lowest val loss
    for name, opt in results["optimizers"].items():
        assert any(math.isclose(e, opt["lr"]) for e in opt["etas"])  # the real step is on the grid
        assert opt["etas"][-1] / opt["etas"][0] >= 100  # at least two decades
        for r in opt["runs"]:
            approx, entries = r["approx"], r["true"]["entries"]
            assert {"delta_h_per_lr", "quadratic", "per_sequence"} <= set(approx)
            assert {"gdotv", "vHvv"} <= set(approx["quadratic"]) and len(approx["per_sequence"]) == 24
            diag = entries[0]["diagnostics"]
            assert {"weights_sum", "normalized_weights", "token_counts", "h_new", "base_entropy"} <= set(diag)
            smallest = entries[0]
            assert smallest["delta_h_true"] / (approx["delta_h_per_lr"] * smallest["eta"]) == pytest.approx(1, abs=0.02)
        small = [entropy.true_change_fit(r["true"]["entries"][:3]) for r in opt["runs"]]
        for fit in small:  # over the linear regime (the three smallest η) the slope is 1
            assert fit["slope"] == pytest.approx(1, abs=0.05) and fit["r2"] >= 0.99, (name, fit)
    assert {p.name for p in (out / "figures").iterdir()} == {
        "entropy_delta_vs_eta.png",
        "entropy_delta_vs_eta_aggregate.png",
        "entropy_loglog.png",
        "entropy_subsets.png",
        "entropy_vs_loss.png",
    }


def test_policy_mode_reports_importance_weights(tmp_path, lm_dir):
    out = tmp_path / "policy"
    args = [
        "run",
        "entropy",
        "--out",
        str(out),
        "--checkpoint",
        str(lm_dir),
        "--optimizers",
        "adamw",
        "--mode",
        "policy",
    ]
    assert cli.main([*args, *PROBE]) == 0
    r = runs.read_json(out / "results.json")["optimizers"]["adamw"]["runs"][0]
    assert r["mode"] == "policy"
    for entry in r["true"]["entries"]:
        assert 1 <= entry["diagnostics"]["ess"] <= 24
        assert sum(entry["diagnostics"]["normalized_weights"]) == pytest.approx(1)


def test_trains_its_own_model_when_given_no_checkpoint(tmp_path, text):  # noqa: F811
    out = tmp_path / "own"
    args = [
        "run",
        "entropy",
        "--out",
        str(out),
        "--text",
        str(text),
        "--train-steps",
        "10",
        "--train-layers",
        "1",
        "--train-width",
        "16",
        "--optimizers",
        "adam",
        *PROBE,
    ]
    assert cli.main(args) == 0
    assert runs.read_json(out / "lm" / "config.json")["experiment"] == "lm"
    assert runs.read_json(out / "results.json")["optimizers"]["adam"]["runs"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--E", "100000"], "need at least"),
        (["--eta-decades", "1"], "--eta-decades=1.0 must be a finite number >= 2"),
        (["--eta-decades", "inf"], "--eta-decades=inf must be a finite number >= 2"),
        (["--optimizers", "adam,newton"], "unknown optimizer 'newton'"),
        (["--seq-len", "999"], "must be <= the model's context"),
        (["--mode", "sampled"], "valid: fixed, policy"),
        (["--text", "notes.txt"], "a --checkpoint run brings its own text"),
    ],
)
def test_bad_settings_are_clean_errors(tmp_path, lm_dir, capsys, extra, message):
    args = ["run", "entropy", "--out", str(tmp_path / "bad"), "--checkpoint", str(lm_dir), *PROBE, *extra]
    assert cli.main(args) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_checkpoint_must_be_an_lm_run(tmp_path, capsys):
    other = tmp_path / "other"
    with runs.open_run(other, "landscapes", {}):
        pass
    assert cli.main(["run", "entropy", "--out", str(tmp_path / "x"), "--checkpoint", str(other), *PROBE]) == 2
    assert "give an `lm` run directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint-run", "adamw"], "names a run of --checkpoint's directory; give --checkpoint too"),
        (["--checkpoint="], "--checkpoint is empty"),
        (["--checkpoint", "{tmp}"], "holds no optiscope run"),
    ],
)
def test_a_checkpoint_option_that_names_nothing_is_refused(tmp_path, capsys, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert cli.main(["run", "entropy", "--out", str(tmp_path / "x"), *args, *PROBE]) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_a_text_that_does_not_exist_leaves_the_directory_free(tmp_path, capsys):
    """The nested lm run stops before writing anything: a corrected command needs no --force."""
    out = tmp_path / "x"
    assert cli.main(["run", "entropy", "--out", str(out), "--text", str(tmp_path / "none.txt"), *PROBE]) == 2
    assert not (out / "config.json").exists()
    with runs.open_run(out, "entropy", {}, owned=entropy.OWNS):  # what the corrected run opens first
        pass


def test_a_corrupt_lm_checkpoint_is_a_one_line_error(tmp_path, lm_dir, capsys):
    broken = tmp_path / "lm"
    shutil.copytree(lm_dir, broken)
    path = broken / "checkpoints" / "adamw.pt"
    path.write_bytes(path.read_bytes()[:1000])
    args = ["run", "entropy", "--out", str(tmp_path / "x"), "--checkpoint", str(broken), "--checkpoint-run", "adamw"]
    assert cli.main([*args, *PROBE]) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{path} is not a readable checkpoint" in lines[0]


def test_a_pretrained_model_with_lora_adapters_end_to_end(tmp_path, text):  # noqa: F811
    """Seed 001's setting on a tiny 🤗 Qwen2 directory: LoRA, real AdamW steps, the probe on-policy."""
    pytest.importorskip("peft")
    import tiny_hf

    model_dir = tiny_hf.save("qwen2", tmp_path / "model")
    out = tmp_path / "run"
    args = ["run", "entropy", "--hf-model", str(model_dir), "--lora-rank", "4", "--quick", "--out", str(out)]
    small = ["--text", str(text), "--optimizers", "adamw", "--runs", "1", "--E", "8", "--seq-len", "8"]
    assert cli.main([*args, *small, "--subset-size", "4", "--subsets", "10", "--warm-steps", "2", "--quiet"]) == 0
    results = runs.read_json(out / runs.RESULTS)
    assert results["mode"] == "policy" and "LoRA r=4" in results["model"]
    (probe,) = results["optimizers"]["adamw"]["runs"]
    counts = probe["true"]["entries"][0]["diagnostics"]["token_counts"]
    assert counts == [8.0] * 8  # the sampled tokens only, not the left-padded prompts
    fit = entropy.true_change_fit(probe["true"]["entries"][:3])
    assert fit["slope"] == pytest.approx(1.0, abs=0.1)  # small steps change H linearly
    assert sorted(p.name for p in (out / "figures").glob("*.png"))


def test_a_pretrained_model_missing_or_whose_text_is_too_short_or_untokenised_is_a_one_line_error(tmp_path, capsys):
    """A 🤗 directory that does not exist or lacks its tokenizer's files, or a text too short for one window, is
    bad input (exit 2, one line), as it is for the GPT the experiment trains itself."""
    pytest.importorskip("transformers")
    import tiny_hf

    model_dir = tiny_hf.save("qwen2", tmp_path / "model")
    short = tmp_path / "short.txt"
    short.write_text("abc")
    bare = tmp_path / "bare"
    tiny_hf.model("qwen2", 0).save_pretrained(bare)  # weights and config, no tokenizer files
    capsys.readouterr()  # 🤗's saving progress bars
    cases = (
        (model_dir, "each needs at least"),
        (bare, "its tokenizer encodes the text to no tokens"),
        (tmp_path / "no-such-model", "no-such-model does not exist; give a 🤗 causal-LM directory"),
    )
    for model, message in cases:
        out = tmp_path / f"run-{model.name}"
        args = ["run", "entropy", "--hf-model", str(model), "--text", str(short), "--quick", "--out", str(out)]
        assert cli.main([*args, "--quiet"]) == cli.EXIT_BAD_INPUT
        lines = capsys.readouterr().err.strip().splitlines()  # --quiet: no 🤗 loading bars either
        assert len(lines) == 1 and message in lines[0], lines


def test_sampling_on_policy_leaves_the_models_train_flags_as_they_were():
    """A pretrained 🤗 model arrives in eval mode; sampling for the policy probe used to switch it to training
    (dropout on) for the steps after. Oracle: every module's flag before and after."""
    from types import SimpleNamespace

    import torch

    from optiscope.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1, attention="math"))
    model.eval()
    model.blocks[0].train()  # a mix, as a partly frozen model has
    flags = {name: m.training for name, m in model.named_modules()}
    held_out = torch.randint(0, 11, (3, 4))
    sequences, masks = entropy.on_policy(
        model, SimpleNamespace(prompts=None, context=8), held_out, 4, torch.Generator().manual_seed(0)
    )
    assert sequences.shape == (3, 5) and masks == {}
    assert {name: m.training for name, m in model.named_modules()} == flags
