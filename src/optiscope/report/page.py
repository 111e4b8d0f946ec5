"""One HTML page for a set of run directories: a section per experiment, everything inlined.

The page needs no network: BokehJS is inlined from the installed ``bokeh`` package (only the parts the
page uses), figures are ``data:`` URIs, and nothing refers to another host. Under ``--watch`` the only
requests go back to the local server the page came from.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bokeh.document import Document
from bokeh.embed import components
from bokeh.models import Tabs
from bokeh.resources import Resources

from .. import __version__, runs, sweep
from ..monitor.divergence import curvature_finding
from . import headlines, series
from .charts import Sources
from .rundir import RunDir
from .sections import metrics_charts, named, section_charts

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1c1c1c; background: #fbfbf9;
       margin: 0 auto; max-width: 1200px; padding: 1em 2em 4em; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-top: 1em; }
h3 { margin-bottom: 0.3em; } .muted { color: #6b6b6b; font-size: 0.9em; }
.headline li { margin: 0.2em 0; } .num { font-weight: 600; font-variant-numeric: tabular-nums; }
.problems { background: #fdf0ee; border-left: 4px solid #b03a2e; padding: 0.5em 1em 0.5em 2em; }
.status-ok { color: #2e8b57; font-weight: 600; } .status-bad { color: #b03a2e; font-weight: 600; }
.status-run { color: #1f5fa8; font-weight: 600; }
.chart { margin: 0.6em 0 1.6em; } .chart h4 { margin: 0 0 0.2em; font-size: 0.95em; }
figure { margin: 0.5em 0 1.5em; } figure img { max-width: 100%; border: 1px solid #e3e3df; }
pre { background: #f1f1ee; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""

WATCH_SCRIPT = """<script>
// --watch: reload when the server's page would show other charts (a new run, results.json written);
// the charts themselves refresh through their AjaxDataSource.
(function () {
  const shown = %s;
  setInterval(function () {
    fetch("/signature").then(r => r.text()).then(s => { if (s !== shown) location.reload(); }).catch(() => {});
  }, %d);
})();
</script>"""


@dataclass
class Page:
    """One built report page: its HTML, and what ``--watch`` serves beside it.

    Args:
        html: the whole self-contained page, ``<!DOCTYPE html>`` to ``</html>``.
        live: the data of each chart drawn from ``metrics.jsonl``, by its key (the chart's name and its line's
            label): what ``--watch`` serves at ``/data?key=…`` for the open page to poll.
        signature: a short hash of what an open page cannot follow by polling its data (the directories'
            results, runs and divergences, the charts drawn, each live chart's columns); ``--watch`` serves it at
            ``/signature``, and the page reloads itself when it changes.

    Examples:
        >>> import json
        >>> from pathlib import Path
        >>> from optiscope import report
        >>> run = Path("runs/mine")
        >>> run.mkdir(parents=True)
        >>> with open(run / "metrics.jsonl", "w") as f:  # as a Monitor's JSONLSink writes it
        ...     for step in range(1, 6):
        ...         print(json.dumps({"step": step, "loss": 1 / step}), file=f)
        >>> page = report.build([report.read_run(run)])
        >>> page.html.startswith("<!DOCTYPE html>"), list(page.live), len(page.signature)  # its run is "mine"
        (True, ['e0-loss/mine'], 16)
    """

    html: str
    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    signature: str = ""


def signature(run_dirs: Sequence[RunDir], titles: Sequence[str], live: dict[str, dict[str, Any]]) -> str:
    """What an open page cannot follow by polling its data: each directory's results, runs (with the parameters
    each names: a heatmap's rows and their hover names are fixed when the page is made) and divergences, the
    charts drawn and the columns of each chart's live data (a chart that appears mid-run, e.g. the sharpness
    at the first measurement, changes them) — not the lengths of the series."""
    shape = [
        [
            (
                str(r.path),
                r.results is not None,
                r.in_progress,
                {
                    label: series.parameter_names(rows)
                    for label, rows in sorted(series.by_run(r.metrics, unnamed=r.name).items())
                },
                divergence_lines(r),
            )
            for r in run_dirs
        ],
        list(titles),
        {key: sorted(data) for key, data in live.items()},
    ]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


def build(run_dirs: Sequence[RunDir], watch: bool = False, interval_ms: int = 1000) -> Page:
    """Build the report page of the directories read: a section per experiment, everything inlined.

    Each section has, per directory, its status, the monitor's divergence diagnosis, the experiment's headline
    sentences (every number read from ``results.json``), its ``config.json``, its figures, and Bokeh charts in
    which a reader can zoom, read values on hover and hide a run by clicking its legend entry.

    Args:
        run_dirs: what ``read_run`` read, one per directory; those of one experiment share each chart.
        watch: make the charts drawn from ``metrics.jsonl`` poll the server the page came from (``--watch``), and
            the page reload itself when its ``signature`` changes.
        interval_ms: how often a watched chart polls for its data, in milliseconds (the page checks its signature
            every 2 × ``interval_ms``).

    Returns:
        The [`Page`][optiscope.report.Page].

    Examples:
        >>> import json
        >>> from pathlib import Path
        >>> from optiscope import report
        >>> run = Path("runs/mine")
        >>> run.mkdir(parents=True)
        >>> with open(run / "metrics.jsonl", "w") as f:  # as a Monitor's JSONLSink writes it
        ...     for step in range(1, 6):
        ...         print(json.dumps({"step": step, "loss": 1 / step}), file=f)
        >>> page = report.build([report.read_run(run)])
        >>> "Monitored training" in page.html, "/data?key=" in page.html
        (True, False)
        >>> "/data?key=" in report.build([report.read_run(run)], watch=True).html  # its charts poll the server
        True

    Notes:
        The page needs no network: BokehJS is inlined from the installed ``bokeh`` package (only the parts the
        page uses: the widgets bundle only when a chart has tabs), figures are ``data:`` URIs, and nothing refers
        to another host; under ``watch`` the only requests go back to the local server the page came from. A
        directory that a ``Monitor`` wrote without an experiment is "monitored training", with the monitor's
        charts; one with nothing optiscope can show gets a section saying so. Long runs are thinned to at most
        400 points per line and 200 steps per heatmap row, line values kept to 5 significant digits.
    """
    sources = Sources(watch=watch, interval_ms=interval_ms)
    body: list[str] = []
    models: dict[str, Any] = {}
    titles: list[str] = []
    groups: dict[str | None, list[RunDir]] = {}
    for run in run_dirs:
        groups.setdefault(section_of(run), []).append(run)
    for k, (experiment, group) in enumerate(groups.items()):
        body.append(section_head(experiment, group))
        for name, _, run in named(group):
            body.append(run_summary(run, name))
        if experiment is not None:
            found = (
                metrics_charts(sources, group, f"e{k}")
                if experiment == MONITORED
                else section_charts(sources, experiment, group, f"e{k}")
            )
            for j, (title, chart) in enumerate((t, c) for t, c in found if c is not None):
                models[f"c{k}_{j}"] = chart
                titles.append(title)
                body.append(f'<div class="chart"><h4>{html.escape(title)}</h4>@@{f"c{k}_{j}"}@@</div>')
            for run in group:
                body.append(figures_of(run))
        body.append("</section>")
    script, divs = embed(models)
    text = "\n".join(body)
    for name, div in divs.items():
        text = text.replace(f"@@{name}@@", div)
    sig = signature(run_dirs, titles, sources.live)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<link rel="icon" href="data:,">',  # no favicon request: the page asks nothing of any host
        f"<title>optiscope report: {html.escape(', '.join(r.name for r in run_dirs))}</title>",
        f"<style>{STYLE}</style>",
        resources(models.values()) if models else "",
        "</head><body>",
        "<h1>optiscope report</h1>",
        f'<p class="muted">{len(run_dirs)} run director{"y" if len(run_dirs) == 1 else "ies"}; optiscope '
        f"{__version__}; written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        f"{'; watching: charts from metrics.jsonl refresh as the run goes' if watch else ''}.</p>",
        text,
        script,
        WATCH_SCRIPT % (json.dumps(sig), 2 * interval_ms) if watch else "",
        "</body></html>",
    ]
    return Page("\n".join(parts), sources.live, sig)


def embed(models: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Bokeh's script and one div per chart. The charts become the roots of one document first, with its
    model index frozen: adding roots one by one re-indexes every model each time (minutes for 40 charts)."""
    if not models:
        return "", {}
    doc = Document()
    with doc.models.freeze():
        for model in models.values():
            doc.add_root(model)
    return components(models)


def resources(models: Any) -> str:
    """BokehJS inlined: the core, and the widgets bundle only when a chart has tabs."""
    names = ["bokeh"] + (["bokeh-widgets"] if any(isinstance(m, Tabs) for m in models) else [])
    inline = Resources(mode="inline", components=names)
    return inline.render_css() + inline.render_js()


MONITORED = "monitored training"  # the section of directories a Monitor wrote without an experiment


def section_of(run: RunDir) -> str | None:
    """The run's experiment; ``MONITORED`` for a Monitor's directory with records; None when nothing in it
    can be shown."""
    if run.experiment is not None:
        return run.experiment
    return MONITORED if run.monitored and run.metrics else None


def section_head(experiment: str | None, group: list[RunDir]) -> str:
    if experiment is None:
        return "<section><h2>Directories with nothing optiscope can show</h2>"
    if experiment == MONITORED:
        return (
            '<section><h2>Monitored training</h2><p class="muted">metrics.jsonl written by a Monitor\'s sinks or '
            "the 🤗 Trainer / Lightning callbacks: the monitor's charts, no experiment results</p>"
        )
    describe = SUMMARIES.get(experiment)
    summary = describe(group) if describe is not None else sweep.results_contract(experiment)[1]
    return f'<section><h2>{html.escape(experiment)}</h2><p class="muted">{html.escape(summary)}</p>'


def edge_of_stability_summary(group: list[RunDir]) -> str:
    """What the section's runs measured against what: each optimizer's sharpness and threshold as its results
    name them (``threshold_label``), not a fixed list of optimizers the runs may not have."""
    judged: dict[str, None] = {}
    for run in group:
        for r in (run.results or {}).get("runs", []):
            measure = "λ₁(P⁻¹H)" if r.get("preconditioned") else "λ₁(H)"
            judged[f"{r.get('optimizer')} {measure} against {r.get('threshold_label')}"] = None
    head = "Full-batch training: each run's (preconditioned) sharpness against its optimizer's stability threshold"
    return f"{head}{': ' + ', '.join(judged) if judged else ''} (edge of stability)"


#: Section descriptions drawn from the section's own results where the experiment's fixed summary would name
#: things its runs may not have.
SUMMARIES = {"edge-of-stability": edge_of_stability_summary}


def run_summary(run: RunDir, name: str) -> str:
    """The directory's article: its path, status, divergences, problems, headlines and config; ``name`` is what its
    charts call it (and a run without a ``run`` label in its records)."""
    out = [f"<article><h3>{html.escape(str(run.path))}</h3>", status_line(run, name)]
    out += divergence_lines(run, name)
    if run.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in run.problems)
        out.append(f'<div class="problems"><strong>Not shown:</strong><ul>{items}</ul></div>')
    sentences = headlines.headlines(run.results) if run.results else []
    if sentences:
        out.append('<ul class="headline">' + "".join(f"<li>{sentence_html(s)}</li>" for s in sentences) + "</ul>")
    if run.config is not None:
        config = html.escape(json.dumps(run.config, indent=1))
        out.append(f"<details><summary>config.json</summary><pre>{config}</pre></details>")
    return "\n".join(out) + "</article>"


def sentence_html(sentence: headlines.Sentence) -> str:
    parts = []
    for piece in sentence:
        if isinstance(piece, headlines.Number):
            parts.append(
                f'<span class="num" data-path="{html.escape(json.dumps(list(piece.path)))}" '
                f'data-value="{html.escape(repr(piece.value))}">{html.escape(piece.text)}</span>'
            )
        else:
            parts.append(html.escape(piece))
    return "".join(parts)


def status_line(run: RunDir, name: str | None = None) -> str:
    """The directory's status; a run without a ``run`` label in its records is called ``name`` (None: the
    directory's name)."""
    runs_seen = series.by_run(run.metrics, unnamed=run.name if name is None else name)
    progress = ", ".join(f"{label} at step {rows[-1]['step']}" for label, rows in runs_seen.items())
    if run.results is not None:
        status = str(run.results.get("status", "ok"))
        css = "status-ok" if status == "ok" else "status-bad"
        diverged, crashed, total, what = failed_runs(run.results)
        some = [f"{n} of {total} {what} {how}" for n, how in ((diverged, "diverged"), (crashed, "crashed")) if n]
        some = f', <span class="status-bad">{html.escape("; ".join(some))}</span>' if status == "ok" and some else ""
        took = run.results.get("wall_seconds")
        extra = f" in {took:.0f} s" if isinstance(took, int | float) else ""
        extra += " since it was resumed" if extra and run.results.get("resumed") else ""
        quick = " (--quick)" if run.results.get("quick") else ""
        return f'<p>Status: <span class="{css}">{html.escape(status)}</span>{some}{quick}{extra}.</p>'
    if runs_seen and section_of(run) == MONITORED:
        return f"<p>Status: monitored; last logged: {html.escape(progress)}.</p>"
    logged = f"; last logged: {html.escape(progress)}" if runs_seen else "; nothing logged yet"
    if run.in_progress:
        return f'<p>Status: <span class="status-run">running</span>{logged}.</p>'
    if (run.path / runs.RESULTS).is_file():  # there, but not readable as this experiment's: the problems say why
        unread = f"its {runs.RESULTS} could not be read (see below)"
        return f'<p>Status: <span class="status-bad">{unread}</span>{logged}.</p>'
    if runs_seen:
        stopped = "stopped before its results (interrupted or failed)"
        return f'<p>Status: <span class="status-bad">{stopped}</span>{logged}.</p>'
    return '<p>Status: <span class="status-bad">no results</span>.</p>'


def failed_runs(results: dict[str, Any]) -> tuple[int, int, int, str]:
    """(how many diverged, how many crashed, of how many, of what) among the runs a results.json records: an
    experiment's status is "ok" unless every run failed, so the ones that did are counted here. Runs are ``runs``
    (a list or a dict; lm, adder, edge-of-stability) with their ``status``, ``optimizers`` with their
    ``diverged_at`` (rare-tokens), each η of each optimizer on each surface (landscapes), or a sweep's ``trials``
    (the only runs that crash and are recorded)."""
    entries, what = [], "runs"
    if isinstance(results.get("runs"), list | dict):
        runs_ = results["runs"]
        entries = [r.get("status") for r in (runs_.values() if isinstance(runs_, dict) else runs_)]
    elif isinstance(results.get("trials"), list):
        entries, what = [t.get("status") for t in results["trials"]], "trials"
    elif isinstance(results.get("surfaces"), dict):
        entries, what = _landscape_points(results["surfaces"]), "runs of the η grids (one per optimizer, surface and η)"
    elif isinstance(results.get("optimizers"), dict):
        opts = [o for o in results["optimizers"].values() if isinstance(o, dict)]
        entries = ["diverged" if o.get("diverged_at") is not None else "ok" for o in opts]
    return entries.count("diverged"), entries.count("crashed"), len(entries), what


def _landscape_points(surfaces: dict[str, Any]) -> list[str]:
    """How each η tried by each optimizer on each surface ended: "diverged" or "ok"."""
    runs_ = [opt for surface in surfaces.values() for opt in surface.get("runs", {}).values()]
    points = [point for opt in runs_ for point in opt.get("grid", [])]
    return ["diverged" if point.get("diverged_at") is not None else "ok" for point in points]


def divergence_lines(run: RunDir, name: str | None = None) -> list[str]:
    """The monitor's divergence diagnosis of each run that diverged: where, why, which parameters first; a run
    without a ``run`` label in its records is called ``name`` (None: the directory's name)."""
    name = run.name if name is None else name
    found = [r for r in run.metrics if r.get("diverged")]
    if not found and run.results is not None and isinstance(run.results.get("divergence"), dict):
        found = [d for d in run.results["divergence"].values() if isinstance(d, dict)]
    out = []
    for d in found:
        first = ", ".join(
            f"{e.get('name')} (from step {e.get('first_step')})"
            for e in d.get("exploded_first", [])
            if isinstance(e, dict) and e.get("first_step") is not None
        )
        label = series.run_label(d, unnamed=name)
        text = f"{label} diverged at step {d.get('step')}: {d.get('reason', 'no reason recorded')}"
        text += f"; u/w grew first in {first}" if first else ""
        finding = curvature_finding(d)
        text += f"; {finding}" if finding else ""
        out.append(f'<p class="status-bad">{html.escape(text)}.</p>')
    return out


def figures_of(run: RunDir) -> str:
    out = []
    for path in run.figures:
        try:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
        except OSError:
            continue  # a figure being redrawn right now; the next page has it
        name = html.escape(f"{run.name}/figures/{path.name}")
        out.append(
            f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
            f'<figcaption class="muted">{name}</figcaption></figure>'
        )
    if not out:
        return ""
    return f"<details open><summary>figures of {html.escape(run.name)}</summary>{''.join(out)}</details>"
