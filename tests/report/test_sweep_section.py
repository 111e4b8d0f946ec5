"""A sweep's directory on the page: its headline numbers are results.json's, its tuning charts are drawn."""

from __future__ import annotations

import html
import json
import math
import re

from optiscope import cli, experiments
from optiscope.sweep import SweepConfig, run_sweep

from .browser import load
from .test_page import CHARTS, HEADLINES, walk


def test_a_sweep_gets_its_section(page, tmp_path, monkeypatch):
    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    options = {"sgd_optimum": 1e-3, "adam_optimum": 0.1}
    run_sweep(SweepConfig(experiment="synthetic", optimizers=("sgd", "adam"), seeds=2, options=options), tmp_path / "s")
    assert cli.main(["report", str(tmp_path / "s")]) == 0
    load(page, (tmp_path / "s" / "report.html").as_uri())
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    (article,) = page.evaluate(HEADLINES)
    paths = [json.loads(path) for path, _, _ in article["numbers"]]
    assert ["optimizers", "adam", "tuned_lr"] in paths and ["neighbours", 0, "difference"] in paths
    assert ["optimizers", "adam", "tuning_mean"] in paths
    for path, value, text in article["numbers"]:
        expected = walk(results, json.loads(path))
        assert float(value) == expected and math.isclose(
            float(text.replace(",", "")), expected, rel_tol=1e-3, abs_tol=1e-12
        )
    titles = {c["title"]: c for c in page.evaluate(CHARTS)}
    tuning = titles["Objective against learning rate (tuning)"]
    assert sum(tuning["points"]) == sum(len(t["sensitivity"]) for t in results["optimizers"].values())
    every = titles["Every trial"]  # the tuning seeds at every η and the fresh seeds at the tuned η
    assert sum(every["points"]) == len(results["trials"])


def test_sweeps_of_two_objectives_get_charts_apart_and_one_without_results_is_no_error(tmp_path, monkeypatch):
    """A sweep still running (no results.json yet) had crashed the report; a sweep of another experiment (another
    objective) had been drawn on the first one's charts, under its label."""
    import shutil

    from optiscope.report import page, read_run

    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    config = SweepConfig("synthetic", ("sgd",), seeds=1, lrs=(1e-3, 1e-2), options={"sgd_optimum": 1e-3})
    run_sweep(config, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    other = json.loads((tmp_path / "b" / "results.json").read_text())
    other["swept"], other["objective"]["description"] = "other", "another measure"
    (tmp_path / "b" / "results.json").write_text(json.dumps(other))
    shutil.copytree(tmp_path / "a", tmp_path / "running")
    (tmp_path / "running" / "results.json").unlink()
    dirs = [tmp_path / name for name in ("a", "b", "running")]
    assert cli.main(["report", *map(str, dirs), "--out", str(tmp_path / "page.html")]) == 0
    text = page.build([read_run(d) for d in dirs]).html
    for swept in ("synthetic (the known function of η)", "other (another measure)"):
        assert f"<h4>{html.escape(swept)}: Objective against learning rate (tuning)</h4>" in text
        assert f"<h4>{html.escape(swept)}: Every trial</h4>" in text
    assert "<h4>Objective against learning rate (tuning)</h4>" not in text


def test_the_status_counts_crashed_trials_apart_from_diverged_ones(tmp_path, monkeypatch):
    """A sweep with one trial that crashed and one that diverged: the status line says one of each (the crashed
    one had been left out, the diverged one counted). The oracle: the trials' recorded statuses."""
    from optiscope.report import read_run
    from optiscope.report.page import status_line

    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    options = {"sgd_optimum": 0.01, "crash_at": 0.001, "diverge_above": 0.05}
    config = SweepConfig("synthetic", ("sgd",), seeds=1, lrs=(0.001, 0.01, 0.1), options=options)
    results = run_sweep(config, tmp_path / "s")
    ended = [t["status"] for t in results["trials"]]
    assert ended.count("crashed") == ended.count("diverged") == 1  # the case at hand
    line = html.unescape(re.sub("<[^>]+>", "", status_line(read_run(tmp_path / "s"))))
    n = len(ended)
    assert f"Status: ok, 1 of {n} trials diverged; 1 of {n} trials crashed" in line, line
