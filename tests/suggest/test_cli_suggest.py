"""``optiscope suggest-lr``: one line per optimizer and suggestion.json; each bad input one line, exit 2."""

import pytest

from optiscope import cli, experiments, runs


@pytest.fixture
def probe_me(monkeypatch):
    """The quadratic experiment of ``fake_trainee`` as ``probe-me``, the only one suggest-lr offers."""
    monkeypatch.setitem(experiments.EXPERIMENTS, "probe-me", "suggest.fake_trainee")
    monkeypatch.setattr(experiments, "suggestable", lambda: ["probe-me"])


#: the closed forms on ½(10w₁² + w₂²) at w = (1, 1), one batch (no gradient noise): the edge is 2/10 for SGD and 3.8/10
#: for heavy ball; the noise-free greedy step along g = (10, 1) is gᵀg/gᵀHg = 101/1001, over 1/(1 − β) = 10 with
#: momentum, and binds first for ``limits`` (the default)
ORACLES = {"limits": (101 / 1001, 0.1 * 101 / 1001), "sharpness": (0.2, 0.38)}


@pytest.mark.parametrize("method", [None, "sharpness"], ids=["default", "sharpness"])
def test_suggest_lr_prints_a_line_per_optimizer_and_writes_suggestion_json(probe_me, tmp_path, capsys, method):
    out = tmp_path / "s"
    chosen = [] if method is None else ["--method", method]
    assert cli.main(["suggest-lr", "probe-me", "--optimizers", "sgd,momentum", "--out", str(out), *chosen]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = {line.split(":")[0].strip(): line for line in printed if line.startswith("  ")}
    assert set(lines) == {"sgd", "momentum"} and all(
        "band" in line and "of 20 passes" in line for line in lines.values()
    )
    saved = runs.read_json(out / "suggestion.json")
    assert saved["experiment"] == "probe-me" and saved["budget"] == 0.05
    sgd, momentum = ORACLES[method or "limits"]
    assert saved["optimizers"]["sgd"]["edge"] == pytest.approx(sgd, rel=1e-3)
    assert saved["optimizers"]["momentum"]["edge"] == pytest.approx(momentum, rel=1e-3)
    assert f"{saved['optimizers']['sgd']['lr']:.3g}" in lines["sgd"]


def test_an_existing_suggestion_is_replaced_only_with_force(probe_me, tmp_path, capsys):
    out = tmp_path / "s"
    assert cli.main(["suggest-lr", "probe-me", "--out", str(out)]) == 0
    assert cli.main(["suggest-lr", "probe-me", "--out", str(out)]) == cli.EXIT_BAD_INPUT
    assert "suggestion.json exists; pass --force" in capsys.readouterr().err
    assert cli.main(["suggest-lr", "probe-me", "--out", str(out), "--force"]) == 0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--batches", "empty"], "batches gave no batch"),
        (["--loss", "nan"], "the loss is nan at the first probe step"),
        (["--budget", "0.001"], "steps=1 is too few for one measurement"),
        (["--optimizers", "suggest.no_lr.Sign"], "takes no lr"),
        (["--optimizers", "nope"], "unknown optimizer 'nope'"),
        (["--budget", "2"], "--budget 2.0 must be a share"),
        (["--method", "best"], "--method 'best'; valid: limits"),
    ],
    ids=["empty-batches", "nan-loss", "too-few-steps", "optimizer-without-lr", "unknown-optimizer", "budget", "method"],
)
def test_each_bad_input_is_one_line_and_exit_2(probe_me, tmp_path, capsys, options, said):
    code = cli.main(["suggest-lr", "probe-me", "--out", str(tmp_path / "s"), *options])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "s" / "suggestion.json").exists()


def test_an_experiment_without_a_run_to_probe_is_refused_in_one_line(capsys):
    assert cli.main(["suggest-lr", "landscapes", "--out", "x"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["optiscope: suggest-lr: unknown experiment 'landscapes'; valid: adder, lm, mlp"]
