"""The one look every optiscope figure and report chart shares: colours, dashes, axes, numbers, an atomic save.

The visual language, used by the matplotlib figures and by the report's Bokeh charts alike:

- **Colour = optimizer recipe.** Each recipe has one colour everywhere (``OPTIMIZER_COLORS``); a recipe
  not in that table (a user's class path such as ``torch.optim.NAdam``) gets one from ``EXTRA_COLORS``
  chosen by a hash of its name, so it too is the same in every figure and every run. Several runs of one
  recipe at different η (``sgd@0.2``, ``sgd@0.5``) are shades of its colour, light for the smallest η and
  dark for the largest (``run_colors``); a run named without ``@η`` counts as the smallest.
- **Dashes = which curve of a run.** ``SOLID``: what the run measured as it trained (training loss,
  sharpness, u/w). ``DASHED``: the same run's second curve on the same chart (its held-out loss, its
  stability threshold, its gradient before clipping). ``DOTTED``: a reference no run made (a target, a
  "learned" bound, the step where a run diverged).
- **Lines of parts of one model** (layers, parameters) take ``CATEGORICAL`` colours in the model's order.
- **Log axes** are labelled at every decade they span, and an axis spanning less than a decade at plain
  numbers (``finish``); every number a figure writes uses ``number`` (``3.8×10³``, never ``3.8e+03``).
- **Bounded quantities** keep axes from their meaning (``fraction_axis``: 0–1; ``count_axis``: from 0), and
  heatmaps that are compared share one colour scale (``shared_norm``).

Figures are drawn with the Agg backend (no display needed) and saved without timestamps, so the same
``results.json`` always gives the same PNG bytes.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import struct
import textwrap
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.table import Table  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from ..runs import atomic_write_bytes  # noqa: E402

#: A figure is at most this wide, in inches (``DPI`` pixels each), and no text of it is smaller than ``SMALL`` points:
#: then the docs' text column (about 690 px at a 1,400 px window) shows every text of it at 9 px or more
#: (``LEGIBLE_PX``), and the report, wider, more. A figure with more panels grows downwards, never wider.
WIDTH = 8.6
SMALL = 8.5

BACKGROUND = "#fbfbf9"
INK = "#1c1c1c"
MUTED = "#6b6b6b"
GOOD = "#2e8b57"
BAD = "#b03a2e"
DPI = 150

OPTIMIZER_COLORS = {
    "sgd": "#b03a2e",
    "momentum": "#d4802a",
    "nesterov": "#b8a21b",
    "rmsprop": "#7d5ba6",
    "adam": "#1f6fb2",
    "adamw": "#1a9c8c",
    "adaml2": "#6aa8d8",
    "adam-no-bc": "#8fb3cf",
    "lion": "#c2478f",
    "muon": "#3b3b3b",
    "muon+adamw": "#6b8e23",  # olive: the brown it had read as sgd's red beside it
}

RC = {
    "figure.facecolor": BACKGROUND,
    "axes.facecolor": BACKGROUND,
    "savefig.facecolor": BACKGROUND,
    "axes.edgecolor": "#9a9a9a",
    "axes.labelcolor": INK,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3df",
    "grid.linewidth": 0.7,
    "xtick.color": INK,
    "ytick.color": INK,
    "xtick.labelsize": SMALL,
    "ytick.labelsize": SMALL,
    "legend.fontsize": SMALL,
    "legend.frameon": False,
    "text.color": INK,
    "font.family": "DejaVu Sans",
    "svg.hashsalt": "optiscope",
}


def apply() -> None:
    """Set optiscope's matplotlib defaults (every ``draw`` calls this first)."""
    plt.rcParams.update(RC)


#: Colours for recipes not in ``OPTIMIZER_COLORS`` (a user's class path), picked by a hash of the name: none is
#: close to a named recipe's (a gold beside nesterov's and an olive beside muon+adamw's were dropped).
EXTRA_COLORS = ("#8c564b", "#17becf", "#393b79", "#e7969c", "#7b4173", "#2ca02c", "#9c9ede")

#: Colours of the parts of one model (layers, parameters), in the model's order.
CATEGORICAL = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip

SOLID, DASHED, DOTTED = "-", "--", ":"
#: The same three in Bokeh's names, for the report.
BOKEH_DASHES = {SOLID: "solid", DASHED: "dashed", DOTTED: "dotted"}


def recipe(label: str) -> str:
    """The recipe a run label names: 'adam@1e-3' -> 'adam', 'lm-a: AdamW seed 2' -> 'adamw'."""
    return label.split(": ")[-1].split(" ")[0].split("@")[0].lower()


def optimizer_color(name: str, among: Iterable[str] = ()) -> str:
    """The colour of an optimizer recipe ('adam' and 'adam@1e-3' share Adam's).

    A recipe not in the table (a class path, a user's recipe) gets a colour of ``EXTRA_COLORS`` by a hash of its
    name, the same in every process; the other unknown recipes drawn beside it (``among``: every name on the
    chart) move on to the next free colour where two would share one, so no chart shows two recipes alike. The
    hash order decides who moves, so a chart's colours do not depend on the order of its names.
    """
    key = recipe(name)
    if key in OPTIMIZER_COLORS:
        return OPTIMIZER_COLORS[key]
    return _extra_colors({key, *map(recipe, among)})[key]


def _extra_colors(keys: Iterable[str]) -> dict[str, str]:
    unknown = sorted((k for k in set(keys) if k not in OPTIMIZER_COLORS), key=lambda k: (_slot(k), k))
    taken: dict[str, str] = {}
    for key in unknown:
        slot = _slot(key)
        free = [i for i in range(len(EXTRA_COLORS)) if EXTRA_COLORS[i] not in taken.values()]
        # the first free colour at or after the hashed one (cyclically); all taken: share the hashed one
        choice = min(free, key=lambda i: (i - slot) % len(EXTRA_COLORS)) if free else slot
        taken[key] = EXTRA_COLORS[choice]
    return taken


def _slot(key: str) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % len(EXTRA_COLORS)


def shade(color: str, t: float) -> str:
    """``color`` mixed towards white by ``t`` > 0 or towards black by ``-t`` (|t| ≤ 1), as '#rrggbb'."""
    rgb = np.array(matplotlib.colors.to_rgb(color))
    mixed = rgb + (1 - rgb) * t if t > 0 else rgb * (1 + t)
    return matplotlib.colors.to_hex(np.clip(mixed, 0, 1))


def run_colors(labels: Iterable[str]) -> dict[str, str]:
    """label -> colour for the runs of one chart: a recipe's only run in the recipe's colour; several runs of
    one recipe in shades of it from light (smallest η) to dark (largest), a run named without '@η' first.

    Labels that name the same run ('adam sharpness', 'adam threshold') share its colour."""
    runs = {label: label.split(": ")[-1].split(" ")[0] for label in labels}
    groups: dict[str, list[str]] = {}
    for run in dict.fromkeys(runs.values()):
        groups.setdefault(recipe(run), []).append(run)
    colors = {}
    for key, members in groups.items():
        members.sort(key=lambda run: _eta(run))
        steps = np.linspace(0.45, -0.4, len(members)) if len(members) > 1 else [0.0]
        base = optimizer_color(key, groups)
        colors.update({run: shade(base, float(t)) for run, t in zip(members, steps, strict=True)})
    return {label: colors[run] for label, run in runs.items()}


def _eta(run: str) -> float:
    try:
        return float(run.split("@")[1]) if "@" in run else -math.inf
    except ValueError:  # a label whose '@' is not a learning rate: order it with the unnamed ones
        return -math.inf


def number(x: float, digits: int = 3, scientific: bool | None = None) -> str:
    """``x`` to ``digits`` significant figures, the one way figures write numbers: plainly from 10⁻³ to 10⁴,
    else as ``m×10ᵏ`` ('3.8×10³' is '3800'; '1.27×10⁴'), the form the log axes' labels take; ``scientific``
    True or False forces one form (the labels of one axis share theirs)."""
    if not math.isfinite(x) or x == 0:
        return format(x, "g")
    exponent = math.floor(math.log10(abs(x)))
    plain = -3 <= exponent < 4 if scientific is None else not scientific
    if plain:
        return format(x, f".{max(digits, exponent + 1)}g")
    mantissa = format(x / 10**exponent, f".{digits}g")
    if float(mantissa) >= 10:  # 9.996 rounds up to the next decade
        mantissa, exponent = format(float(mantissa) / 10, f".{digits}g"), exponent + 1
    power = "10" + str(exponent).translate(SUPERSCRIPTS)
    return power if mantissa == "1" else f"{mantissa}×{power}"


SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def label_decades(ax, axis: str) -> None:
    """Tick labels for a log ``axis`` ('x' or 'y') of ``ax``: one at every decade it spans (matplotlib skips
    decades on a long axis), and, on an axis spanning under a decade, at least three numbers (``mantissas``)
    written alike by ``number`` instead of a lone 10ᵏ."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    decades = math.log10(high) - math.log10(low)  # high / low overflows on an axis from 1e-300 to 1e300
    if decades >= 1:
        target.set_major_locator(ticker.LogLocator(base=10, numticks=100))
        target.set_minor_locator(ticker.LogLocator(base=10, subs=np.arange(2, 10) * 1.0, numticks=100))
        target.set_minor_formatter(ticker.NullFormatter())
    else:
        target.set_major_locator(ticker.LogLocator(base=10, subs=mantissas(low, high), numticks=100))
        scientific = not (low >= 1e-3 and high < 1e4)  # one form for every label of the axis
        target.set_major_formatter(ticker.FuncFormatter(lambda x, _: number(x, 2, scientific)))
        target.set_minor_formatter(ticker.NullFormatter())


def mantissas(low: float, high: float) -> tuple[float, ...]:
    """The sparsest of 1-2-5, 1-2-3-5-7, 1…9, 1…9.5 by halves and 1…9.9 by tenths (× 10ᵏ) that puts three ticks
    between ``low`` and ``high``."""
    powers = range(math.floor(math.log10(low)), 1 + math.ceil(math.log10(high)))

    def steps(n: int) -> tuple[float, ...]:
        return tuple((n + i) / n for i in range(9 * n))

    choices = ((1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), steps(1), steps(2))
    for subs in choices:
        if sum(low <= m * 10.0**k <= high for m in subs for k in powers) >= 3:
            return subs
    return steps(10)


def fraction_axis(ax, axis: str = "y", whole: float = 1.0) -> None:
    """A fraction's axis (an accuracy, a share): 0 to ``whole`` (1, or 100 for a percentage) whatever the data,
    a little room at both ends."""
    (ax.set_xlim if axis == "x" else ax.set_ylim)(-0.03 * whole, 1.03 * whole)


def count_axis(ax, values, axis: str = "y") -> None:
    """A count's axis (wrong digits, steps): from 0 to the largest finite count, at least 1, never below 0."""
    top = np.nanmax(finite(values), initial=0)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(0, max(1.0, top) * 1.05)


def shared_norm(arrays, log: bool = False) -> Normalize:
    """One colour scale for heatmaps that are compared: from the smallest to the largest finite value of all of
    ``arrays`` (positive ones on a ``log`` scale); (0, 1) where none is."""
    values = np.concatenate([finite(np.ravel(a)) for a in arrays] or [np.array([])])
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    low, high = (values.min(), values.max()) if values.size else (1e-3 if log else 0.0, 1.0)
    high = high if high > low else (low * 10 if log else low + 1)
    return LogNorm(low, high) if log else Normalize(low, high)


def ramp(n: int, start: str = "#1f4e8c", end: str = "#b03a2e") -> list[tuple[float, float, float]]:
    """``n`` colours from ``start`` (common, blue) to ``end`` (rare, red), evenly mixed in RGB."""
    a = np.array(matplotlib.colors.to_rgb(start))
    b = np.array(matplotlib.colors.to_rgb(end))
    return [tuple(a + (b - a) * t) for t in np.linspace(0, 1, n)] if n > 1 else [tuple(a)]


def note(ax, text: str, xy: tuple[float, float], color: str = INK, **kwargs) -> None:
    """A boxed annotation in axes coordinates."""
    ax.text(
        *xy,
        text,
        transform=ax.transAxes,
        fontsize=SMALL,
        color=color,
        va=kwargs.pop("va", "top"),
        ha=kwargs.pop("ha", "left"),
        bbox=dict(boxstyle="round,pad=0.35", facecolor="white", edgecolor=color, alpha=0.9, lw=0.8),
        **kwargs,
    )


def close_all() -> None:
    plt.close("all")


#: Magnitudes beyond this are drawn like inf (left out): matplotlib cannot lay out axes that reach them.
DRAWABLE = 1e200


def finite(values) -> np.ndarray:
    """``values`` as floats with inf, nan, None and magnitudes beyond ``DRAWABLE`` as nan, which
    matplotlib leaves out."""
    array = np.array([] if values is None else values, dtype=object)
    array = np.where(np.equal(array, None), np.nan, array).astype(float)
    return np.where(np.abs(array) <= DRAWABLE, array, np.nan)


def positive(values) -> np.ndarray:
    """``values`` with every entry that a log axis cannot show (≤ 0, inf, nan) as nan."""
    array = finite(values)
    return np.where(array > 0, array, np.nan)


def log_scale(ax, axis: str, *data, empty: str = "no positive values to show on a log scale") -> bool:
    """Put ``axis`` ('x' or 'y') on a log scale if any of ``data`` has a finite positive value; otherwise
    keep it linear and say so on the panel (``empty``: why, where the caller knows). Returns whether the
    scale is logarithmic."""
    if any(np.any(np.isfinite(positive(d))) for d in data if d is not None and np.size(d)):
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        return True
    ax.text(
        0.5,
        0.5,
        empty,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=SMALL,
        color=MUTED,
    )
    return False


def finish(fig: Figure) -> None:
    """The last touches every figure gets before it is saved: a log axis whose limits are not positive goes
    back to a linear scale (every point with a positive coordinate was left out for its other one, nan or
    inf, and matplotlib cannot lay such an axis out); every other log axis is labelled at each decade it
    spans (``label_decades``)."""
    for ax in fig.axes:
        if getattr(ax, "name", "") == "3d":
            continue
        for axis, scale, limits in (("x", ax.get_xscale(), ax.get_xlim()), ("y", ax.get_yscale(), ax.get_ylim())):
            if scale != "log":
                continue
            if np.all(np.isfinite(limits)) and min(limits) > 0:
                label_decades(ax, axis)
            else:
                (ax.set_xscale if axis == "x" else ax.set_yscale)("linear")


def lone_marker(xs) -> dict[str, object]:
    """``ax.plot`` keywords that mark the points of a line of one point, which a line alone does not draw."""
    return {"marker": "o", "ms": 4} if len(xs) == 1 else {}


def nothing_to_show(ax, text: str) -> None:
    """An empty panel that says why it is empty."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color=MUTED, wrap=True)


def unrounded(value: float, text: Callable[[int], str], digits: Iterable[int]) -> str:
    """``text(d)`` for the first d of ``digits`` that does not round ``value`` onto a whole number it is not (a
    sharpness/threshold of 0.996, short of its threshold, or 1.0004, past it, must not read "1"); the last
    d's when each does."""
    for d in digits:
        shown = text(d)
        if "e" in shown or float(shown) == value or not float(shown).is_integer():
            return shown
    return shown


def wrap_name(name: str, width: int = 12) -> str:
    """``name`` (an optimizer's, or its description) on lines of at most ``width`` characters, broken after a
    space, '-', '_', '.' or '+' ('schedule-free-adamw' -> 'schedule-\\nfree-adamw'), for a label in a slot too
    narrow for it; a part longer than ``width`` stays whole."""
    lines = [""]
    for part in re.findall(r"[^-_.+ ]+[-_.+ ]?|[-_.+ ]", name):
        if lines[-1] and len(lines[-1]) + len(part.rstrip()) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(line.rstrip() for line in lines)


def panels(n: int, height: float, extra: float = 1.0, **kwargs) -> tuple[Figure, np.ndarray]:
    """A figure of ``n`` panels, two to a row (more make it taller, never wider), each ``height`` inches tall, with
    ``extra`` inches for titles and legends; the panels as a 2-D array, those past ``n`` switched off."""
    cols = min(2, max(n, 1))
    rows = max(math.ceil(n / cols), 1)
    size = (WIDTH, height * rows + extra)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, layout="constrained", **kwargs)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, axes


def column(columns: int) -> float:
    """The width, in inches, a panel's title may take in a figure of ``columns`` panels side by side (its axis
    labels take the rest)."""
    return WIDTH / columns * 0.85


def fill(text: str, width: float, size: float = SMALL) -> str:
    """``text`` broken at spaces into lines that fit ``width`` inches at ``size`` points (a title or note over a
    panel of that width: matplotlib wraps only at the figure's edge); existing line breaks are kept."""
    per_line = max(12, int(width * 72 / (0.62 * size)))  # DejaVu Sans: about 0.6 em a character, bold a little more
    return "\n".join(textwrap.fill(line, per_line, break_on_hyphens=False) for line in text.split("\n"))


def fmt(x, spec: str = ".3g", missing: str = "—") -> str:
    """``x`` formatted, or ``missing`` for None (numbers that are nan or inf print as such)."""
    return missing if x is None else format(x, spec)


#: The PNG text chunk that holds a figure's smallest font size in the PNG's pixels (``smallest_font_px``): a page that
#: shows the PNG at w of its W pixels renders that text at size × w / W, which must stay legible (``LEGIBLE_PX``).
SMALLEST_FONT_KEY = "optiscope-smallest-font-px"
#: The smallest text a page may render of a figure, in CSS pixels: the docs' text column and the report, at a
#: 1,400-pixel window, show every figure at a width that keeps its smallest font at least this large.
LEGIBLE_PX = 9.0


def smallest_font_px(fig: Figure) -> float:
    """The smallest font size among the texts ``fig`` shows, in pixels of its PNG at ``DPI`` (points × DPI / 72).

    Every visible, non-empty text counts: titles, labels, tick labels, legends, annotations and table cells. NaN
    for a figure without text. Read it once the figure is drawn: its tick labels exist only then.
    """
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    # a table's cells are not among the figure's children: their texts are reached through the table
    texts += [c.get_text() for table in fig.findobj(Table) for c in table.get_celld().values() if c.get_visible()]
    sizes = [t.get_fontsize() for t in texts if t.get_visible() and t.get_text().strip()]
    return min(sizes) * DPI / 72 if sizes else math.nan


def with_text(png: bytes, key: str, value: str) -> bytes:
    """``png`` with a ``tEXt`` chunk ``key: value`` (Latin-1) before its closing ``IEND`` chunk: a chunk is its
    data's length, its type, the data and the CRC-32 of type and data (the PNG specification, 5.3 and 11.3.4.3).

    Example:
        >>> import io; from PIL import Image
        >>> buffer = io.BytesIO(); Image.new("L", (1, 1)).save(buffer, "PNG")
        >>> Image.open(io.BytesIO(with_text(buffer.getvalue(), "answer", "42"))).text
        {'answer': '42'}
    """
    if png[-8:-4] != b"IEND":
        raise ValueError("not a PNG that ends with its IEND chunk")
    data = key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:-12] + chunk + png[-12:]


def save(fig: Figure, path: Path) -> Path:
    """Render ``fig`` to PNG and write it atomically, its smallest font size in a text chunk (``SMALLEST_FONT_KEY``,
    read from the texts as drawn: laying the figure out once more only for it cost a third of the drawing time);
    closes the figure."""
    finish(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    smallest = smallest_font_px(fig)
    plt.close(fig)
    return atomic_write_bytes(Path(path), with_text(buffer.getvalue(), SMALLEST_FONT_KEY, f"{smallest:.2f}"))
