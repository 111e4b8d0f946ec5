"""One HTML page for a set of run directories: a table of contents, a summary, a section per experiment,
everything inlined.

The page needs no network: BokehJS is inlined from the installed ``bokeh`` package (its core bundle), figures
are ``data:`` URIs opened at full size by the page's own few lines of script, and nothing refers to another
host. Under ``--watch`` the only requests go back to the local server the page came from.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bokeh.document import Document
from bokeh.embed import components
from bokeh.models import GlyphRenderer
from bokeh.resources import Resources
from PIL import Image, features

from .. import __version__, runs, sweep
from ..monitor.divergence import curvature_finding
from . import headlines, series
from .charts import Sources, share_log_labels
from .rundir import RunDir
from .sections import metrics_charts, named, per_run, section_charts

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1c1c1c; background: #fbfbf9;
       margin: 0; line-height: 1.45; }
.layout { max-width: 1500px; margin: 0 auto; padding: 0 1.5em 4em; }
main { min-width: 0; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-top: 1em; }
h3 { margin-bottom: 0.3em; } .muted { color: #6b6b6b; font-size: 0.9em; }
.headline li { margin: 0.2em 0; } .num { font-weight: 600; font-variant-numeric: tabular-nums; }
.problems { background: #fdf0ee; border-left: 4px solid #b03a2e; padding: 0.5em 1em 0.5em 2em; }
.status-ok { color: #2e8b57; font-weight: 600; } .status-bad { color: #b03a2e; font-weight: 600; }
.status-run { color: #1f5fa8; font-weight: 600; } .finding { color: #4a4a4a; }
.chart { margin: 0.6em 0 1.6em; } .chart h4 { margin: 0 0 0.2em; font-size: 0.95em; }
details { margin: 0.4em 0; } summary { cursor: pointer; color: #1f5fa8; }
figure { margin: 0.5em 0 1.5em; } figure img { max-width: 100%; border: 1px solid #e3e3df; cursor: zoom-in; }
pre { background: #f1f1ee; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
a { color: #1f5fa8; } section, article, .chart, [id] { scroll-margin-top: 0.5em; }
#toc { font-size: 0.9em; background: #f3f3ef; border: 1px solid #e3e3df; padding: 0.4em 0.8em; margin: 1em 0; }
#toc ol { padding-left: 0.9em; margin: 0.2em 0; list-style: none; } #toc > details > ol { padding-left: 0.2em; }
#toc li { margin: 0.1em 0; } #toc a { text-decoration: none; }
#lightbox { position: fixed; inset: 0; background: rgba(20, 20, 20, 0.85); overflow: auto; z-index: 10;
            cursor: zoom-out; }
#lightbox img { display: block; margin: 1em auto; max-width: none; background: #fff; }
@media (min-width: 1100px) {
  .layout { display: grid; grid-template-columns: 230px minmax(0, 1fr); gap: 1.5em; }
  #toc { position: sticky; top: 0; max-height: 100vh; box-sizing: border-box; overflow-y: auto; margin: 0;
         border-width: 0 1px 0 0; }
}
"""

#: Opens a figure at its natural size over the page (a click or Escape closes it): the page's own image, no
#: request, no library.
LIGHTBOX = """<div id="lightbox" hidden><img alt=""></div>
<script>
(function () {
  const box = document.getElementById("lightbox"), shown = box.querySelector("img");
  document.addEventListener("click", function (e) {
    const img = e.target.closest("figure img");
    if (img) { shown.src = img.src; shown.alt = img.alt; box.hidden = false; box.scrollTo(0, 0); }
    else if (!box.hidden && box.contains(e.target)) { box.hidden = true; }
  });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") box.hidden = true; });
})();
</script>"""

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

    A table of contents (sticky beside the sections on a wide screen) links to each section, run directory, its
    charts and figures, and a summary at the top gives each directory's status and first headline. Each section
    has, per directory, its status, the monitor's divergence diagnosis, the experiment's headline sentences
    (every number read from ``results.json``), its ``config.json`` (folded), one Bokeh chart per question in which
    a reader can zoom, read values on hover and hide a run by clicking its legend entry (a run's per-parameter
    charts folded under its name), and its figures, each opened at full size by a click.

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
        The page needs no network: BokehJS is inlined from the installed ``bokeh`` package (its core bundle),
        figures are ``data:`` URIs (WebP in 256 colours), and nothing refers to another host; under
        ``watch`` the only requests go back to the local server the page came from. A directory that a
        ``Monitor`` wrote without an experiment is "monitored training", with the monitor's charts; one with
        nothing optiscope can show gets a section saying so. Long runs are thinned to at most 400 points per line
        and 200 steps per heatmap row, line values kept to 5 significant digits and held as float32.
    """
    sources = Sources(watch=watch, interval_ms=interval_ms)
    body: list[str] = []
    contents: list[str] = []  # the table of contents' entries, a study each
    summary: list[str] = []  # each run directory's status and lead headline
    models: dict[str, Any] = {}
    titles: list[str] = []
    groups: dict[str | None, list[RunDir]] = {}
    for run in run_dirs:
        groups.setdefault(section_of(run), []).append(run)
    for k, (experiment, group) in enumerate(groups.items()):
        anchor = f"s{k}"
        body.append(section_head(experiment, group, anchor))
        entries = []
        for i, (name, _, run) in enumerate(named(group)):
            body.append(run_summary(run, name, f"{anchor}-r{i}"))
            entries.append(link(f"{anchor}-r{i}", name))
            summary.append(summary_item(run, name, f"{anchor}-r{i}", section_name(experiment)))
        if experiment is not None:
            found = (
                metrics_charts(sources, group, f"e{k}")
                if experiment == MONITORED
                else section_charts(sources, experiment, group, f"e{k}")
            )
            drawn = [(t, c) for t, c in found if c is not None]
            if drawn:
                body.append(f'<h3 id="{anchor}-charts">Charts</h3>')
                entries.append(link(f"{anchor}-charts", f"charts ({len(drawn)})"))
            folded: dict[str, list[str]] = {}  # per run: its per-parameter charts, collapsed
            for j, (title, chart) in enumerate(drawn):
                models[f"c{k}_{j}"] = chart
                titles.append(title)
                div = f'<div class="chart"><h4>{html.escape(title)}</h4>@@{f"c{k}_{j}"}@@</div>'
                run_of = per_run(title)
                body.append(div) if run_of is None else folded.setdefault(run_of, []).append(div)
            for name, divs in folded.items():
                said = f"per-parameter charts of {name} ({len(divs)})"
                body.append(f"<details><summary>{html.escape(said)}</summary>{''.join(divs)}</details>")
            shown = "".join(figures_of(run) for run in group)
            if shown:
                body.append(
                    f'<h3 id="{anchor}-figures">Figures</h3><p class="muted">Click a figure to open it at '
                    f"full size (Escape closes it).</p>{shown}"
                )
                entries.append(link(f"{anchor}-figures", "figures"))
        body.append("</section>")
        items = "".join(f"<li>{entry}</li>" for entry in entries)
        contents.append(f"<li>{link(anchor, section_name(experiment))}<ol>{items}</ol></li>")
    script, divs = embed(models)
    text = "\n".join(body)
    for name, div in divs.items():
        text = text.replace(f"@@{name}@@", div)
    sig = signature(run_dirs, titles, sources.live)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',  # no favicon request: the page asks nothing of any host
        f"<title>optiscope report: {html.escape(', '.join(r.name for r in run_dirs))}</title>",
        f"<style>{STYLE}</style>",
        resources() if models else "",
        '</head><body><div class="layout">',
        f'<nav id="toc"><details open><summary>Contents</summary><ol>{link("summary", "Summary")}'
        f"{''.join(contents)}</ol></details></nav>",
        "<main><h1>optiscope report</h1>",
        f'<p class="muted">{len(run_dirs)} run director{"y" if len(run_dirs) == 1 else "ies"}; optiscope '
        f"{__version__}; written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        f"{'; watching: charts from metrics.jsonl refresh as the run goes' if watch else ''}.</p>",
        f'<div id="summary"><h2>Summary</h2><ul class="summary">{"".join(summary)}</ul></div>',
        text,
        "</main></div>",
        LIGHTBOX,
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
    # each glyph's copies for unselected and muted points: these charts select nothing and their legends hide a
    # run rather than mute it, so the copies were a third of the charts' models (and bytes), never drawn. Dropped
    # before the charts join a document, which would re-index itself at each change (minutes for a page).
    for model in models.values():
        for renderer in model.select({"type": GlyphRenderer}):
            renderer.nonselection_glyph = renderer.muted_glyph = None
    share_log_labels(list(models.values()))
    with doc.models.freeze():
        for model in models.values():
            doc.add_root(model)
    return components(models)


def resources() -> str:
    """BokehJS inlined: its core bundle, which has everything the charts use (tabs included); the widgets
    bundle, 0.4 MB of sliders and tables, is not needed."""
    inline = Resources(mode="inline", components=["bokeh"])
    return inline.render_css() + inline.render_js()


MONITORED = "monitored training"  # the section of directories a Monitor wrote without an experiment


def section_of(run: RunDir) -> str | None:
    """The run's experiment; ``MONITORED`` for a Monitor's directory with records; None when nothing in it
    can be shown."""
    if run.experiment is not None:
        return run.experiment
    return MONITORED if run.monitored and run.metrics else None


def link(anchor: str, text: str) -> str:
    return f'<a href="#{anchor}">{html.escape(text)}</a>'


def section_name(experiment: str | None) -> str:
    """A section's heading: its experiment, or what its directories are."""
    if experiment is None:
        return "Directories with nothing optiscope can show"
    return "Monitored training" if experiment == MONITORED else experiment


def section_head(experiment: str | None, group: list[RunDir], anchor: str) -> str:
    head = f'<section id="{anchor}"><h2>{html.escape(section_name(experiment))}</h2>'
    if experiment is None:
        return head
    if experiment == MONITORED:
        return head + (
            '<p class="muted">metrics.jsonl written by a Monitor\'s sinks or '
            "the Hugging Face Trainer / Lightning callbacks: the monitor's charts, no experiment results</p>"
        )
    describe = SUMMARIES.get(experiment)
    summary = describe(group) if describe is not None else sweep.results_contract(experiment)[1]
    return head + f'<p class="muted">{html.escape(summary)}</p>'


def summary_item(run: RunDir, name: str, anchor: str, study: str) -> str:
    """The summary's line of one run directory: its study and name, linked to its article, its status and its
    first headline sentence."""
    sentences = headlines.headlines(run.results) if run.results else []
    lead = f"; {sentence_html(sentences[0])}" if sentences else ""
    where = study if name == study else f"{study}: {name}"
    return f"<li>{link(anchor, where)} — {status_text(run, name)}{lead}</li>"


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


#: Headline sentences and divergence diagnoses shown before the rest are folded away (``<details>``).
SHOWN_LINES = 3


def folded(items: list[str], what: str, many: str | None = None) -> list[str]:
    """The first ``SHOWN_LINES`` of ``items`` and the rest in a collapsed ``<details>`` saying how many more ``what``
    (``many``: its plural, where it is not ``what + "s"``)."""
    if len(items) <= SHOWN_LINES:
        return items
    rest = headlines.plural(len(items) - SHOWN_LINES, f"more {what}", many and f"more {many}")
    more = f"<details><summary>{rest}</summary>{''.join(items[SHOWN_LINES:])}</details>"
    return [*items[:SHOWN_LINES], more]


def run_summary(run: RunDir, name: str, anchor: str = "") -> str:
    """The directory's article: its path, status, divergences, problems, headlines and config; ``name`` is what its
    charts call it (and a run without a ``run`` label in its records). Long lists are folded after their first
    lines, the config always."""
    out = [f'<article id="{anchor}"><h3>{html.escape(str(run.path))}</h3>', status_line(run, name)]
    out += folded(divergence_lines(run, name), "divergence diagnosis", "divergence diagnoses")
    if run.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in run.problems)
        out.append(f'<div class="problems"><strong>Not shown:</strong><ul>{items}</ul></div>')
    sentences = headlines.headlines(run.results) if run.results else []
    if sentences:
        items = folded([f"<li>{sentence_html(s)}</li>" for s in sentences], "finding")
        out.append('<ul class="headline">' + "".join(items) + "</ul>")
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
    return f"<p>Status: {status_text(run, name)}.</p>"


def status_text(run: RunDir, name: str | None = None) -> str:
    """``status_line``'s words, as the summary repeats them."""
    runs_seen = series.by_run(run.metrics, unnamed=run.name if name is None else name)
    progress = ", ".join(f"{label} at step {rows[-1]['step']}" for label, rows in runs_seen.items())
    if run.results is not None:
        status = str(run.results.get("status", "ok"))
        css = "status-ok" if status == "ok" else "status-bad"
        diverged, crashed, total, what = failed_runs(run.results)
        # runs of a finished study that diverged (Adam at SGD's η, landscapes' largest η) are among its findings,
        # said plainly; a crash is no run's outcome (the machine's, or a bug)
        some = "; ".join(
            f'<span class="{kind}">{html.escape(f"{count} of {total} {what} {how}")}</span>'
            for count, how, kind in ((diverged, "diverged", "finding"), (crashed, "crashed", "status-bad"))
            if count and status == "ok"
        )
        some = f", {some}" if some else ""
        took = run.results.get("wall_seconds")
        extra = f" in {took:.0f} s" if isinstance(took, int | float) else ""
        extra += " since it was resumed" if extra and run.results.get("resumed") else ""
        quick = " (--quick)" if run.results.get("quick") else ""
        return f'<span class="{css}">{html.escape(status)}</span>{some}{quick}{extra}'
    if runs_seen and section_of(run) == MONITORED:
        return f"monitored; last logged: {html.escape(progress)}"
    logged = f"; last logged: {html.escape(progress)}" if runs_seen else "; nothing logged yet"
    if run.in_progress:
        return f'<span class="status-run">running</span>{logged}'
    if (run.path / runs.RESULTS).is_file():  # there, but not readable as this experiment's: the problems say why
        unread = f"its {runs.RESULTS} could not be read (see below)"
        return f'<span class="status-bad">{unread}</span>{logged}'
    if runs_seen:
        stopped = "stopped before its results (interrupted or failed)"
        return f'<span class="status-bad">{stopped}</span>{logged}'
    return '<span class="status-bad">no results</span>'


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
    without a ``run`` label in its records is called ``name`` (None: the directory's name). Styled as a failure
    only where it is one (a monitored run, or an experiment whose every run diverged): in an experiment that
    finished, a run that diverged is one of its findings."""
    name = run.name if name is None else name
    finished = run.results is not None and run.results.get("status", "ok") == "ok"
    css = "finding" if finished and run.experiment is not None else "status-bad"
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
        out.append(f'<p class="{css}">{html.escape(text)}.</p>')
    return out


def figures_of(run: RunDir) -> str:
    """The run's figures, each inlined once (WebP in 256 colours, ``inline_image``), shown as wide as the page and
    opened at full size by a click (``LIGHTBOX``)."""
    out = []
    for path in run.figures:
        try:
            stat = path.stat()
            mime, data, (width, height) = inline_image(path, stat.st_mtime_ns, stat.st_size)
        except OSError:
            continue  # a figure being redrawn right now; the next page has it
        name = html.escape(f"{run.name}/figures/{path.name}")
        out.append(
            f'<figure><img alt="{name}" width="{width}" height="{height}" style="height: auto" '
            f'src="data:{mime};base64,{data}"><figcaption class="muted">{name} ({width} × {height} px; click for '
            "full size)</figcaption></figure>"
        )
    return "".join(out)


@functools.lru_cache(maxsize=256)
def inline_image(path: Path, mtime_ns: int, size: int) -> tuple[str, str, tuple[int, int]]:
    """(MIME type, base64 data, (width, height)) of a figure file re-encoded in 256 colours as lossless WebP,
    about 4× smaller than matplotlib's PNG (a page inlines every run's figures). The figures are drawn in few
    colours: undithered, 256 of them leave ~98 % of the pixels exact and the rest, antialiased edges, within a few
    levels, as on the docs site. Kept per file version (``mtime_ns``, ``size``): ``--watch`` rebuilds the page
    every second or so. The PNG itself where Pillow was built without WebP."""
    with Image.open(path) as image:
        image.load()
    buffer = io.BytesIO()
    if features.check("webp"):
        image = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        image.save(buffer, "WEBP", lossless=True, exact=True, method=2, quality=50)
        mime = "image/webp"
    else:
        buffer.write(path.read_bytes())
        mime = "image/png"
    return mime, base64.b64encode(buffer.getvalue()).decode("ascii"), image.size
