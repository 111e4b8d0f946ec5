"""The interactive charts of a report, drawn with Bokeh (DEVELOPERS.md says why Bokeh).

Each function takes columns already picked out of ``results.json`` or ``metrics.jsonl`` and returns a
Bokeh model, or None when there is nothing to draw. Zoom, pan, hover values, legends that hide a run
on click and a log-log toggle (two tabs) are Bokeh's own; nothing is drawn by hand.

Every data source is made by a ``Sources``: in a written page it is a ``ColumnDataSource`` holding the
data; under ``optiscope report --watch`` the sources of charts drawn from ``metrics.jsonl`` are
``AjaxDataSource``s that fetch their columns again from the local server, so the charts grow with the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from typing import Any
from urllib.parse import quote

import numpy as np
from bokeh.models import (
    AjaxDataSource,
    ColorBar,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    CustomJSTicker,
    CustomJSTickFormatter,
    DataRange1d,
    FixedTicker,
    HoverTool,
    LogAxis,
    LogColorMapper,
    Range1d,
    TabPanel,
    Tabs,
)
from bokeh.plotting import figure

from ..figures.style import BOKEH_DASHES, CATEGORICAL, DASHED, MUTED, SOLID, run_colors

HEIGHT = 320
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
PALETTE = "Viridis256"


class Sources:
    """Makes every data source of one page; ``live`` ones (metrics) poll ``/data?key=…`` when watching.

    A live source's key names what it holds (its chart, and its line), not its place among the page's sources:
    a page rebuilt with a chart more (the sharpness at the first measurement) keeps every other source's key,
    so an open page never polls one chart's columns into another's glyphs before it reloads."""

    def __init__(self, watch: bool = False, interval_ms: int = 1000) -> None:
        self.watch, self.interval_ms = watch, interval_ms
        self.live: dict[str, dict[str, Any]] = {}

    def make(self, data: dict[str, Any], live: bool = False, key: str = "") -> ColumnDataSource:
        """A source of ``data``; a ``live`` one under ``key`` (the chart's name, with its line's label)."""
        if not live:
            return ColumnDataSource(compact(data))
        candidates = itertools.chain([key], (f"{key}#{i}" for i in itertools.count(2)))  # a name used twice
        key = next(k for k in candidates if k not in self.live)
        self.live[key] = data  # as JSON serves it under --watch; the page holds it compact
        if not self.watch:
            return ColumnDataSource(compact(data), name=key)
        return AjaxDataSource(
            data=compact(data),
            name=key,
            data_url=f"/data?key={quote(key)}",
            method="GET",
            polling_interval=self.interval_ms,
            mode="replace",
        )


#: float32 holds 7 significant digits, more than the 5 that ``series`` keeps; its largest value is about 3.4e38.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def compact(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each column of numbers (or of lists of numbers, a multi-line's) as float32 arrays, which
    Bokeh writes into the page as base64 (5.3 characters a value, against 9–12 for a number in JSON: the page of
    long runs is mostly numbers); a column holding a value beyond float32's range stays float64."""

    def packed(column: Any) -> Any:
        if isinstance(column, np.ndarray) or not isinstance(column, list) or not column:
            return column
        if all(isinstance(v, list) for v in column):
            return [packed(v) for v in column]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in column):
            return column  # labels, colours
        values = np.asarray(column, dtype=np.float64)
        small = not np.any(np.abs(values[np.isfinite(values)]) > FLOAT32_MAX)
        return values.astype(np.float32) if small else values

    return {name: packed(column) for name, column in data.items()}


def colors(labels: Collection[str]) -> dict[str, str]:
    """label -> colour of each line of one chart, in the figures' visual language (``figures.style``): a run
    label such as 'adam@0.05' or 'lm-a: adamw seed 2' takes its recipe's colour, or a shade of it beside the
    same recipe's runs at other η; 'adam sharpness' and 'adam threshold' share their run's."""
    return run_colors(labels)


def _figure(name: str, title: str, x_label: str, y_label: str, *, x_log=False, y_log=False, **kw) -> Any:
    p = figure(
        name=name,
        title=title,
        height=kw.pop("height", HEIGHT),
        sizing_mode="stretch_width",
        tools=TOOLS,
        x_axis_label=x_label,
        y_axis_label=y_label,
        x_axis_type="log" if x_log else "linear",
        y_axis_type="log" if y_log else "linear",
        **kw,
    )
    p.toolbar.logo = None
    for axis in [*(p.xaxis if x_log else []), *(p.yaxis if y_log else [])]:
        label_decades(axis)
    for axis in (p.x_range, p.y_range):  # a run hidden by its legend entry (a diverged one's 1e30) leaves the scale
        if isinstance(axis, DataRange1d):  # not an axis set from its meaning (``y_range``)
            axis.only_visible = True
    return p


#: The most decades a log axis labels (every one, up to this many): beyond it every second, third… decade is
#: labelled and the others get minor ticks, as 30 labels would overlap on a chart 320 px tall.
MOST_DECADES = 16

#: Ticks of a log axis, mirroring the figures' ``style.label_decades``: a tick at every power of ten in view
#: where there are two or more; else the sparsest of 1-2-5, 1-2-3-5-7, 1…9, 1…9.5 by halves and 1…9.9 by tenths
#: (× 10ᵏ) that puts three ticks in view (``style.mantissas``; a gradient norm of 0.40 … 0.52 had two).
#: Computed in the page from the axis's current range, so a zoom or a growing live chart is labelled alike.
LOG_TICKS = """
const low = Math.min(cb_data.start, cb_data.end), high = Math.max(cb_data.start, cb_data.end);
if (!(low > 0) || !Number.isFinite(high)) return [];
const first = Math.floor(Math.log10(low)) - 1, last = Math.ceil(Math.log10(high)) + 1;
const at = (subs) => { const out = [];
  for (let k = first; k <= last; k++) for (const m of subs) { const t = Number(`${m}e${k}`);
    if (low <= t && t <= high) out.push(t); }
  return out; };
const decades = at([1]);
if (decades.length >= 2) {
  const every = Math.ceil(decades.length / most);
  const picked = decades.filter((t) => Math.round(Math.log10(t)) % every === 0);
  return minor ? at([1, 2, 3, 4, 5, 6, 7, 8, 9]).filter((t) => !picked.includes(t)) : picked;
}
const steps = (n) => Array.from({length: 9 * n}, (_, i) => (n + i) / n);  // 1 … 9.9 in steps of 1/n
for (const subs of [[1, 2, 5], [1, 2, 3, 5, 7], steps(1), steps(2)]) {
  if (at(subs).length >= 3) return minor ? [] : at(subs);
}
return minor ? [] : at(steps(10));
"""

#: The labels of ``LOG_TICKS``, written as the figures' ``style.number`` writes them: powers of ten as 10ᵏ, the
#: numbers of an axis spanning under a decade plainly from 10⁻³ to 10⁴, else as m×10ᵏ (one form per axis).
LOG_LABELS = """
const sup = (k) => String(k).replace(/./g, (c) => "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"["-0123456789".indexOf(c)]);
const k = Math.floor(Math.log10(Math.abs(tick)) + 1e-9);
const mantissa = Number((tick / Number(`1e${k}`)).toPrecision(2));
if (ticks.every((t) => Math.abs(Math.log10(t) - Math.round(Math.log10(t))) < 1e-9)) return "10" + sup(k);
const scientific = !(Math.min(...ticks) >= 1e-3 && Math.max(...ticks) < 1e4);
if (!scientific) return String(Number(tick.toPrecision(Math.max(2, k + 1))));
return mantissa === 1 ? "10" + sup(k) : `${mantissa}×10${sup(k)}`;
"""


def label_decades(axis: Any) -> None:
    """Label a Bokeh log ``axis`` at every decade it spans, or at three numbers or more where it spans under
    two powers of ten (``LOG_TICKS``, ``LOG_LABELS``): Bokeh's own ``LogTicker`` ticks a range of under two
    decades linearly ('5', '10') and skips decades on a range of over nine. The report's counterpart of
    ``figures.style.label_decades`` (matplotlib's axes there, Bokeh's here)."""
    axis.ticker = CustomJSTicker(
        args={"most": MOST_DECADES},
        major_code="const minor = false;" + LOG_TICKS,
        minor_code="const minor = true;" + LOG_TICKS,
    )
    axis.formatter = CustomJSTickFormatter(code=LOG_LABELS)


def share_log_labels(models: Collection[Any]) -> None:
    """Give every log axis of ``models`` (a page's charts) the first one's ticker and formatter of
    ``label_decades``: the page then holds their code once, not once per axis (about 2.3 kB each)."""
    axes = [axis for model in models for axis in model.select({"type": LogAxis})]
    for axis in axes[1:]:
        axis.ticker, axis.formatter = axes[0].ticker, axes[0].formatter


#: Pixels per legend entry (8pt labels, no spacing) and around the entries: a chart is as tall as its legend,
#: which Bokeh would otherwise cut off at the plot's edge.
LEGEND_ROW, LEGEND_MARGIN = 20, 70


#: The most lines one glyph names in a legend: a model of hundreds of parameter tensors (GPT-2 small has 148)
#: would make each chart thousands of pixels tall; beyond this, hovering a line names it.
LEGEND_MAX = 40


def _named(series: dict[str, Any]) -> dict[str, str]:
    """The glyph's legend argument: one entry per label, unless there are more than ``LEGEND_MAX``."""
    return {"legend_field": "label"} if len(series) <= LEGEND_MAX else {}


def _legend_outside(p: Any, entries: int, hide: bool = True) -> None:
    """The legend right of the plot, the plot as tall as its ``entries`` need; with ``hide``, a click on an
    entry hides (or shows again) that run's lines."""
    if p.legend:
        legend = p.legend[0]
        p.height = max(p.height, LEGEND_ROW * entries + LEGEND_MARGIN)
        legend.click_policy = "hide" if hide else "none"
        legend.label_text_font_size = "8pt"
        legend.spacing = 0
        if legend in p.center:
            p.center.remove(legend)
        if legend not in p.right:
            p.right.append(legend)


def lines(
    sources: Sources,
    name: str,
    title: str,
    series: dict[str, dict[str, list]],
    x_label: str,
    y_label: str,
    *,
    x_log: bool = False,
    y_log: bool = False,
    live: bool = False,
    markers: bool = False,
    line: bool = True,
    diverged: Collection[str] = (),
    faint: Collection[str] = (),
    marked: Collection[str] = (),
    points: Collection[str] = (),
    y_range: tuple[float, float] | None = None,
) -> Any | None:
    """One line per entry of ``series`` (label -> {"x": [...], "y": [...]}), legend-toggled.

    Lines labelled in ``faint`` are thin and translucent and those in ``marked`` carry markers, as the figures
    draw a training loss (faint) beside its validation loss (marked) in one chart; those in ``points`` are markers
    alone (the early warnings on a loss chart).

    On a linear y axis the scale fits the lines not labelled in ``diverged`` (runs that diverged): a diverged
    run's last, exploding values would flatten every other line to the axis. Its line is still drawn, leaving
    the plot at the top, and the title says so; with every other line hidden by its legend entry, the axis fits
    the diverged ones.

    ``y_range`` is the y axis of a bounded quantity, set from its meaning (``FRACTION``, ``counts``) rather than
    fitted to its values; a linear y axis whose every value is 0 runs from 0 to 1 (``meaning``)."""
    series = {label: pts for label, pts in series.items() if pts["x"]}
    if not series:
        return None
    y_range = y_range or (None if y_log else meaning(series))
    left_out = set() if y_log or y_range or set(series) <= set(diverged) else set(diverged) & set(series)
    if left_out:
        title += " (y axis fitted to the runs that did not diverge)"
    bounds = {} if y_range is None else {"y_range": Range1d(*y_range)}
    p = _figure(name, title, x_label, y_label, x_log=x_log, y_log=y_log, **bounds)
    palette, seen = colors(series), set()
    fitted, every = [], []  # the glyphs the y axis fits, and all of them
    for label, pts in series.items():
        c = palette[label]
        # as in the figures: a run's first curve solid, its second on the chart (threshold, before clipping) dashed
        dash = BOKEH_DASHES[DASHED if c in seen else SOLID]
        seen.add(c)
        source = sources.make(pts, live=live, key=f"{name}/{label}")
        glyphs = []
        if line and label not in points:
            weight = {"line_width": 1.2, "line_alpha": 0.45} if label in faint else {"line_width": 1.8}
            glyphs.append(
                p.line("x", "y", source=source, color=c, line_dash=dash, legend_label=label, name=label, **weight)
            )
        if markers or label in marked or label in points or not line or len(pts["x"]) == 1:
            glyphs.append(p.scatter("x", "y", source=source, color=c, size=5, legend_label=label, name=label))
        fitted += [] if label in left_out else glyphs
        every += glyphs
    if left_out:
        p.y_range.renderers = fitted
        # with every fitted line hidden by its legend entry, the axis fits the diverged lines still shown (Bokeh
        # would otherwise fit nothing and show an empty plot)
        refit = CustomJS(
            args={"axis": p.y_range, "fitted": fitted, "every": every},
            code="axis.renderers = fitted.some((g) => g.visible) ? fitted : every",
        )
        for glyph in fitted:
            glyph.js_on_change("visible", refit)
    p.add_tools(HoverTool(tooltips=[("", "$name"), (x_label, "@x{0.[000]}"), (y_label, "@y{0.[0000]}")]))
    _legend_outside(p, len(series))
    return p


def many_lines(
    sources: Sources,
    name: str,
    title: str,
    series: dict[str, dict[str, list]],
    x_label: str,
    y_label: str,
    *,
    y_log: bool = False,
    live: bool = True,
) -> Any | None:
    """Many lines (one per parameter) as one glyph, each named on hover: one renderer keeps a page with
    hundreds of parameters light. Each line's last point is marked (``ends``), so that a line of one point
    (a run of one recorded step) shows. A line's colour follows its place in ``series``, lines without points
    counted, so that charts given the same names in the same order colour each name alike."""
    colors = {label: _cycle(i) for i, label in enumerate(series)}
    series = {label: pts for label, pts in series.items() if pts["x"]}
    if not series:
        return None
    data = {
        "xs": [pts["x"] for pts in series.values()],
        "ys": [pts["y"] for pts in series.values()],
        "label": list(series),
        "color": [colors[label] for label in series],
    }
    data.update(ends(data["xs"], data["ys"]))
    p = _figure(name, title, x_label, y_label, y_log=y_log)
    source = sources.make(data, live=live, key=name)
    # the legend names each line (one entry per label of the one glyph); a click would hide them all, so none does
    p.multi_line("xs", "ys", source=source, line_color="color", line_width=1.4, **_named(series))
    p.scatter("end_x", "end_y", source=source, color="color", size=4)
    p.add_tools(HoverTool(tooltips=[("", "@label"), (x_label, "$x{0}"), (y_label, "$y")]))
    _legend_outside(p, len(series), hide=False)
    return p


def bands(sources: Sources, name: str, title: str, series: dict[str, dict[str, list]], live: bool = True) -> Any | None:
    """Per parameter: the min–max band of a quantity (one polygon each) and its median line with its last
    point marked, all parameters in three glyphs; hover names the parameter. The bands are one faint grey, so
    that together they read as the envelope of all parameters (darker where more overlap), and each median line
    keeps its parameter's colour: fifteen bands in fifteen translucent colours had made one muddy blob."""
    series = {label: cols for label, cols in series.items() if cols["x"]}
    if not series:
        return None
    data = {
        "xs": [cols["x"] + cols["x"][::-1] for cols in series.values()],
        "ys": [cols["max"] + cols["min"][::-1] for cols in series.values()],
        "mx": [cols["x"] for cols in series.values()],
        "my": [cols["median"] for cols in series.values()],
        "label": list(series),
        "color": [_cycle(i) for i in range(len(series))],
    }
    data.update(ends(data["mx"], data["my"]))
    p = _figure(name, title, "step", "η/(√v̂ + ε)", y_log=True)
    source = sources.make(data, live=live, key=name)
    p.patches("xs", "ys", source=source, fill_color=MUTED, fill_alpha=0.07, line_alpha=0)
    p.multi_line("mx", "my", source=source, line_color="color", line_width=1.4, **_named(series))
    p.scatter("end_x", "end_y", source=source, color="color", size=4)
    p.add_tools(HoverTool(tooltips=[("", "@label"), ("step", "$x{0}"), ("η_eff", "$y")]))
    _legend_outside(p, len(series), hide=False)
    return p


def ends(xs: list[list], ys: list[list]) -> dict[str, list]:
    """The last point of each line (``end_x``, ``end_y``): a multi-line glyph draws nothing for a line of one
    point, so every line's end is also drawn as a marker."""
    return {"end_x": [x[-1] for x in xs], "end_y": [y[-1] for y in ys]}


def _cycle(i: int) -> str:
    """The colour of a model's ``i``-th part (layer, parameter): the figures' ``CATEGORICAL`` order."""
    return CATEGORICAL[i % len(CATEGORICAL)]


def heatmap(
    sources: Sources,
    name: str,
    title: str,
    cells: dict[str, Any] | None,
    live: bool = True,
    scale: tuple[float, float] | None = None,
) -> Any | None:
    """A parameter × step grid of a positive quantity on a log colour scale, hover giving its value.

    ``scale`` is the (low, high) of the colour scale that heatmaps compared with one another share
    (``shared_scale`` of all their cells); None, this grid's own range.

    Drawn as one ``rect`` glyph over flat columns (a cell per finite value, as wide as the gap to the next
    kept step) rather than an ``image``: flat columns are what an ``AjaxDataSource`` can refresh."""
    if cells is None:
        return None
    image, steps, params = cells["image"], np.asarray(cells["steps"]), cells["params"]
    rows, cols = np.nonzero(np.isfinite(image))
    if rows.size == 0:
        return None
    widths = np.diff(steps, append=steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1))
    data = {
        "x": (steps[cols] + widths[cols] / 2).astype(np.float32),
        "w": widths[cols].astype(np.float32),
        "y": (len(params) - rows - 0.5).astype(np.float32),  # the first parameter on top, as a list reads
        "v": image[rows, cols],
    }
    low, high = scale or (float(data["v"].min()), float(data["v"].max()))
    mapper = LogColorMapper(palette=PALETTE, low=low, high=high)
    p = _figure(name, title, "step", "", height=max(HEIGHT, 16 * len(params) + 80))
    p.rect(
        "x",
        "y",
        "w",
        1,
        source=sources.make(data, live=live, key=name),
        fill_color={"field": "v", "transform": mapper},
        line_width=0,
    )
    p.x_range.range_padding = p.y_range.range_padding = 0
    p.yaxis.ticker = FixedTicker(ticks=[i + 0.5 for i in range(len(params))])
    p.yaxis.major_label_overrides = {len(params) - i - 0.5: label for i, label in enumerate(params)}
    p.yaxis.major_label_text_font_size = "7pt"
    p.add_layout(ColorBar(color_mapper=mapper, title="u/w" if scale is None else "u/w (scale shared)"), "right")
    # the hovered cell's row is its parameter: y = n − row − 0.5 (a name per cell would multiply the page's size)
    row_name = CustomJSHover(args={"names": list(params)}, code="return names[Math.round(names.length - value - 0.5)]")
    p.add_tools(HoverTool(tooltips=[("", "@y{name}"), ("step", "$x{0}"), ("u/w", "@v")], formatters={"@y": row_name}))
    return p


def shared_scale(grids: list[dict[str, Any] | None]) -> tuple[float, float] | None:
    """The (low, high) of one colour scale over the finite positive cells of every grid (``heatmap``'s
    ``cells``), so that one colour means one value in each; None where no grid has such a cell."""
    values = [np.asarray(g["image"], dtype=float) for g in grids if g is not None]
    values = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in values]) if values else np.array([])
    return (float(values.min()), float(values.max())) if values.size else None


#: The y axis of a fraction (an accuracy, a share): 0 to 1 whatever the data, a little room at both ends for the
#: markers at 0 and 1 (the figures' ``style.fraction_axis``).
FRACTION = (-0.03, 1.03)


def counts(series: dict[str, dict[str, list]]) -> tuple[float, float]:
    """The y axis of counts (wrong answers, steps): from 0 to a little above the largest finite count, at least
    1, so that all-zero counts stand on the axis's floor (the figures' ``style.count_axis``)."""
    return 0.0, max(1.0, *_finite_ys(series)) * 1.05


def meaning(series: dict[str, dict[str, list]]) -> tuple[float, float] | None:
    """(0, 1) for lines whose every finite value is 0 (Bokeh would centre them in −1…1, as if they could be
    negative), else None: the axis fits the values."""
    values = _finite_ys(series)
    return (0.0, 1.0) if values and not any(values) else None


def _finite_ys(series: dict[str, dict[str, list]]) -> list[float]:
    return [y for pts in series.values() for y in pts["y"] if isinstance(y, int | float) and math.isfinite(y)]


def loglog_toggle(
    sources: Sources,
    name: str,
    title: str,
    linear: dict[str, dict[str, list]],
    loglog: dict[str, dict[str, list]],
    x_label: str,
    y_label: str,
) -> Any | None:
    """Two views of one comparison: signed values on a log η axis, and |values| on log-log axes."""
    a = lines(sources, name + "-linear", title, linear, x_label, y_label, x_log=True, markers=True)
    b = lines(sources, name + "-loglog", title, loglog, x_label, f"|{y_label}|", x_log=True, y_log=True, markers=True)
    return tabbed(name, [("signed", a), ("log-log", b)])


def tabbed(name: str, views: list[tuple[str, Any]]) -> Any | None:
    """Several views of one question as tabs of one chart (those with something to draw); a single view is
    the chart itself."""
    panels = [
        panel
        for title, chart in views
        if chart is not None
        for panel in (chart.tabs if isinstance(chart, Tabs) else [TabPanel(child=chart, title=title)])
    ]  # a view that has tabs of its own gives each of them
    if len(panels) <= 1:
        return panels[0].child if panels else None
    return Tabs(tabs=panels, name=name, sizing_mode="stretch_width")


def views(chart: Any) -> list[Any]:
    """The plots of a chart: its tabs' plots, or the chart itself."""
    return [panel.child for panel in chart.tabs] if isinstance(chart, Tabs) else [chart]


def draws(chart: Any, series: dict[str, dict[str, list]]) -> bool:
    """Whether ``chart`` (a plot, or tabs of them) already has a line of each of ``series``, point for point."""
    if chart is None or not series:
        return False
    held = [(r.name, r.data_source.data) for plot in views(chart) for r in plot.renderers if r.name]

    def has(label: str, points: dict[str, list]) -> bool:
        packed = compact(points)
        return any(
            name == label and all(np.array_equal(np.asarray(data[c]), np.asarray(packed[c])) for c in ("x", "y"))
            for name, data in held
        )

    return all(has(label, points) for label, points in series.items())


def bars(sources: Sources, name: str, title: str, series: dict[str, dict[str, list]], x_label: str, y_label: str):
    """Counts at integer positions, one group of slim bars per label (dodged), legend-toggled; the y axis from 0
    (``counts``)."""
    series = {label: pts for label, pts in series.items() if pts["x"]}
    if not series:
        return None
    p = _figure(name, title, x_label, y_label, y_range=Range1d(*counts(series)))
    width, palette = 0.8 / len(series), colors(series)
    for i, (label, pts) in enumerate(series.items()):
        shifted = {"x": [x - 0.4 + width * (i + 0.5) for x in pts["x"]], "y": pts["y"], "at": pts["x"]}
        p.vbar(
            x="x",
            top="y",
            width=width,
            source=sources.make(shifted),
            color=palette[label],
            legend_label=label,
            name=label,
        )
    p.add_tools(HoverTool(tooltips=[("", "$name"), (x_label, "@at"), (y_label, "@y")]))
    _legend_outside(p, len(series))
    return p
