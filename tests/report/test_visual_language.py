"""The report's charts speak the figures' visual language: heatmaps compared with one another share one colour
scale, log axes are labelled at every decade they span, bounded quantities keep the axes of their meaning, and
the page holds no glyph its fonts lack. Read back from the page BokehJS rendered in Chromium."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optiscope.figures.style import mantissas
from optiscope.report.charts import MOST_DECADES

from .browser import unfold

#: Every log axis of the page's plots: its chart's name, the range BokehJS fitted, the major ticks and labels its
#: ticker and formatter give there, and the extent of the positive finite data on that axis (columns x / y).
LOG_AXES = """() => {
  const out = [];
  for (const plot of Bokeh.documents[0].all_models) {
    if (!plot.renderers || !plot.left) continue;
    for (const [axes, range, column] of [[plot.left, plot.y_range, 'y'], [plot.below, plot.x_range, 'x']]) {
      for (const axis of axes.filter(a => a.constructor.__name__ === 'LogAxis')) {
        const low = Math.min(range.start, range.end), high = Math.max(range.start, range.end);
        const ticks = axis.ticker.get_ticks(low, high, range, NaN).major;
        const data = plot.renderers.flatMap(r => r.data_source.data[column] ? [...r.data_source.data[column]] : [])
          .filter(v => v > 0 && Number.isFinite(v));
        out.push({chart: plot.name, low, high, ticks, labels: axis.formatter.doFormat(ticks, {loc: 0}).map(String),
                  dataLow: data.length ? Math.min(...data) : null, dataHigh: data.length ? Math.max(...data) : null});
      }
    }
  }
  return out;
}"""


def test_every_log_axis_labels_each_decade_of_its_data_and_three_numbers_under_a_decade(shown):
    """The oracle: the powers of ten between the smallest and largest positive value the chart's lines hold,
    computed here from the data BokehJS was given, each a labelled major tick of the axis as rendered."""
    page = shown
    unfold(page)
    axes = page.evaluate(LOG_AXES)
    assert any(a["chart"].endswith("-eff") for a in axes)  # rare-tokens' effective learning rate (was "10", "5")
    checked = 0
    for axis in axes:
        assert all(label.strip() for label in axis["labels"]), axis
        assert len(set(axis["labels"])) == len(axis["labels"]), axis  # no two ticks written alike
        if axis["dataLow"] is None:
            continue  # a chart of multi-lines (xs / ys): its axis's range is checked below
        first, last = math.ceil(math.log10(axis["dataLow"]) - 1e-9), math.floor(math.log10(axis["dataHigh"]) + 1e-9)
        decades = [10.0**k for k in range(first, last + 1)]
        if 2 <= len(decades) <= MOST_DECADES:
            for decade in decades:
                assert any(math.isclose(t, decade, rel_tol=1e-9) for t in axis["ticks"]), (decade, axis)
            checked += 1
        elif len(decades) > MOST_DECADES:  # a diverged run's 1e30: every k-th decade, evenly, at most MOST_DECADES
            powers = [round(math.log10(t)) for t in axis["ticks"]]
            assert len(set(b - a for a, b in zip(powers, powers[1:], strict=False))) == 1, axis
            assert MOST_DECADES / 2 <= len(powers) <= MOST_DECADES, axis
    assert checked >= 3
    for axis in axes:
        in_view = [k for k in range(-300, 300) if axis["low"] <= 10.0**k <= axis["high"]]
        assert len(axis["ticks"]) >= 3 or len(in_view) >= 2, axis  # under two decades in view: three numbers


@pytest.fixture(scope="module")
def own_loop(browser, tmp_path_factory):
    """The page of a loop's own metrics.jsonl (the "Monitored training" section): a gradient norm within one
    decade (2.5 … 6) and a scalar given to ``monitor.step`` that is 0 at every step (a count of skipped batches)."""
    from optiscope import cli

    from .browser import load, open_page

    run_dir = tmp_path_factory.mktemp("own-loop")
    records = [{"step": s, "loss": 1.0 / s, "grad_norm": 2.0 + 0.5 * s, "skipped": 0.0} for s in range(1, 9)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.main(["report", str(run_dir), "--out", str(run_dir / "report.html")]) == 0
    context, page = open_page(browser)
    load(page, (run_dir / "report.html").as_uri())
    yield page
    context.close()


def test_an_axis_under_a_decade_is_labelled_with_numbers_as_the_figures_choose_them(own_loop):
    """Three or more ticks at the figures' mantissas (``figures.style.mantissas``: the sparsest of 1-2-5,
    1-2-3-5-7, 1…9 × 10ᵏ with three in view; Bokeh ticked 2.5, 3, 3.5 … linearly), each label its number."""
    (axis,) = [a for a in own_loop.evaluate(LOG_AXES) if a["chart"].endswith("-grad")]
    subs = mantissas(axis["low"], axis["high"])
    expected = [m * 10.0**k for k in range(-3, 3) for m in subs if axis["low"] <= m * 10.0**k <= axis["high"]]
    assert len(expected) >= 3 and sorted(axis["ticks"]) == pytest.approx(sorted(expected), rel=1e-9), axis
    for tick, label in zip(axis["ticks"], axis["labels"], strict=True):
        assert float(label) == pytest.approx(tick, rel=1e-9), axis


#: Each u/w heatmap's colour mapper, with the section it is in and the values of its cells.
HEATMAPS = """() => [...document.querySelectorAll('section')].flatMap(s => {
  const doc = Bokeh.documents[0];
  const roots = [...s.querySelectorAll('.chart [data-root-id]')].map(e => doc.get_model_by_id(e.dataset.rootId));
  return roots.filter(p => p.name && p.name.includes('-heat-')).map(p => {
    const mapper = p.renderers[0].glyph.fill_color.transform;
    return {section: s.querySelector('h2').textContent, low: mapper.low, high: mapper.high,
            title: p.title.text, bar: p.right.find(r => r.color_mapper).title};
  });
})"""


def test_the_u_w_heatmaps_of_a_section_share_one_colour_scale(shown, page_runs):
    """The oracle: the smallest and largest positive u/w in the section's metrics.jsonl (every run of it)."""
    page = shown
    unfold(page)
    heatmaps = page.evaluate(HEATMAPS)
    sections = {h["section"] for h in heatmaps}
    several = [s for s in sections if sum(h["section"] == s for h in heatmaps) > 1]
    assert several, heatmaps  # the tiny lm and edge-of-stability runs monitor several optimizers each
    for section in several:
        values = [
            p["u_over_w"]
            for line in (Path(page_runs[section]) / "metrics.jsonl").read_text().splitlines()
            for p in json.loads(line).get("params", {}).values()
            if isinstance(p.get("u_over_w"), float) and math.isfinite(p["u_over_w"]) and p["u_over_w"] > 0
        ]
        for h in (h for h in heatmaps if h["section"] == section):
            assert h["low"] == pytest.approx(min(values), rel=1e-6), (section, h)
            assert h["high"] == pytest.approx(max(values), rel=1e-6), (section, h)
            assert "one colour scale" in h["title"] and "shared" in h["bar"], h


#: The y range of the charts of a section whose name ends with ``suffix``, and the y values the chart holds.
Y_RANGE = """(suffix) => {
  const plot = [...Bokeh.documents[0].all_models].find(m => m.name && m.name.endsWith(suffix) && m.y_range);
  const sources = [...new Set(plot.renderers.map(r => r.data_source))];  // a line and its markers share one
  const ys = sources.flatMap(s => s.data.y ? [...s.data.y] : []);
  return {start: plot.y_range.start, end: plot.y_range.end, ys};
}"""


def test_the_adders_accuracy_axes_run_from_0_to_1_and_its_counts_from_0(shown, page_runs):
    """Accuracy (the suite's share of cases correct, the share per carry chain) on 0–1 whatever the values;
    wrong-digit counts from 0, however few (the tiny run's may all be 0, which Bokeh centred on −1…1). The
    oracle for the accuracies: results.json's correct / cases."""
    page = shown
    results = json.loads((Path(page_runs["adder"]) / "results.json").read_text())
    accuracy = page.evaluate(Y_RANGE, "-acc")
    assert -0.05 <= accuracy["start"] <= 0 and 1 <= accuracy["end"] <= 1.05, accuracy
    expected = sorted(e["correct"] / results["cases"] for r in results["runs"] for e in r["evals"])
    assert sorted(accuracy["ys"]) == pytest.approx(expected, rel=1e-4)  # 5 significant digits kept
    carry = page.evaluate(Y_RANGE, "-carry")
    assert -0.05 <= carry["start"] <= 0 and 1 <= carry["end"] <= 1.05, carry
    wrong = page.evaluate(Y_RANGE, "-wrong")
    assert wrong["start"] == 0 and wrong["end"] >= max(1, *wrong["ys"]), wrong


def test_a_line_of_zeros_stands_on_an_axis_from_0(own_loop):
    """A given scalar that is 0 at every step: the axis runs 0 to 1, not −1 to 1 around it."""
    zeros = own_loop.evaluate(Y_RANGE, "-given-skipped")
    assert zeros["ys"] and not any(zeros["ys"])
    assert (zeros["start"], zeros["end"]) == (0, 1), zeros


#: The emoji of the page's text and charts (U+1F000 and above): the page's fonts (system-ui, sans-serif) have
#: none offline, and Chromium draws each as an empty box where no colour-emoji font is installed.
EMOJI = "() => [...document.documentElement.outerHTML].filter(c => c.codePointAt(0) >= 0x1F000)"


def test_the_page_holds_no_emoji_its_fonts_lack(own_loop):
    """The monitored section named the 🤗 Trainer, drawn as an empty box: it writes "Hugging Face" now."""
    assert own_loop.evaluate(EMOJI) == []
    assert "Hugging Face Trainer" in own_loop.locator("section").first.inner_text()
