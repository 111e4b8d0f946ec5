"""Bad input: directories that are not finished optiscope runs give a page that says what it could not
show (exit 0), a path that is not a directory a one-line error (exit 2); never a traceback."""

from __future__ import annotations

import html
import json
import shutil

import pytest

from optiscope import cli, runs
from optiscope.report import read_run, series
from optiscope.report.page import status_line
from optiscope.report.rundir import read_metrics

from .browser import load
from .monitored import diverging_run, monitored_dir


def test_a_half_written_last_line_is_left_out_and_said(tmp_path):
    records = [{"run": "a", "step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = tmp_path / "metrics.jsonl"
    path.write_text(text + "not json\n" + json.dumps(records[0])[:17])
    problems = []
    assert read_metrics(path, problems) == records
    assert any("last line is incomplete" in p for p in problems)
    assert any("1 line that is not a monitor record" in p for p in problems)


def test_unknown_experiment_and_missing_results_are_named(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "nope", "status": "ok"}))
    run = read_run(tmp_path)
    assert run.results is None and run.experiment is None
    assert any("'nope'" in p and "known: " in p for p in run.problems)
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "config.json").write_text(json.dumps({"experiment": "lm", "config": {}}))
    assert any("results.json is missing" in p for p in read_run(stopped).problems)
    empty = tmp_path / "empty"
    empty.mkdir()  # nothing of a run: said once, not as a run that stopped
    assert read_run(empty).problems == [
        f"{empty} holds no config.json, results.json or metrics.jsonl of an optiscope run"
    ]


def test_a_run_going_on_is_told_from_one_that_stopped_before_its_results(tmp_path):
    """Both have records and no results.json; the one whose process still holds the directory is running (its
    missing results are no problem), the other stopped: interrupted or failed, and resumable."""
    out = tmp_path / "run"
    with runs.open_run(out, "lm", {"steps": 10}):
        runs.append_jsonl(out / "metrics.jsonl", {"run": "adam", "step": 3, "loss": 2.0})
        going = read_run(out)
        assert going.in_progress and not any("results.json" in p for p in going.problems)
        assert 'Status: <span class="status-run">running</span>; last logged: adam at step 3.' in status_line(going)
    stopped = read_run(out)
    assert not stopped.in_progress
    assert any("interrupted or failed" in p and "--resume" in p for p in stopped.problems)
    assert "stopped before its results (interrupted or failed)</span>; last logged: adam at step 3" in status_line(
        stopped
    )


def test_a_run_whose_results_json_cannot_be_read_is_not_said_to_have_stopped_before_it(tmp_path):
    """Its results.json is there (of the wrong shape): the status names it, not an interruption."""
    out = tmp_path / "run"
    with runs.open_run(out, "lm", {"steps": 10}):
        runs.append_jsonl(out / "metrics.jsonl", {"run": "adam", "step": 3, "loss": 2.0})
        runs.atomic_write_json(out / "results.json", {"experiment": "lm", "runs": []})
    line = status_line(read_run(out))
    assert "its results.json could not be read (see below)</span>; last logged: adam at step 3" in line, line
    assert "interrupted" not in line


def test_bad_directories_give_a_page_that_says_what_it_could_not_show(page, tiny_runs, tmp_path, capsys):
    empty, unknown, partial, shapeless = (tmp_path / n for n in ("empty", "unknown", "partial", "shapeless"))
    for d in (empty, unknown, partial, shapeless):
        d.mkdir()
    (unknown / "results.json").write_text(json.dumps({"experiment": "nope"}))
    (shapeless / "results.json").write_text(json.dumps({"experiment": "lm", "runs": 3}))
    shutil.copy(tiny_runs["lm"] / "config.json", partial)
    lines = (tiny_runs["lm"] / "metrics.jsonl").read_text().splitlines(keepends=True)
    (partial / "metrics.jsonl").write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    out = tmp_path / "bad.html"
    dirs = [str(d) for d in (empty, unknown, partial, shapeless)]
    assert cli.main(["report", *dirs, "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    load(page, out.as_uri())
    text = page.locator("body").inner_text()
    assert "results.json is missing" in text
    assert "names experiment 'nope'" in text
    assert "last line is incomplete" in text
    assert "does not have the shape of a 'lm' result" in text
    assert "Traceback" not in text and page.errors == [] and page.external == []
    assert page.locator(".chart").count() >= 3  # the partial run's metrics are drawn


def test_a_path_that_is_not_a_directory_is_one_line_exit_2_saying_what_it_is(tmp_path, capsys):
    """A path that does not exist had been called "not a run directory"; it is said not to exist, a file to be one."""
    (tmp_path / "notes.txt").write_text("mine")
    for path, what in (("nowhere", "does not exist"), ("notes.txt", "is a file, not a directory")):
        assert cli.main(["report", str(tmp_path / path)]) == cli.EXIT_BAD_INPUT
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"optiscope: report: error: {tmp_path / path} {what}; give run directories (written by `optiscope run`, "
            "`optiscope sweep` or a Monitor)"
        )


@pytest.mark.parametrize("content", [None, '{"model_type": "gpt2"}', "{broken"])
def test_a_directory_without_a_run_is_one_line_exit_2_and_left_as_it_was(tmp_path, capsys, content):
    """Empty, or holding only another program's (or a damaged) config.json: no page about nothing is written."""
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(["report", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path} holds no optiscope run" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_out_that_cannot_hold_the_page_is_one_line_exit_2(tiny_runs, tmp_path, capsys):
    """--out naming a directory, or a path under a file, is bad input, and nothing is written into the run."""
    run = tiny_runs["lm"]
    before = sorted(p.name for p in run.iterdir())
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    cases = (
        (run, "is a directory; give the page's file name"),
        (a_file / "x.html", f"({a_file} is a file, not a folder)"),
    )
    for out, said in cases:
        assert cli.main(["report", str(run), "--out", str(out)]) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and str(out) in err[0], err
    assert sorted(p.name for p in run.iterdir()) == before  # no error.log, no page


def test_the_page_gives_the_curvature_diagnosis_of_a_divergence(tmp_path):
    """A monitored run that diverges with curvature measured: the page says what its record says."""
    record = diverging_run(tmp_path / "metrics.jsonl", nan_step=5, curvature_every=1)
    finding = record["curvature_diagnosis"].removeprefix(f"diverged at step {record['step']}; ")
    assert "threshold" in finding
    out = tmp_path / "page.html"
    assert cli.main(["report", str(tmp_path), "--out", str(out)]) == 0
    assert html.escape(finding) in out.read_text()


def test_runs_told_apart_by_their_context_are_separate_runs(tmp_path):
    """Two Monitors that share "run" and differ in another context field: two runs, each its own records."""
    contexts = [{"run": "sgd", "eta": 0.1}, {"run": "sgd", "eta": 0.01}]
    losses = monitored_dir(tmp_path, contexts)
    runs_found = series.by_run(read_run(tmp_path).metrics, unnamed=tmp_path.name)
    assert list(runs_found) == ["sgd eta=0.1", "sgd eta=0.01"]
    for context, label in zip(contexts, runs_found, strict=True):
        assert [r["loss"] for r in runs_found[label]] == losses[json.dumps(context)]


def test_a_foreign_config_json_leaves_a_monitors_directory_monitored(tmp_path):
    """🤗's save_model writes the model's config.json next to the callback's metrics.jsonl: still a Monitor's
    directory (its charts), and that config.json is not shown as the run's; an empty metrics.jsonl is said."""
    monitored_dir(tmp_path, [{"eta": 0.1}])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    run = read_run(tmp_path)
    assert run.monitored and run.config is None and run.metrics and not run.problems
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    assert any("holds no record yet" in p for p in read_run(empty).problems)


def test_records_of_the_wrong_shape_are_skipped_and_said(tmp_path, capsys):
    good = {"step": 2, "loss": 1.0, "params": {"w": {"u_over_w": 0.1}}}
    bad = [
        {"step": 1, "params": None},
        {"step": 1, "params": [1, 2]},
        {"step": 1, "params": {"a": 5}},
        {"step": 4, "diverged": True, "exploded_first": 5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*bad, good]))
    problems = []
    assert read_metrics(tmp_path / "metrics.jsonl", problems) == [good]
    assert problems == ["metrics.jsonl: 4 lines that are not monitor records were skipped"]
    assert cli.main(["report", str(tmp_path)]) == 0 and capsys.readouterr().err == ""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [bad[0], good]))
    problems = []
    read_metrics(tmp_path / "metrics.jsonl", problems)
    assert problems == ["metrics.jsonl: 1 line that is not a monitor record was skipped"]  # had said "line(s)"


def test_several_directories_without_a_run_are_named_in_one_plain_line(tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    assert cli.main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "r.html")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"none of {tmp_path / 'a'}, {tmp_path / 'b'} holds an optiscope run (no results.json" in line


def test_an_internal_error_of_the_report_is_logged_where_the_page_would_go(tmp_path, monkeypatch, capsys):
    """Not into the first of the run directories it shows."""
    from optiscope import report

    def broken(dirs, out):
        raise ValueError("a bug")

    monkeypatch.setattr(report, "write", broken)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    assert cli.main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == cli.EXIT_INTERNAL
    assert (tmp_path / "error.log").is_file() and not (tmp_path / "a" / "error.log").exists()
    assert f"traceback in {tmp_path / 'error.log'}" in capsys.readouterr().err


def test_an_internal_error_of_one_runs_report_is_not_logged_in_that_run(tmp_path, monkeypatch):
    """One directory's page goes into it; an error.log there would read as the run's own failure."""
    import tempfile

    from optiscope import report

    def broken(dirs, out):
        raise ValueError("a bug")

    runs.append_jsonl(tmp_path / "a" / runs.METRICS, {"step": 1, "loss": 2.0})  # a monitored run
    monkeypatch.setattr(report, "write", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert cli.main(["report", str(tmp_path / "a")]) == cli.EXIT_INTERNAL
    assert not (tmp_path / "a" / "error.log").exists() and (tmp_path / "tmp" / "error.log").is_file()
