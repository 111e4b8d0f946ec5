"""``optiscope report --watch``: the served page's charts gain the points appended to metrics.jsonl."""

from __future__ import annotations

import json
import shutil
import urllib.request

from optiscope import cli
from optiscope.report import watch

from .browser import load
from .monitored import diverging_run

POINTS = "() => Bokeh.documents[0].get_model_by_name('e0-loss').renderers[0].data_source.get_length()"


def test_the_loss_chart_grows_as_records_are_appended(page, tiny_runs, tmp_path):
    lines = (tiny_runs["lm"] / "metrics.jsonl").read_text().splitlines(keepends=True)
    first_run = [line for line in lines if (r := json.loads(line)).get("run") == "sgd" and "diverged" not in r]
    assert len(first_run) >= 4
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(tiny_runs["lm"] / "config.json", live)
    (live / "metrics.jsonl").write_text("".join(first_run[:2]))
    server = watch.serve([live], interval_ms=250)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        page.bad = []
        page.on("response", lambda r: page.bad.append((r.url, r.status)) if r.status != 200 else None)
        load(page, url, idle=False)
        assert page.evaluate(POINTS) == 2
        with (live / "metrics.jsonl").open("a") as f:
            f.write("".join(first_run[2:]))
        page.wait_for_function(f"() => ({POINTS})() === {len(first_run)}", timeout=20_000)
        assert page.errors == [] and page.external == [], (page.errors, page.bad)
    finally:
        server.shutdown()


def test_ctrl_c_stops_the_server_and_exits_0(tiny_runs, monkeypatch, capsys):
    served = []

    def interrupt(seconds):
        line = capsys.readouterr().out.strip().splitlines()[0]
        url = line.split(": ", 1)[1].split(" ")[0]
        with urllib.request.urlopen(url, timeout=30) as response:  # served on the loopback address
            served.append((url, response.status, b"optiscope report" in response.read()))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", interrupt)
    assert cli.main(["report", "--watch", str(tiny_runs["lm"])]) == 0
    assert served and served[0][0].startswith("http://127.0.0.1:") and served[0][1:] == (200, True)


def test_watch_takes_one_directory(tiny_runs, capsys):
    assert cli.main(["report", "--watch", str(tiny_runs["lm"]), str(tiny_runs["adder"])]) == cli.EXIT_BAD_INPUT
    assert "exactly one run directory" in capsys.readouterr().err


def monitored_records(tmp_path):
    """A Monitor's metrics.jsonl lines: steps 1–7 with the sharpness first measured at step 4, then a divergence
    record at step 7."""
    path = tmp_path / "source.jsonl"
    diverging_run(path, nan_step=7, curvature_every=4)
    lines = path.read_text().splitlines(keepends=True)
    assert ["sharpness" in line for line in lines[:6]] == [False] * 3 + [True] + [False] * 2
    assert json.loads(lines[7]).get("diverged") is True  # after step 7's own record
    return lines


TITLES = "() => [...document.querySelectorAll('.chart h4')].map(h => h.textContent)"


def test_a_chart_or_a_divergence_that_appears_mid_run_reloads_the_page(page, tmp_path):
    """The sharpness charts appear at the first measurement: the open page reloads (its charts' data would
    otherwise be polled under keys that now name other charts' columns); so it does at the divergence."""
    lines = monitored_records(tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    (live / "metrics.jsonl").write_text("".join(lines[:3]))
    server = watch.serve([live], interval_ms=250)
    try:
        load(page, f"http://127.0.0.1:{server.server_address[1]}/", idle=False)
        assert not any("Sharpness" in t for t in page.evaluate(TITLES))
        with (live / "metrics.jsonl").open("a") as f:
            f.write("".join(lines[3:6]))
        page.wait_for_function(f"() => ({TITLES})().some(t => t.includes('Sharpness'))", timeout=20_000)
        with (live / "metrics.jsonl").open("a") as f:
            f.write("".join(lines[6:]))
        page.wait_for_function("() => document.body.innerText.includes('diverged at step 7')", timeout=20_000)
        assert page.errors == [] and page.external == [], page.errors
    finally:
        server.shutdown()


def test_a_run_that_logs_at_every_step_gets_the_page_rebuilt_at_most_once_per_four_builds_time(tmp_path, monkeypatch):
    """A run logging at every step changes metrics.jsonl before each poll: the page (a rebuild taking 1 s on the
    fake clock here) is rebuilt at most once per 4 s of polls, the polls in between answered as last built;
    oracle: the builds counted, and the clock."""
    clock = [0.0]
    builds = []

    def slow_build(run_dirs, watch, interval_ms):
        builds.append(clock[0])
        clock[0] += 1.0
        return watch_page(len(builds))

    def watch_page(n):
        return watch.Page(f"page {n}", {}, str(n))

    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(watch, "build", slow_build)
    live = tmp_path / "live"
    live.mkdir()
    report = watch.Report([live])
    served = []
    for i in range(40):  # a poll every 0.25 s for 10 s, the file changed before each
        (live / "metrics.jsonl").write_text("x" * (i + 1))
        served.append(report.page().html)
        clock[0] += 0.25
    gaps = [b - a for a, b in zip(builds, builds[1:], strict=False)]
    assert len(builds) >= 2 and all(gap >= 5.0 for gap in gaps), builds  # 1 s building, 4 s resting
    assert served[-1] == f"page {len(builds)}"  # each poll got the page as last built


def test_a_parameter_that_appears_mid_run_reloads_the_page(tmp_path):
    """The u/w heatmap's rows and their hover names are fixed when the page is made: a parameter first recorded
    later (a layer unfrozen mid-run) must change the page's signature, or the live rows and names drift apart."""
    import json

    from optiscope.report import read_run
    from optiscope.report.page import signature

    def record(step, names):
        params = {name: {"g": 1.0, "w": 1.0, "u": 0.1, "u_over_w": 0.1} for name in names}
        return json.dumps({"step": step, "loss": 1.0, "params": params}) + "\n"

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(record(1, ["a"]))
    before = signature([read_run(tmp_path)], [], {})
    with metrics.open("a") as f:
        f.write(record(2, ["a"]))
    assert signature([read_run(tmp_path)], [], {}) == before  # a longer series alone does not reload
    with metrics.open("a") as f:
        f.write(record(3, ["a", "b"]))
    assert signature([read_run(tmp_path)], [], {}) != before
