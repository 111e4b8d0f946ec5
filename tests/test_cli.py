"""The command line: options from Config, run/plot/list/demo, the run-directory lifecycle, and errors
classified once (bad input: one line, exit 2; internal: exit 1 with the traceback in error.log)."""

import argparse
import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from optiscope import cli, experiments, figures, runs
from optiscope.figures import style


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"fake": "fake_experiment"})
    monkeypatch.setattr(figures, "DRAWERS", {"fake": "fake_experiment"})


def errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_run_writes_config_results_and_figures(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "4", "--rate", "2", "--names", "x,y,z"]) == 0
    config = runs.read_json(out / "config.json")
    assert config == {
        "experiment": "fake",
        "config": {"steps": 4, "rate": 2.0, "names": ["x", "y", "z"], "diverge": False, "crash": "", "quiet": False},
    }
    results = runs.read_json(out / "results.json")
    assert results["squares"] == [0.0, 2.0, 8.0, 18.0] and results["status"] == "ok"
    assert (out / "figures" / "squares.png").exists()
    assert "figure:" in capsys.readouterr().out


def test_quick_then_explicit_options(fake, tmp_path):
    cli.main(["run", "fake", "--out", str(tmp_path / "q"), "--quick"])
    assert runs.read_json(tmp_path / "q" / "config.json")["config"]["steps"] == 2
    cli.main(["run", "fake", "--out", str(tmp_path / "q2"), "--quick", "--steps", "5"])
    assert runs.read_json(tmp_path / "q2" / "config.json")["config"]["steps"] == 5


@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_every_experiment_takes_the_shared_options(name):
    """One command line (``--quiet --seed N``) fits every experiment; ``--quiet`` never changes results."""
    args = cli.make_parser().parse_args(["run", name, "--out", "x", "--quiet", "--seed", "3"])
    assert args.quiet is True and args.seed == 3
    assert "quiet" in experiments.options_without_effect(experiments.load(name).Config)


@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_each_options_help_states_its_default_once(name, capsys):
    """``--help`` prints (a help with a % sign once failed inside argparse's formatting), and a help that gives its
    default in words (``--measure-every``'s "a 70th of --steps") is not followed by the value that default takes
    at the default ``--steps``, which ``--quick`` or another ``--steps`` would not use."""
    with pytest.raises(SystemExit):
        cli.main(["run", name, "--help"])
    options = capsys.readouterr().out.split("\n  --")[1:]
    assert options and all(" ".join(text.split()).count("default:") <= 1 for text in options)
    # and the value --quick gives an option instead (adder's --params-budget: 100, but 300 with --quick)
    helps = {text.split()[0]: " ".join(text.split()) for text in options}
    for field, value in getattr(experiments.load(name), "QUICK", {}).items():
        shown = ",".join(map(str, value)) if isinstance(value, tuple | list) else value
        assert f"--quick: {shown})" in helps[field.replace("_", "-")], (field, helps[field.replace("_", "-")])


def parsers(parser, path=()):
    """Every (sub)command's parser with its words: (), ("run",), ("run", "lm"), ("sweep", "lm"), …"""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from parsers(sub, (*path, word))


def test_every_option_of_every_command_says_what_it_takes():
    """Each option and argument has a help of its own (not only "(default: 4)"), and one that takes a value names
    its kind in the metavar (PATH, DIR, INT, …), never argparse's echo of the option's name (``--out OUT``)."""
    missing, echoed = [], []
    for path, parser in parsers(cli.make_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):  # its choices are the (sub)commands, each with a help
                continue
            where = f"optiscope {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not re.sub(r"\(default: [^)]*\)", "", action.help or "").strip():
                missing.append(where)
            if action.nargs != 0 and action.metavar is None and action.option_strings:
                echoed.append(where)
    assert not missing, f"without help: {missing}"
    assert not echoed, f"without a metavar naming the value's kind: {echoed}"


def test_sweep_help_offers_only_the_experiments_it_can_tune(capsys):
    """entropy and edge-of-stability declare no objective: `sweep entropy` is refused, so the listing leaves
    them out."""
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    listed = capsys.readouterr().out
    tunable = [name for name in experiments.EXPERIMENTS if getattr(experiments.load(name), "OBJECTIVES", None)]
    assert tunable and all(f"\n    {name}" in listed for name in tunable)
    assert not any(f"\n    {name}" in listed for name in set(experiments.EXPERIMENTS) - set(tunable))


def test_plot_redraws_from_results_alone(fake, tmp_path):
    out = tmp_path / "run"
    cli.main(["run", "fake", "--out", str(out)])
    before = (out / "figures" / "squares.png").read_bytes()
    (out / "figures" / "squares.png").unlink()
    assert cli.main(["plot", str(out)]) == 0
    assert (out / "figures" / "squares.png").read_bytes() == before


@pytest.mark.parametrize(
    "option, value, said",
    [
        (
            "--steps",
            "99999999999999999999",
            "99999999999999999999 is out of range; give an integer with |value| < 2**63",
        ),
        ("--names", "a,b", None),
        ("--rate", "1,2", "invalid float value"),
    ],
)
def test_integers_beyond_64_bits_are_bad_input(fake, tmp_path, capsys, option, value, said):
    code = cli.main(["run", "fake", "--out", str(tmp_path / "r"), option, value])
    if said is None:
        assert code == 0
        return
    assert code == cli.EXIT_BAD_INPUT and said in errors(capsys)[0] and not (tmp_path / "r").exists()


def test_prompts_are_separated_by_bars_so_that_a_prompt_may_hold_a_comma():
    """lm's default prompt "To be, or not" could not be given: --prompts split it at its comma."""
    from optiscope.experiments import lm

    args = cli.make_parser().parse_args(["run", "lm", "--out", "x", "--prompts", "To be, or not|ROMEO:"])
    assert args.prompts == ("To be, or not", "ROMEO:")
    default = "|".join(lm.Config().prompts)  # what --help shows as the default gives the default back
    parsed = cli.make_parser().parse_args(["run", "lm", "--out", "x", "--prompts", default])
    assert parsed.prompts == lm.Config().prompts


def test_a_list_option_that_is_not_a_list_names_what_it_takes(capsys, tmp_path):
    code = cli.main(["run", "rare-tokens", "--out", str(tmp_path / "r"), "--frequencies", "0.5,abc"])
    assert code == cli.EXIT_BAD_INPUT
    assert errors(capsys) == [
        "optiscope: run rare-tokens: argument --frequencies: '0.5,abc' is not a comma-separated list of numbers"
    ]
    # an empty item is a typo, not a shorter list (it was dropped, and the run went on without it)
    for typo in ("0.5,,0.5", "0.5,0.5,", ",0.5,0.5"):
        code = cli.main(["run", "rare-tokens", "--out", str(tmp_path / "r"), "--frequencies", typo])
        assert code == cli.EXIT_BAD_INPUT and not (tmp_path / "r").exists()
        assert errors(capsys) == [
            f"optiscope: run rare-tokens: argument --frequencies: '{typo}' has an empty item; separate the values "
            "by single commas"
        ]


def test_plot_into_a_figures_path_that_is_a_file_is_bad_input(fake, tmp_path, capsys):
    out = tmp_path / "run"
    cli.main(["run", "fake", "--out", str(out)])
    shutil.rmtree(out / "figures")
    (out / "figures").write_text("notes")
    assert cli.main(["plot", str(out)]) == cli.EXIT_BAD_INPUT
    lines = errors(capsys)
    assert len(lines) == 1 and f"cannot draw the figures into {out / 'figures'}" in lines[0]
    assert (out / "figures").read_text() == "notes" and (out / "results.json").exists()


def test_divergence_exits_3(fake, tmp_path):
    assert cli.main(["run", "fake", "--out", str(tmp_path / "d"), "--diverge"]) == cli.EXIT_DIVERGED
    assert runs.read_json(tmp_path / "d" / "results.json")["status"] == "diverged"


def test_list_and_demo_twice(fake, tmp_path, capsys):
    assert cli.main(["list"]) == 0
    assert "test double" in capsys.readouterr().out
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0  # a demo replaces the previous demo's runs
    assert (tmp_path / "fake" / "figures" / "squares.png").exists()


# ------------------------------------------------------------------------------------- bad input: exit 2
@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "fake", "--out", "{d}/x", "--steps", "0"], "steps=0 must be a positive integer"),
        (["run", "fake", "--out", ""], "--out is empty"),
        (["run", "fake", "--out", "{d}/file.txt"], "exists and is not a directory"),
        (["run", "fake", "--out", "/proc/optiscope-test"], "cannot create the run directory"),
        (["plot", "{d}/none"], "none does not exist; give a run directory (written by `optiscope run` or"),
        (["plot", "{d}/file.txt"], "file.txt is a file, not a directory; give a run directory"),
        (["plot", "{d}"], "results.json does not exist"),
        (["run", "fake", "--out", "{d}/u", "--crash", "user"], "the data for this run is missing"),
        (["run", "fake", "--out", "{d}/x", "--steps", "1.5"], "run fake: argument --steps: invalid int value: '1.5'"),
        (["run", "fake", "--out", "{d}/x", "--steps", "-1e3"], "run fake: argument --steps: invalid int value: '-1e3'"),
        (["run", "fake", "--out", "{d}/x", "--bogus", "3"], "unrecognized arguments: --bogus 3; valid options: "),
        (["run", "fake", "--out", "{d}/x", "--resume", "--force"], "--force replaces it; give one of them"),
        (["report"], "report: the following arguments are required: DIR"),
    ],
)
def test_bad_input_is_one_line_on_stderr(fake, tmp_path, capsys, argv, message):
    (tmp_path / "file.txt").write_text("not a directory")
    assert cli.main([a.format(d=tmp_path) for a in argv]) == cli.EXIT_BAD_INPUT
    lines = errors(capsys)
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_unknown_experiment_lists_valid_ones(fake, capsys, command):
    assert cli.main([command, "nope", "--out", "x", "--optimizers", "sgd"]) == cli.EXIT_BAD_INPUT
    valid = "fake" if command == "run" else "none declares an objective"  # a sweep needs one to tune for
    assert errors(capsys) == [f"optiscope: {command}: unknown experiment 'nope'; valid: {valid}"]


def test_a_sweep_lists_only_experiments_that_declare_an_objective(capsys):
    assert cli.main(["sweep", "nope", "--out", "x", "--optimizers", "sgd"]) == cli.EXIT_BAD_INPUT
    valid = errors(capsys)[0].split("valid: ")[1].split(", ")
    assert "lm" in valid and "entropy" not in valid and "edge-of-stability" not in valid


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        (json.dumps({"experiment": "lm-old"}), "is not the result of an optiscope experiment (experiment 'lm-old')"),
        (json.dumps({"experiment": "fake", "squares": [1.0]}), "shape of a 'fake' result: results.names is missing"),
        (json.dumps({"experiment": "fake", "squares": "x", "names": []}), "results.squares is a str, not a list"),
    ],
)
def test_plot_of_a_foreign_or_malformed_results_file(fake, tmp_path, capsys, content, message):
    (tmp_path / "results.json").write_text(content)
    assert cli.main(["plot", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    lines = errors(capsys)
    assert len(lines) == 1 and message in lines[0] and str(tmp_path / "results.json") in lines[0]


def test_errors_are_not_wrapped_when_piped(tmp_path):
    """Through a pipe (no terminal) an error stays one line, however long."""
    long_name = tmp_path / ("d" * 150)
    (long_name).write_text("a file")
    done = subprocess.run(
        [sys.executable, "-m", "optiscope", "run", "rare-tokens", "--out", str(long_name)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and str(long_name) in done.stderr


# --------------------------------------------------------------------------------- the run directory
def test_a_used_directory_is_refused_then_replaced_with_force(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3"]) == 0
    capsys.readouterr()
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "4"]) == cli.EXIT_BAD_INPUT
    message = errors(capsys)[0]
    assert "already holds a run of 'fake'" in message and "--resume" in message and "--force" in message
    assert runs.read_json(out / "results.json")["squares"] == [0.0, 0.5, 2.0]  # untouched
    (out / "figures" / "stale.png").write_bytes(b"an old figure")
    (out / "notes.txt").write_text("the user's own file")
    (out / "figures" / "notes.md").write_text("the user's notes beside the figures")
    (out / "tensorboard" / "old").mkdir(parents=True)
    (out / "tensorboard" / "old" / "events.out.tfevents.1.host").write_bytes(b"old events")
    from optiscope import report

    page = report.default_out([out])  # where `optiscope report DIR` puts the page of this run
    page.write_text("<html>the replaced run's page</html>")
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "4", "--force"]) == 0
    assert not page.exists()  # it would show the replaced run as the new one
    assert runs.read_json(out / "results.json")["squares"] == [0.0, 0.5, 2.0, 4.5]
    assert not (out / "figures" / "stale.png").exists()  # everything the run wrote was cleared
    assert not (out / "tensorboard" / "old").exists()  # with the folders it left empty
    assert (out / "notes.txt").read_text() == "the user's own file"  # and nothing else
    assert (out / "figures" / "notes.md").read_text() == "the user's notes beside the figures"


def test_resume_where_there_is_no_run_starts_one_and_says_so(fake, tmp_path, capsys):
    out = tmp_path / "typo"
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3", "--resume"]) == 0
    assert f"--resume: {out} holds no run yet; starting one" in capsys.readouterr().out
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3", "--resume"]) == 0
    assert "holds no run yet" not in capsys.readouterr().out
    # where the directory is refused, nothing is started, and --resume does not say it starts a run
    for refused in (tmp_path / "a-file", tmp_path / "foreign", tmp_path / "orphans"):
        if refused.name == "a-file":
            refused.write_text("x")
        elif refused.name == "foreign":
            refused.mkdir()
            (refused / "config.json").write_text('{"model_type": "gpt2"}')
        else:  # a run's files without the config.json that says which run they belong to
            (refused / "figures").mkdir(parents=True)
            (refused / "figures" / "loss.png").write_bytes(b"png")
        assert cli.main(["run", "fake", "--out", str(refused), "--resume"]) == cli.EXIT_BAD_INPUT
        assert "holds no run yet" not in capsys.readouterr().out


def test_resume_of_a_sweep_directory_holding_only_trials_is_refused_without_saying_it_starts(
    sweepable, tmp_path, capsys
):
    out = tmp_path / "s"
    (out / "trials" / "sgd@0.1#0").mkdir(parents=True)
    (out / "trials" / "sgd@0.1#0" / "results.json").write_text("{}")
    argv = ["sweep", "synthetic", "--optimizers", "sgd", "--out", str(out), "--resume"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    said = capsys.readouterr()
    assert "holds no run yet" not in said.out
    assert "holds trials but no config.json" in said.err


def test_resume_compares_only_options_that_change_results(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3"]) == 0
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3", "--quiet", "--resume"]) == 0
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "3", "--resume"]) == 0
    capsys.readouterr()
    # config.json says how the run started and what each resume changed, not the last resume's values as the run's
    stored = runs.read_json(out / "config.json")
    assert stored["config"]["quiet"] is False and stored["resumed_with"] == [{"quiet": True}, {}]
    assert cli.main(["run", "fake", "--out", str(out), "--steps", "5", "--resume"]) == cli.EXIT_BAD_INPUT
    assert "--steps 3 → 5" in errors(capsys)[0]
    assert runs.read_json(out / "config.json")["config"]["steps"] == 3  # still describes the run it holds


@pytest.mark.parametrize("wrote", [False, True])
def test_a_refused_resume_leaves_config_json_as_it_was(fake, tmp_path, capsys, monkeypatch, wrote):
    """A resume refused before it writes anything (its checkpoint damaged) did not happen: config.json is byte
    for byte what it was, with no resumed_with entry for it; one refused after it wrote (a full disk mid-run)
    did happen, and keeps its entry."""
    import fake_experiment

    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out)]) == 0
    before = (out / "config.json").read_bytes()

    def refused(config, run_dir):
        if wrote:
            runs.append_jsonl(run_dir / runs.METRICS, {"step": 1})
        raise runs.CheckpointError(f"{run_dir}/checkpoints/x.pt is damaged; delete it")

    monkeypatch.setattr(fake_experiment, "run", refused)
    assert cli.main(["run", "fake", "--out", str(out), "--quiet", "--resume"]) == cli.EXIT_BAD_INPUT
    assert "is damaged" in errors(capsys)[-1]
    if wrote:
        assert runs.read_json(out / "config.json")["resumed_with"] == [{"quiet": True}]
    else:
        assert (out / "config.json").read_bytes() == before


def test_a_run_that_fails_before_it_starts_leaves_no_config(fake, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--crash", "user"]) == cli.EXIT_BAD_INPUT
    assert not (out / "config.json").exists()
    assert cli.main(["run", "fake", "--out", str(out)]) == 0  # the directory is free for a real run


def test_a_second_process_on_the_same_directory_is_refused(fake, tmp_path, capsys):
    out = tmp_path / "run"
    with runs.open_run(out, "fake", {"steps": 3}):  # a run in progress holds the lock
        code = subprocess.run(
            [sys.executable, "-m", "optiscope", "run", "rare-tokens", "--out", str(out), "--force"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert code.returncode == 2 and "in use by another optiscope run (pid" in code.stderr
    assert runs.read_json(out / "config.json")["config"] == {"steps": 3}  # the first run's files are intact


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_figures_are_drawn_while_the_directory_is_still_held(fake, sweepable, monkeypatch, tmp_path, command):
    """A --force run into the same directory must not take it while the figures of the run before are drawn
    (its config.json beside their figures): the lock is held until they are."""
    out, held = tmp_path / "run", []
    draw_run = figures.draw_run
    monkeypatch.setattr(figures, "draw_run", lambda d, r=None: held.append(runs.in_progress(d)) or draw_run(d, r))
    argv = ["run", "fake"] if command == "run" else ["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "0.1"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert held == [True]
    assert not runs.in_progress(out)  # and let go after


# ------------------------------------------------------------------------------------ internal errors
def test_an_internal_error_is_exit_1_with_the_traceback_saved(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--crash", "internal"]) == cli.EXIT_INTERNAL
    lines = errors(capsys)
    assert len(lines) == 1 and "internal error: ValueError: an internal computation failed" in lines[0]
    log = (out / "error.log").read_text()
    assert "Traceback" in log and "an internal computation failed" in log


def test_memory_that_runs_out_is_said_as_such_not_as_a_bug(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--crash", "memory"]) == cli.EXIT_INTERNAL
    lines = errors(capsys)
    assert len(lines) == 1 and lines[0].startswith("optiscope: out of memory: ") and "bug" not in lines[0]
    # it ran out at the start, before it had written anything
    assert f"nothing is saved in {out}" in lines[0] and "Traceback" in (out / "error.log").read_text()


def test_a_figure_that_fails_keeps_the_results(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out), "--names", "boom"]) == cli.EXIT_INTERNAL
    assert runs.read_json(out / "results.json")["names"] == ["boom"]
    line = errors(capsys)[0]
    assert "squares.png could not be drawn" in line and "results are saved" in line
    assert "this figure cannot be drawn" in (out / "error.log").read_text()


def test_plot_into_a_folder_that_cannot_be_written_is_said_as_such_not_as_a_bug(fake, tmp_path, capsys, monkeypatch):
    """A read-only folder (or a full disk) refuses the PNG: exit 2 naming the file and the system's reason, and no
    word of a traceback in an error.log. (As root no permission stops a write, so the write itself fails here.)"""
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out)]) == 0
    capsys.readouterr()

    def read_only(path, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(style, "atomic_write_bytes", read_only)
    assert cli.main(["plot", str(out)]) == cli.EXIT_BAD_INPUT
    line = errors(capsys)[0]
    assert f"cannot write the figure {out / 'figures'}" in line and "Read-only file system" in line
    assert "error.log" not in line and "internal error" not in line


def test_a_figure_that_fails_in_a_folder_that_cannot_hold_the_log_names_where_the_log_went(
    fake, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    assert cli.main(["run", "fake", "--out", str(out)]) == 0
    capsys.readouterr()
    elsewhere = tmp_path / "tmp"
    elsewhere.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
    (out / "error.log").mkdir()  # the run's own log cannot be opened for appending
    (out / "results.json").write_text(json.dumps({**runs.read_json(out / "results.json"), "names": ["boom"]}))
    assert cli.main(["plot", str(out)]) == cli.EXIT_INTERNAL
    line = errors(capsys)[-1]
    assert f"traceback in {elsewhere / 'error.log'}" in line
    assert "this figure cannot be drawn" in (elsewhere / "error.log").read_text()


def test_demo_refuses_a_run_directory(fake, tmp_path, capsys):
    cli.main(["run", "fake", "--out", str(tmp_path)])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(["demo", "--out", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert "holds a run itself" in errors(capsys)[0] and sorted(p.name for p in tmp_path.iterdir()) == before


def test_demo_refuses_a_file_before_it_runs_anything(tmp_path, capsys):
    """It had run the first experiment's set-up and then named --out FILE/rare-tokens as the directory at fault."""
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["demo", "--out", str(tmp_path / "notes.txt")]) == cli.EXIT_BAD_INPUT
    (line,) = errors(capsys)
    assert line == (
        f"optiscope: demo: error: --out {tmp_path / 'notes.txt'} exists and is not a directory; the demo writes a "
        "run per experiment into a folder (default runs/demo): choose another --out"
    )


def test_demo_says_each_experiment_and_ends_with_the_report_address(fake, tmp_path, capsys, monkeypatch):
    """Into a file or a pipe (capsys is no terminal): each experiment as it starts and as it ends (status, seconds,
    its figures counted, not listed), the last line the report's absolute file:// address (a relative --out)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "activation_hint", lambda: None)  # a shell that has activated it (the whole demo's test)
    assert cli.main(["demo", "--out", "demo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "experiment 1/1: fake"
    assert re.fullmatch(r"experiment 1/1: fake ok, \d+ s; 1 figure in demo/fake/figures", out[1]), out
    assert out[-1] == "report: " + (tmp_path / "demo" / "report.html").as_uri()
    assert out[-1].startswith(f"report: file://{tmp_path}")  # absolute, though --out was relative
    assert len(out) == 3 and not any("figure:" in line for line in out)
    assert (tmp_path / "demo" / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_demo_says_a_run_that_diverged_and_a_report_it_could_not_write(fake, tmp_path, capsys, monkeypatch):
    import fake_experiment

    monkeypatch.setattr(fake_experiment, "QUICK", {"steps": 2, "diverge": True})
    monkeypatch.setattr(cli, "report_module", lambda: (_ for _ in ()).throw(cli.UserError("the report needs Bokeh")))
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0  # as before: a diverged demo run is shown, not a failure
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"experiment 1/1: fake diverged, \d+ s; 1 figure in .*", out[1]), out
    assert out[-1] == "report: not written (the report needs Bokeh)"


def test_demo_says_which_experiment_still_runs_when_the_log_is_silent(fake, tmp_path, capsys, monkeypatch):
    """A run that prints nothing (no progress bar into a pipe) is said to be running every SILENT_AT_MOST seconds."""
    import fake_experiment

    run = fake_experiment.run

    def silent(config, run_dir):  # until the demo has said it is still running (or 20 s: the test then fails)
        for _ in range(2000):
            if "still running" in capsys.readouterr().out:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("nothing said in 20 s")
        return run(config, run_dir)

    monkeypatch.setattr(fake_experiment, "run", silent)
    monkeypatch.setattr(cli, "SILENT_AT_MOST", 0.05)
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("report: file://")


def test_a_demo_experiment_that_fails_is_said_before_the_error(fake, tmp_path, capsys, monkeypatch):
    import fake_experiment

    monkeypatch.setattr(fake_experiment, "QUICK", {"steps": 2, "crash": "internal"})
    assert cli.main(["demo", "--out", str(tmp_path)]) == cli.EXIT_INTERNAL
    captured = capsys.readouterr()
    assert re.fullmatch(r"experiment 1/1: fake error, \d+ s", captured.out.splitlines()[-1])
    assert "internal error: ValueError: an internal computation failed" in captured.err


def test_demo_workers_run_experiments_side_by_side_and_say_each(tmp_path, capsys, monkeypatch):
    """With --workers 2 the experiments run in two other processes (which know the experiments this one does):
    both start before either ends, each is said as it ends, the report follows; --workers 0 is refused."""
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"fake": "fake_experiment", "again": "fake_experiment"})
    monkeypatch.setattr(figures, "DRAWERS", {"fake": "fake_experiment", "again": "fake_experiment"})
    monkeypatch.setattr(cli, "activation_hint", lambda: None)
    assert cli.main(["demo", "--out", str(tmp_path), "--workers", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["experiment 1/2: fake", "experiment 2/2: again"], out
    for k, name in enumerate(["fake", "again"], 1):
        ended = rf"experiment {k}/2: {name} ok, \d+ s; 1 figure in {tmp_path}/{name}/figures"
        assert sum(bool(re.fullmatch(ended, line)) for line in out[2:4]) == 1, out
    assert out[-1] == "report: " + (tmp_path / "report.html").as_uri() and len(out) == 5
    assert runs.read_json(tmp_path / "again" / "results.json")["squares"] == [0.0, 0.5]
    assert cli.main(["demo", "--out", str(tmp_path), "--workers", "0"]) == cli.EXIT_BAD_INPUT
    assert errors(capsys) == ["optiscope: demo: error: --workers 0 must be an integer >= 1 (experiments run at a time)"]


def test_a_demo_experiment_that_fails_in_a_worker_is_said_and_stops_the_demo(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"fake": "fake_experiment", "crash": "fake_crash"})
    monkeypatch.setattr(figures, "DRAWERS", {"fake": "fake_experiment", "crash": "fake_crash"})
    assert cli.main(["demo", "--out", str(tmp_path), "--workers", "2"]) == cli.EXIT_INTERNAL
    captured = capsys.readouterr()
    assert any(re.fullmatch(r"experiment 2/2: crash error, \d+ s", line) for line in captured.out.splitlines())
    assert "internal error: ValueError: an internal computation failed" in captured.err
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_demo_stopped_side_by_side_says_so_and_leaves_no_process(tmp_path, signal_name):
    """Ctrl-C (to the terminal's whole process group) or SIGTERM (to the demo alone, as a job scheduler sends it)
    while two experiments train in workers: exit 130, one line, no worker's traceback, no process left."""
    import signal

    command = [sys.executable, "-m", "optiscope", "demo", "--out", str(tmp_path / "demo"), "--workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # SIGINT's default action whatever this test was started with: a test run in the background by a
    # non-interactive shell (a CI runner) inherits SIGINT ignored, which Python, and so the demo, then keeps
    demo = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    started = [demo.stdout.readline() for _ in range(2)]  # both slow ones, each said as its worker starts it
    assert [line.split(": ")[1].split()[0] for line in started] == ["lm", "adder"], started
    time.sleep(3)  # inside their training loops
    if signal_name == "SIGINT":
        os.killpg(demo.pid, signal.SIGINT)
    else:
        demo.send_signal(signal.SIGTERM)
    out, err = demo.communicate(timeout=60)
    assert demo.returncode == cli.EXIT_INTERRUPTED, err
    assert err.splitlines() == [
        "optiscope: interrupted: the demo stopped; `optiscope demo` runs it again from the start"
    ]
    deadline = time.monotonic() + 10  # the workers are gone too (multiprocessing's tracker follows the demo out)
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.killpg(demo.pid, 0)
            time.sleep(0.1)


def test_the_whole_demo_into_a_pipe_says_where_it_is_and_ends_with_the_report_address(demo):
    """``make demo > demo.log``: every quick experiment said as it starts and ends, how to put the command on the PATH
    of a shell that has not activated the environment, the last line the page's address; the page is within its
    5 MB (the run: ``tests/conftest.py``'s ``demo``)."""
    out = demo.stdout
    names = list(experiments.EXPERIMENTS)
    for k, name in enumerate(names, 1):
        started = next(
            i for i, line in enumerate(out) if re.fullmatch(rf"experiment {k}/{len(names)}: {name}( \(.*\))?", line)
        )
        ended = rf"experiment {k}/{len(names)}: {name} (ok|diverged), \d+ s; \d+ figures? in .*/{name}/figures"
        assert any(re.fullmatch(ended, line) for line in out[started + 1 :]), (name, out)
    assert out[-1] == "report: " + (demo.out / "report.html").as_uri()
    if min(cli.usable_cpus(), len(names)) > 1:  # side by side (make demo's default), the slow ones start first
        assert [line.split(": ")[1].split()[0] for line in out[:2]] == ["lm", "adder"], out
    for slow in ("lm", "adder"):  # the slow ones are said to be, as they start
        k = names.index(slow) + 1
        said = f"experiment {k}/{len(names)}: {slow} (one of the demo's two slow ones: about a minute of one core)"
        assert said in out
    if sys.prefix != sys.base_prefix:  # a virtual environment, as make demo's .venv
        activate, here = Path(sys.prefix, "bin", "activate"), Path.cwd().resolve()  # said relative to the folder
        if activate.resolve().is_relative_to(here):  # it was run from (the checkout), where it is inside it
            activate = activate.resolve().relative_to(here)
        assert out[-2] == (
            f"optiscope is installed in {activate.parent.parent}: source {activate} puts the optiscope command on your "
            "PATH"
        )
    assert not any(line.startswith("  figure:") for line in out)
    assert (demo.out / "report.html").stat().st_size <= 5_000_000


# ----------------------------------------------------------------------------------------------- sweep
@pytest.fixture
def sweepable(fake, monkeypatch):
    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    monkeypatch.setitem(figures.DRAWERS, "sweep", "optiscope.figures.sweep")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "synthetic", "--optimizers", "sgd,nope"], "unknown optimizer 'nope'"),
        (["sweep", "fake", "--optimizers", "sgd"], "experiment 'fake' declares no objective to tune for"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "0"], "--seeds 0 must be an integer from 1 to"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "10" * 10], f"--seeds {'10' * 10} must be an"),
        (["sweep", "synthetic", "--optimizers", "sgd,"], "--optimizers 'sgd,' has an empty name between commas"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--objective="], "--objective ''; synthetic declares"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "0.1,abc"], "--lrs '0.1,abc': give auto or"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "-1"], "--lrs '-1': give auto or"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "-0.1,0.2"], "--lrs '-0.1,0.2': give auto or"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "-1e-3"], "--lrs '-1e-3': give auto or"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--sgd-optimum", "-inf"], "sgd_optimum=-inf must be > 0"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "0.1,0.1"], "names a learning rate twice"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--sgd-optimum", "-1"], "sgd_optimum=-1.0 must be > 0"),
        (["sweep", "synthetic", "--optimizers", "sgd@0.1", "--lrs", "0.1,0.2"], "@η says where an automatic grid"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--lrs", "1e-3,,2e-3"], "--lrs '1e-3,,2e-3': give auto or"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--address", "foo"], "give it with --backend ray"),
        (["sweep", "synthetic", "--optimizers", "sgd", "--seed", "5"], "unrecognized arguments: --seed 5"),
    ],
)
def test_sweep_bad_input_is_one_line(sweepable, tmp_path, capsys, argv, message):
    assert cli.main([*argv, "--out", str(tmp_path / "s")]) == cli.EXIT_BAD_INPUT
    lines = errors(capsys)
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "s" / "config.json").exists()


def test_sweep_writes_results_and_figures_and_plot_redraws_them(sweepable, tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["sweep", "synthetic", "--optimizers", "sgd,adam", "--seeds", "2", "--out", str(out)]
    assert cli.main([*argv, "--adam-optimum", "0.1", "--diverge-above", "0.2"]) == 0
    printed = capsys.readouterr().out
    assert "sgd: tuned lr 0.01" in printed and "adam: tuned lr 0.1" in printed
    # seeds 0, 1 chose 0.01 (objective 0 there + seed/1000); the fresh seeds 2, 3 give 0.0025 ± 0.00071
    assert "sgd: tuned lr 0.01, fresh seeds 0.0025 ± 0.00071 (95% CI" in printed
    assert "the 2 tuning seed(s) that chose it: 0.0005" in printed
    results = runs.read_json(out / "results.json")
    assert runs.read_json(out / results["trials"][0]["dir"] / "config.json")["config"]["adam_optimum"] == 0.1
    figures_drawn = sorted(p.name for p in (out / "figures").iterdir())
    assert figures_drawn == ["sweep_sensitivity.png", "sweep_steps_to_target.png", "sweep_tuned.png"]
    for path in (out / "figures").iterdir():
        path.unlink()
    assert cli.main(["plot", str(out)]) == 0
    assert len(list((out / "figures").iterdir())) == 3
    assert cli.read_results(out / results["trials"][0]["dir"])["experiment"] == "synthetic"  # a trial is a run


def test_ctrl_c_while_starting_is_one_line_and_exit_130(monkeypatch, capsys):
    """The ``optiscope`` command imports torch before it can parse anything: a Ctrl-C then is one line."""
    import sys
    import types

    from optiscope import __main__ as entry

    class Interrupted(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "optiscope.cli", Interrupted("optiscope.cli"))
    assert entry.main() == cli.EXIT_INTERRUPTED
    assert errors(capsys) == ["optiscope: interrupted while starting; nothing was run"]


def test_a_sweep_without_a_tuned_lr_says_so(sweepable, tmp_path, capsys):
    """Every trial diverges: no optimizer gets a tuned lr, and the summary says which, rather than nothing."""
    out = tmp_path / "s"
    argv = ["sweep", "synthetic", "--optimizers", "sgd,adam", "--seeds", "2", "--out", str(out), "--lrs", "0.1,1"]
    assert cli.main([*argv, "--diverge-above", "0.05"]) == cli.EXIT_DIVERGED
    printed = capsys.readouterr().out
    assert "no tuned lr for sgd: of its 2 trials 2 diverged" in printed and "no tuned lr for adam:" in printed


def test_a_tuned_lr_at_an_end_of_a_fixed_grid_is_said(sweepable, tmp_path, capsys):
    """sgd's optimum 0.01 lies below the fixed grid 0.03, 0.1, 0.3: its tuned lr is the grid's lowest."""
    argv = ["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "2", "--lrs", "0.03,0.1,0.3"]
    assert cli.main([*argv, "--out", str(tmp_path / "s")]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if ": tuned lr " in line]
    assert "sgd: tuned lr 0.03 (at an end of the grid that was run: its optimum may lie beyond)" in line
    assert runs.read_json(tmp_path / "s" / "results.json")["optimizers"]["sgd"]["interior"] is False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bad_input_that_the_trials_meet_stops_the_sweep_as_bad_input(sweepable, tmp_path, capsys, workers):
    """It had been recorded as a crash of every trial, the grid walking on, then 'every trial diverged or
    crashed' (exit 3) and a directory that needed --force."""
    out = tmp_path / "s"
    argv = ["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "1", "--text", "nofile.txt", "--workers", workers]
    assert cli.main([*argv, "--out", str(out)]) == cli.EXIT_BAD_INPUT
    (line,) = errors(capsys)
    assert line.startswith("optiscope: sweep: error: corpus file nofile.txt does not exist (trial sgd@")
    # nothing of a run is left (at most a folder that a trial running beside the refused one made, emptied)
    assert not runs.holds_run(out) and all(p.name == runs.LOCK for p in out.rglob("*") if p.is_file())
    assert cli.main([*argv[:-4], "--out", str(out)]) == 0  # the corrected command needs no --force


def test_a_sweep_names_its_crashed_trials_and_resume_runs_them_again(sweepable, tmp_path, capsys):
    argv = ["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "1", "--crash-at", "0.00316"]
    argv += ["--out", str(tmp_path / "s")]
    for resume in ([], ["--resume"]):  # a crash that recurs is recorded again
        assert cli.main(argv + resume) == 0
        printed = capsys.readouterr().out
        assert "sgd@0.00316 seed 0: inf crashed (RuntimeError: trial at 0.00316 crashed on purpose)" in printed
        assert "1 trial(s) crashed and count as the worst value (sgd@0.00316 seed 0;" in printed
        assert "with --resume runs them again" in printed
    assert "sgd@0.01 seed 0" not in printed  # a trial that finished is not run again


def test_a_sweep_whose_every_trial_missed_its_target_exits_3_and_says_so(sweepable, tmp_path, capsys):
    """No trial reached the target (each finished with the worst value): no tuned η, status "failed", exit 3. It
    had exited 0 with status "ok"."""
    argv = ["sweep", "synthetic", "--optimizers", "sgd", "--seeds", "1", "--lrs", "0.01,0.1", "--miss-below", "1"]
    assert cli.main([*argv, "--out", str(tmp_path / "s")]) == cli.EXIT_DIVERGED
    assert "no trial gave a value (each diverged, crashed or missed its target)" in capsys.readouterr().out
    results = runs.read_json(tmp_path / "s" / "results.json")
    assert results["status"] == "failed" and results["optimizers"]["sgd"]["tuned_lr"] is None


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41234: "
            "Connection reset by peer"
        ),
        torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp: remote process exited"),
    ],
    ids=["gloo", "nccl"],
)
def test_a_failed_peer_process_is_not_called_a_bug(fake, monkeypatch, tmp_path, capsys, error):
    """What gloo raises (the text seen when a torchrun rank was killed) and torch's DistError: another process
    went away, the run's checkpoint is intact, and --resume continues it."""

    def run(args, console):
        if wrote:
            runs.append_jsonl(tmp_path / "r" / runs.METRICS, {"step": 1, "loss": 2.0})
        raise error

    monkeypatch.setattr(cli, "cmd_run", run)
    for wrote in (True, False):  # resuming is offered where the job had saved something
        shutil.rmtree(tmp_path / "r", ignore_errors=True)
        assert cli.main(["run", "fake", "--out", str(tmp_path / "r")]) == cli.EXIT_INTERNAL
        (line,) = errors(capsys)
        assert line.startswith(f"optiscope: the distributed job failed: {type(error).__name__}: ") and "bug" not in line
        assert ("--resume continues from the last checkpoint" in line) is wrote
        assert ("finished work is saved in" in line) is wrote


@pytest.mark.parametrize(
    "argv, refused",
    [
        (["run", "rare-tokens", "--quick"], "run rare-tokens: started by torchrun (2 processes), but only `optiscope"),
        (["sweep", "lm", "--optimizers", "adamw"], "(a sweep runs trials side by side with --workers or --backend"),
        (["report", "runs"], "report: started by torchrun (2 processes)"),
        (["run", "lm", "--quick"], None),
    ],
)
def test_under_torchrun_only_a_data_parallel_experiment_runs(monkeypatch, tmp_path, argv, refused):
    """Anything else would run whole in every process, each writing the same files."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = cli.make_parser().parse_args([*argv, *(["--out", str(tmp_path / "r")] if argv[0] != "report" else [])])
    said = cli.torchrun_refusal(args)
    assert said is None if refused is None else refused in said
    if refused is not None:
        assert "start `optiscope " in said and "without torchrun" in said
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.torchrun_refusal(args) is None


def test_a_refused_torchrun_job_is_one_line_from_rank_0(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, said in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["run", "rare-tokens", "--out", str(tmp_path / "r")]) == cli.EXIT_BAD_INPUT
        assert len(errors(capsys)) == said
    assert not (tmp_path / "r").exists()


def test_an_interrupted_torchrun_job_says_so_once(fake, monkeypatch, tmp_path, capsys):
    def interrupted(args, console):
        raise KeyboardInterrupt("fake stopped at step 3; its checkpoint resumes it exactly")

    monkeypatch.setattr(cli, "cmd_run", interrupted)
    for rank, said in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["run", "fake", "--out", str(tmp_path / "r")]) == cli.EXIT_INTERRUPTED
        assert len(errors(capsys)) == said


@pytest.mark.parametrize("wrote", [True, False])
def test_an_interrupted_run_says_whether_it_saved_anything(fake, monkeypatch, tmp_path, capsys, wrote):
    """'finished work is saved' only where there is some: a run stopped before it wrote anything says so."""
    out = tmp_path / "r"

    def interrupted(args, console):
        if wrote:
            runs.atomic_write_json(out / "results.json", {"experiment": "fake", "squares": [0.0]})
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_run", interrupted)
    assert cli.main(["run", "fake", "--out", str(out)]) == cli.EXIT_INTERRUPTED
    said = "finished work is saved in" if wrote else "it stopped before any work finished: nothing is saved in"
    assert errors(capsys) == [f"optiscope: interrupted: {said} {out}"]


def test_a_sweep_with_one_seed_prints_no_interval(sweepable, tmp_path, capsys):
    out = tmp_path / "s"
    assert cli.main(["sweep", "synthetic", "--optimizers", "sgd,adam", "--seeds", "1", "--out", str(out)]) == 0
    summary = [line for line in capsys.readouterr().out.splitlines() if ": tuned lr " in line]
    assert len(summary) == 2 and all("(one seed: no spread, no interval)" in line for line in summary)


def test_a_real_ctrl_c_in_the_middle_of_the_imports_is_one_line():
    """SIGINT while NumPy is being imported (under torch's import): noted, acted on once everything is
    imported; raised there it could be swallowed and leave NumPy half-imported (a RecursionError later)."""
    script = """
import builtins, os, signal, sys
real, sent = builtins.__import__, []
def importing(name, *args, **kwargs):
    if name == "numpy" and not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)
builtins.__import__ = importing
from optiscope.__main__ import main
sys.exit(main())
"""
    done = subprocess.run([sys.executable, "-c", script, "list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == cli.EXIT_INTERRUPTED, done.stderr
    assert done.stderr.strip().splitlines() == ["optiscope: interrupted while starting; nothing was run"]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["run", "nonesuch"], "run: unknown experiment 'nonesuch'"),
        (["run", "lm", "--quick", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["run", "lm", "--quick", "--optimizers", "nonesuch"], "run: error: --optimizers: unknown optimizer"),
    ],
    ids=["unknown-experiment", "unknown-option", "bad-setting"],
)
def test_bad_input_to_a_torchrun_job_is_one_line_per_machine(monkeypatch, tmp_path, capsys, argv, said):
    """Every process of a torchrun job meets the same bad command line or setting: the first process on the
    machine says it, the others exit 2 as well, silently."""
    argv = [*argv, "--out", str(tmp_path / "r")]
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert cli.main(argv) == cli.EXIT_BAD_INPUT
        lines = errors(capsys)
        assert len(lines) == (rank == "0") and all(said in line for line in lines)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("joined", [False, True], ids=["before-joining", "after-joining"])
def test_a_bad_setting_met_after_the_processes_joined_is_said_by_each_that_meets_it(
    fake, monkeypatch, tmp_path, capsys, joined
):
    """After the processes joined, a ConfigError may be one process's alone (its own download of the corpus
    failed): the second process on the machine says it too. Before, it is the command line's: only the first."""
    from optiscope.errors import ConfigError

    group = []

    def failing(args, console):
        group.extend([joined])  # the processes join (or not) inside the command
        raise ConfigError("could not download http://example.invalid/corpus.txt: HTTP Error 503")

    monkeypatch.setattr(cli, "cmd_run", failing)
    monkeypatch.setattr(experiments, "data_parallel", lambda: ["fake"])  # not refused under torchrun
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: any(group))
    monkeypatch.setattr(cli, "leave_job", lambda: None)  # the job joined here is pretend: nothing to free
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.main(["run", "fake", "--out", str(tmp_path / "r")]) == cli.EXIT_BAD_INPUT
    assert group == [joined] and len(errors(capsys)) == joined


def test_a_resumed_runs_seconds_are_said_to_be_since_the_resume(fake, tmp_path):
    """The seconds of an interrupted session are not kept: the page must not pass the last session's off as
    the run's."""
    from optiscope.report import read_run
    from optiscope.report.page import status_line

    out = tmp_path / "r"
    assert cli.main(["run", "fake", "--out", str(out)]) == 0
    assert " s since it was resumed" not in status_line(read_run(out))
    assert cli.main(["run", "fake", "--out", str(out), "--resume"]) == 0
    assert runs.read_json(out / "results.json")["resumed"] is True
    assert " s since it was resumed." in status_line(read_run(out))


@pytest.mark.parametrize(
    ("values", "mean", "std", "interval", "said"),
    [
        ([0.5, 0.7, 0.6], 0.6, 0.1, [0.35, 0.85], "0.6 ± 0.1 (95% CI 0.35 … 0.85)"),
        ([0.5], 0.5, 0.0, [math.nan, math.nan], "0.5 (one seed: no spread, no interval)"),
        ([0.5, math.inf, 0.6], math.inf, math.nan, [math.nan, math.nan], "a fresh seed diverged or crashed"),
        ([-math.inf, 0.5, 0.6], -math.inf, math.nan, [math.nan, math.nan], "a fresh seed diverged or crashed"),
        ([2000, 2000, 2000], 2000, 0.0, [math.nan, math.nan], "2000 ± 0 (no interval: the seed noise is not"),
    ],
    ids=["interval", "one-seed", "failed-seed", "failed-seed-maximised", "tied-by-chance"],
)
def test_fresh_seeds_are_said_without_inf_or_nan(values, mean, std, interval, said):
    """What the console says of an optimizer's fresh seeds: an interval where results.json has one, else why not
    in words (it printed "inf ± nan (95% CI nan … nan)" for a seed that diverged)."""
    text = cli.fresh_seeds({"values": values, "mean": mean, "std": std, "interval": interval})
    assert text.startswith(said), text
    assert not re.search(r"\b(nan|inf)\b", text), text


@pytest.mark.parametrize("crash, code", [("", 0), ("user", 2), ("internal", 1), ("interrupt", 130)])
def test_every_command_ends_by_leaving_its_distributed_job(fake, tmp_path, monkeypatch, capsys, crash, code):
    """A torchrun job's process group is freed as the command line's last act on every path (finished, refused,
    failed, interrupted), after the error's traceback is gone: a group left alive lets a gloo thread meet the
    interpreter's shutdown and abort a finished process (train.distributed)."""
    import fake_experiment

    left = []
    monkeypatch.setattr(cli, "leave_job", lambda: left.append(sys.exc_info()[1]))
    if crash == "interrupt":
        monkeypatch.setattr(fake_experiment, "run", lambda config, run_dir: (_ for _ in ()).throw(KeyboardInterrupt))
        crash = ""
    argv = ["run", "fake", "--out", str(tmp_path / "run")] + (["--crash", crash] if crash else [])
    assert cli.main(argv) == code
    assert left == [None]  # called once, with no exception in flight
