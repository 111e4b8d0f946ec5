"""Bad input: directories that are not finished optiscope runs give a page that says what it could not
show (exit 0), a path that is not a directory a one-line error (exit 2); never a traceback."""

from __future__ import annotations

import json
import shutil

from optiscope import cli
from optiscope.report import read_metrics, read_run

from .browser import load


def test_a_half_written_last_line_is_left_out_and_said(tmp_path):
    records = [{"run": "a", "step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = tmp_path / "metrics.jsonl"
    path.write_text(text + "not json\n" + json.dumps(records[0])[:17])
    problems = []
    assert read_metrics(path, problems) == records
    assert any("last line is incomplete" in p for p in problems)
    assert any("1 line(s)" in p for p in problems)


def test_unknown_experiment_and_missing_results_are_named(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "nope", "status": "ok"}))
    run = read_run(tmp_path)
    assert run.results is None and run.experiment is None
    assert any("'nope'" in p and "known: " in p for p in run.problems)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert any("results.json is missing" in p for p in read_run(empty).problems)


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


def test_a_path_that_is_not_a_directory_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nowhere")]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a run directory" in err[0]
