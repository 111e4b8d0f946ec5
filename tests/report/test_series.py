"""Thinning keeps a long series' shape within a bounded size: first and last points, even spacing."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from optiscope.report import series


@given(st.integers(0, 5000), st.integers(2, 600))
def test_keep_indices_are_few_sorted_and_keep_both_ends(n, limit):
    kept = series.keep_indices(n, limit)
    assert len(kept) <= limit and kept == sorted(set(kept))
    if n:
        assert kept[0] == 0 and kept[-1] == n - 1
    if n <= limit:
        assert kept == list(range(n))


def test_thin_drops_what_an_axis_cannot_place():
    points = series.thin([1, 2, 3, 4, 5], [1.0, math.nan, -2.0, math.inf, 0.5], positive=True)
    assert points == {"x": [1.0, 5.0], "y": [1.0, 0.5]}


def test_heatmap_is_parameters_by_kept_steps():
    rows = [{"step": s, "params": {"a": {"u_over_w": s}, "b": {"u_over_w": -1.0}}} for s in range(1, 1001)]
    cells = series.ratio_heatmap(rows)
    assert cells["params"] == ["a", "b"]
    assert cells["image"].shape == (2, series.HEATMAP_STEPS)
    assert cells["steps"][0] == 1 and cells["steps"][-1] == 1000
    assert np.isnan(cells["image"][1]).all()  # u/w ≤ 0 has no colour on a log scale
    np.testing.assert_array_equal(cells["image"][0], np.asarray(cells["steps"], dtype=np.float32))


def test_curvature_keys_get_their_charts_when_recorded(tmp_path):
    from optiscope.report.charts import Sources
    from optiscope.report.rundir import RunDir
    from optiscope.report.sections import metrics_charts

    rows = [
        {
            "run": "sgd",
            "step": s,
            "loss": 1 / s,
            "sharpness": 10.0 + s,
            "threshold": 40.0,
            "sharpness/threshold": (10 + s) / 40,
        }
        for s in range(1, 6)
    ]
    titles = {title for title, chart in metrics_charts(Sources(), [RunDir(tmp_path, metrics=rows)], "k") if chart}
    assert {"Sharpness against its stability threshold", "Sharpness / threshold"} <= titles
    without = [{k: v for k, v in r.items() if "sharp" not in k and k != "threshold"} for r in rows]
    titles = {title for title, chart in metrics_charts(Sources(), [RunDir(tmp_path, metrics=without)], "k") if chart}
    assert not any("harpness" in t for t in titles)


def test_a_chart_of_many_parameters_names_them_on_hover_not_in_a_legend_taller_than_a_page():
    """GPT-2 small has 148 parameter tensors: a legend of each made a chart 3,000 px tall. Up to LEGEND_MAX
    lines get a legend entry each; more are named by hover only, and the chart keeps its usual height."""
    from optiscope.report.charts import HEIGHT, LEGEND_MAX, Sources, many_lines

    def chart(lines):
        series = {f"blocks.{i}.weight": {"x": [1, 2], "y": [0.1, 0.2]} for i in range(lines)}
        return many_lines(Sources(), "k", "u/w", series, "step", "u/w")

    few, many = chart(LEGEND_MAX), chart(148)
    assert few.legend and few.height > HEIGHT  # one entry per label of the glyph, drawn by the browser
    assert not many.legend and many.height == HEIGHT
    assert [t.tooltips[0] for t in many.tools if type(t).__name__ == "HoverTool"] == [("", "@label")]


def test_early_warnings_are_marked_on_the_loss_chart(tmp_path):
    """A real monitor's warnings (GD past its 2/λ edge on a quadratic) read back from metrics.jsonl: markers alone on
    the loss chart, at the steps they warned, at the loss of the record that carries each."""
    import torch

    from optiscope import runs
    from optiscope.monitor import Curvature, EarlyWarning, JSONLSink, Monitor
    from optiscope.report.charts import Sources
    from optiscope.report.rundir import RunDir
    from optiscope.report.sections import metrics_charts

    x = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    model = torch.nn.ParameterList([x])
    opt = torch.optim.SGD(model.parameters(), lr=2.5)  # λ = 1 > 2/η: warned at step 1, then every 3rd step
    curvature = Curvature(torch.zeros(1), lambda m, b: 0.5 * m[0].pow(2).sum(), every=1, directions=(), max_hvps=2)
    sink = JSONLSink(tmp_path / "metrics.jsonl")
    monitor = Monitor(
        model, opt, every=2, sinks=[sink], guard=None, curvature=curvature, early_warning=EarlyWarning(cooldown=3)
    )
    for _ in range(6):
        opt.zero_grad()
        loss = 0.5 * x.pow(2).sum()
        loss.backward()
        opt.step()
        monitor.step(loss)
    monitor.close()
    rows = runs.read_jsonl(tmp_path / "metrics.jsonl")
    marks = series.warnings(rows, unnamed="quad")
    assert marks["quad warnings"]["x"] == [1, 4]
    assert marks["quad warnings"]["y"] == [series.shown(r["loss"]) for r in rows if r["step"] in (1, 4)]
    chart = dict(metrics_charts(Sources(), [RunDir(tmp_path, metrics=rows)], "k"))["Loss at each logged step"]
    glyphs = {r.name: type(r.glyph).__name__ for r in chart.renderers}
    assert glyphs == {tmp_path.name: "Line", f"{tmp_path.name} warnings": "Scatter"}
