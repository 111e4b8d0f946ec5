"""The visual language of figures/style.py, checked against what matplotlib and Bokeh draw: colours per recipe
and shades per η, the meaning of dashes in both, log axes labelled at every decade, one number format."""

import colorsys
import math
import subprocess
import sys

import matplotlib.colors
import matplotlib.pyplot as plt
import numpy as np
import pytest
from bokeh.models import Line

from optiscope.figures import edge_of_stability, style
from optiscope.report import charts


def lightness(color: str) -> float:
    return colorsys.rgb_to_hls(*matplotlib.colors.to_rgb(color))[1]


def test_runs_of_one_recipe_are_distinguishable_shades_of_its_colour_darker_with_eta():
    """sgd@0.2, @0.3, @0.5 (one colour before) differ by at least 0.1 in HLS lightness, in η's order, and keep
    SGD's hue (within 0.02 of a turn); momentum's one run keeps momentum's exact colour."""
    colors = style.run_colors(["sgd@0.5", "momentum@0.3", "sgd@0.2", "sgd@0.3"])
    assert colors["momentum@0.3"] == style.OPTIMIZER_COLORS["momentum"]
    shades = [lightness(colors[f"sgd@{eta}"]) for eta in ("0.2", "0.3", "0.5")]
    assert all(a - b >= 0.1 for a, b in zip(shades, shades[1:], strict=False)), shades
    hue = colorsys.rgb_to_hls(*matplotlib.colors.to_rgb(style.OPTIMIZER_COLORS["sgd"]))[0]
    for eta in ("0.2", "0.3", "0.5"):
        assert abs(colorsys.rgb_to_hls(*matplotlib.colors.to_rgb(colors[f"sgd@{eta}"]))[0] - hue) < 0.02
    # a run's other curves ('adam threshold') take its colour; 'adam' (no η) is the lightest of its recipe
    both = style.run_colors(["adam sharpness", "adam threshold", "adam@0.05 sharpness"])
    assert both["adam sharpness"] == both["adam threshold"]
    assert lightness(both["adam sharpness"]) > lightness(both["adam@0.05 sharpness"])


def test_a_recipe_given_as_a_class_path_has_one_colour_in_every_process():
    """Names that are not recipes (``torch.optim.NAdam``, ``mypkg.MyOpt``) get a colour from EXTRA_COLORS by a
    hash of the name: the same in a fresh interpreter (Python's own ``hash`` of a str is salted per process)."""
    names = ["torch.optim.NAdam", "mypkg.MyOpt@0.1", "mypkg.MyOpt"]
    here = [style.optimizer_color(n) for n in names]
    assert all(c in style.EXTRA_COLORS for c in here) and here[1] == here[2]
    code = f"from optiscope.figures import style; print([style.optimizer_color(n) for n in {names!r}])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == repr(here)


def test_recipes_that_are_not_in_the_table_are_never_alike_on_one_chart():
    """Seven hashed colours for five zoo recipes: alone, three of them hash to one colour; on one chart each gets
    its own, whatever the order of the names, and none is a named recipe's."""
    zoo = ["soap", "schedule-free-adamw", "ademamix", "prodigy", "adopt"]
    names = ["adamw", "muon+adamw", *zoo]
    chart = style.run_colors(names)
    assert len(set(chart.values())) == len(names)
    assert style.run_colors(names[::-1]) == chart
    assert all(chart[n] == style.optimizer_color(n, names) for n in names)
    assert not set(style.EXTRA_COLORS) & set(style.OPTIMIZER_COLORS.values())


def test_the_report_draws_each_run_in_the_colour_and_dash_of_the_figure():
    """edge-of-stability's sharpness.png and the report's chart of the same runs: each run's sharpness line has
    one colour in both; in both a run's threshold is dashed and its measured curve solid."""
    runs = [
        {**run, "label": label, "optimizer": label.split("@")[0], "lr": float(label.split("@")[1])}
        for label, run in zip(("sgd@0.2", "sgd@0.3", "sgd@0.5"), [dict(RUN)] * 3, strict=True)
    ]
    for run in runs:
        run["threshold"] = 2 / run["lr"]
    fig = edge_of_stability.sharpness({"runs": runs, "edge": 0.9, "status": "ok", "task": {}, "steps": 3})
    top = fig.axes[0]
    png = {
        line.get_label(): matplotlib.colors.to_hex(line.get_color()) for line in top.lines if line.get_label()[0] != "_"
    }
    dashed = {matplotlib.colors.to_hex(line.get_color()) for line in top.lines if line.get_linestyle() == "--"}
    plt.close(fig)
    series = {f"{r['label']} sharpness": {"x": r["step"], "y": r["sharpness"]} for r in runs}
    series.update({f"{r['label']} threshold": {"x": r["step"], "y": [r["threshold"]] * 3} for r in runs})
    p = charts.lines(charts.Sources(), "sharp", "t", series, "step", "λ", y_log=True)
    glyphs = {r.name: r.glyph for r in p.renderers}
    for run in runs:
        solid, threshold = glyphs[f"{run['label']} sharpness"], glyphs[f"{run['label']} threshold"]
        assert solid.line_color == threshold.line_color == png[run["label"]]
        assert list(solid.line_dash) == [] and list(threshold.line_dash) == list(Line(line_dash="dashed").line_dash)
    assert dashed == set(png.values())


RUN = {
    "threshold_label": "2/η",
    "preconditioned": False,
    "status": "ok",
    "divergence": None,
    "step": [0, 10, 20],
    "sharpness": [3.0, 5.0, 6.0],
    "ratio": [0.3, 0.5, 0.6],
    "loss": [1.0, 0.5, 0.2],
    "hvps": [10, 10, 10],
    "edge_step": None,
    "equilibrium": None,
    "max_ratio": 0.6,
}


def drawn_labels(ax, axis: str) -> list[str]:
    ax.figure.draw_without_rendering()
    target = ax.xaxis if axis == "x" else ax.yaxis
    return [t.label1.get_text() for t in target._update_ticks() if t.label1.get_visible() and t.label1.get_text()]


@pytest.mark.parametrize("low, high", [(1e-7, 3.0), (2e-3, 40.0), (0.5, 2e5)])
def test_a_log_axis_is_labelled_at_every_decade_it_spans(low, high):
    """matplotlib labels every other decade of a long axis; after ``finish`` each power of ten between the
    limits carries a label (the oracle: the powers computed from the limits)."""
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([1, 2], [low, high])
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    style.finish(fig)
    shown = {round(float(t.get_loc()), 12) for t in ax.yaxis._update_ticks() if t.label1.get_text()}
    plt.close(fig)
    decades = {10.0**k for k in range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)}
    assert {round(d, 12) for d in decades} <= shown


def test_an_axis_spanning_less_than_a_decade_shows_plain_numbers_of_one_format():
    """λ between 3.7 and 13 showed '4×10⁰', '6×10⁰', '10¹': now at least three plain numbers, each one the axis
    passes through, written as ``style.number`` writes them."""
    fig, ax = plt.subplots(figsize=(3, 4))
    ax.plot([0, 1], [3.7, 13.0])
    ax.set_yscale("log")
    style.finish(fig)
    labels = drawn_labels(ax, "y")
    low, high = ax.get_ylim()
    plt.close(fig)
    assert len(labels) >= 3, labels
    for label in labels:
        assert low <= float(label) <= high and label == style.number(float(label), 2)


@pytest.mark.parametrize(
    "x, text",
    [
        (3800.0, "3800"),
        (12700.0, "1.27×10⁴"),
        (1e5, "10⁵"),
        (2.5e-5, "2.5×10⁻⁵"),
        (0.0123, "0.0123"),
        (9.9996e6, "10⁷"),
    ],
)
def test_one_number_format(x, text):
    """'3.8e+03' beside an axis's '4×10³' becomes one format; the oracle: the text read back as a float."""
    assert style.number(x) == text
    assert read(text) == pytest.approx(x, rel=1e-3)


def read(text: str) -> float:
    """A number as ``style.number`` writes it, read back: '2.5×10⁻⁵', '10⁵', '3800'."""
    plain = text.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789"))
    if "10" not in plain or "×" not in plain and not text.startswith("10") or plain == text:
        return float(plain)
    mantissa, _, power = plain.rpartition("10")
    return float(mantissa.rstrip("×") or 1) * 10 ** float(power)


def test_bounded_axes_come_from_their_meaning():
    """An all-zero count of wrong answers spans 0…1, not −1…1; an accuracy spans 0…1 (or 0…100 %) whatever the
    data; heatmaps that are compared share the range of all of them."""
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1], [0, 0])
    style.count_axis(a, [0, 0])
    b.plot([0, 1], [0.5, 0.5])
    style.fraction_axis(b)
    assert a.get_ylim() == pytest.approx((0, 1.05)) and b.get_ylim() == pytest.approx((-0.03, 1.03))
    plt.close(fig)
    norm = style.shared_norm([np.array([[1e-4, 1e-2]]), np.array([[np.nan, 3e-1]])], log=True)
    assert (norm.vmin, norm.vmax) == (1e-4, 3e-1)
    assert charts.shared_scale([{"image": np.array([[1e-4, 0.0]])}, None, {"image": np.array([[np.inf, 0.3]])}]) == (
        1e-4,
        0.3,
    )


def test_a_saved_figure_records_its_smallest_font_in_the_pngs_pixels(tmp_path):
    """The PNG's text chunk holds the smallest font of the texts drawn, in the PNG's pixels (points × DPI / 72),
    wherever the text is: here a table's cell (not among the figure's children) at 6 pt, beside a title, tick
    labels, a legend and an annotation set larger, an invisible 2 pt text and an empty 1 pt one, which count
    for nothing. Oracle: the sizes set here."""
    from PIL import Image

    fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3))
    left.plot([1, 2], [1, 2], label="a run")
    left.set_title("a title", fontsize=11)
    left.tick_params(labelsize=8)
    left.legend(fontsize=7)
    left.annotate("a note", (1.5, 1.5), fontsize=6.5)
    left.text(1, 1, "hidden", fontsize=2, visible=False)
    left.text(1, 2, "", fontsize=1)
    right.set_axis_off()
    table = right.table(cellText=[["1", "2"], ["3", "4"]], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(6)
    path = style.save(fig, tmp_path / "f.png")
    with Image.open(path) as image:
        recorded = float(image.text[style.SMALLEST_FONT_KEY])
    assert recorded == pytest.approx(6 * style.DPI / 72, abs=0.01)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1, 2])
    ax.tick_params(labelsize=5)  # tick labels exist only once the axes are laid out
    with Image.open(style.save(fig, tmp_path / "g.png")) as image:
        assert float(image.text[style.SMALLEST_FONT_KEY]) == pytest.approx(5 * style.DPI / 72, abs=0.01)


def test_a_log_axis_narrower_than_one_and_a_half_still_gets_three_ticks():
    """0.40 … 0.52 (a clipped gradient norm) holds only 0.4 and 0.5 of 1…9: halves give 0.40, 0.45, 0.50."""
    subs = style.mantissas(0.399, 0.522)
    ticks = [m * 10.0**k for k in (-1, 0) for m in subs if 0.399 <= m * 10.0**k <= 0.522]
    assert ticks == pytest.approx([0.4, 0.45, 0.5])
