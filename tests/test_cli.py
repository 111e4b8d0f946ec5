"""The command line: options generated from Config, run/plot/list/demo, and clean errors."""

import pytest

from optiscope import cli, experiments, figures, runs


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"fake": "fake_experiment"})
    monkeypatch.setattr(figures, "DRAWERS", {"fake": "fake_experiment"})


def test_run_writes_config_results_and_figures(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "4", "--rate", "2", "--names", "x,y,z"]) == 0
    config = runs.read_json(out / "config.json")
    assert config == {
        "experiment": "fake",
        "config": {"steps": 4, "rate": 2.0, "names": ["x", "y", "z"], "diverge": False},
    }
    results = runs.read_json(out / "results.json")
    assert results["squares"] == [0.0, 2.0, 8.0, 18.0] and results["status"] == "ok"
    assert (out / "figures" / "squares.txt").exists()
    assert "figure:" in capsys.readouterr().out


def test_quick_then_explicit_options(fake, tmp_path):
    cli.main(["run", "fake", "--out", str(tmp_path / "q"), "--quick"])
    assert runs.read_json(tmp_path / "q" / "config.json")["config"]["steps"] == 2
    cli.main(["run", "fake", "--out", str(tmp_path / "q2"), "--quick", "--steps", "5"])
    assert runs.read_json(tmp_path / "q2" / "config.json")["config"]["steps"] == 5


def test_plot_redraws_from_results_alone(fake, tmp_path):
    out = tmp_path / "run"
    cli.main(["run", "fake", "--out", str(out)])
    (out / "figures" / "squares.txt").unlink()
    assert cli.main(["plot", str(out)]) == 0
    assert (out / "figures" / "squares.txt").read_text() == "[0.0, 0.5, 2.0]"


def test_bad_config_is_a_clean_error(fake, tmp_path, capsys):
    assert cli.main(["run", "fake", "--out", str(tmp_path), "--steps", "0"]) == cli.EXIT_BAD_INPUT
    assert "steps=0 must be a positive integer" in capsys.readouterr().out


def test_unknown_experiment_lists_valid_ones(fake, capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "nope", "--out", "x"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_divergence_exits_nonzero(fake, tmp_path):
    assert cli.main(["run", "fake", "--out", str(tmp_path / "d"), "--diverge"]) == cli.EXIT_DIVERGED
    assert runs.read_json(tmp_path / "d" / "results.json")["status"] == "diverged"


def test_plot_of_missing_dir_is_clean(fake, tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "none")]) == cli.EXIT_BAD_INPUT
    assert "does not exist" in capsys.readouterr().out


def test_list_and_demo(fake, tmp_path, capsys):
    assert cli.main(["list"]) == 0
    assert "test double" in capsys.readouterr().out
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fake" / "figures" / "squares.txt").exists()
