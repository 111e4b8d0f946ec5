"""The one look every optiscope figure shares: colours per optimizer, fonts, and an atomic save.

Figures are drawn with the Agg backend (no display needed) and saved without timestamps, so the same
``results.json`` always gives the same PNG bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..runs import atomic_write_bytes  # noqa: E402

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
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3df",
    "grid.linewidth": 0.7,
    "xtick.color": INK,
    "ytick.color": INK,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "text.color": INK,
    "font.family": "DejaVu Sans",
    "svg.hashsalt": "optiscope",
}


def apply() -> None:
    """Set optiscope's matplotlib defaults (every ``draw`` calls this first)."""
    plt.rcParams.update(RC)


def optimizer_color(name: str, fallback_index: int = 0) -> str:
    """The colour of an optimizer recipe ('adam' and 'adam@1e-3' share Adam's); every recipe has its own."""
    key = name.lower().split("@")[0]
    return OPTIMIZER_COLORS.get(key) or plt.get_cmap("tab10")(fallback_index % 10)


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
        fontsize=8,
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
        fontsize=8,
        color=MUTED,
    )
    return False


def linear_where_nothing_positive(fig: Figure) -> None:
    """Return to a linear scale every log axis whose limits are not positive: that happens when every
    point with a positive coordinate was left out for its other coordinate (nan or inf), and
    matplotlib could not lay such an axis out."""
    for ax in fig.axes:
        for axis, scale, limits in (("x", ax.get_xscale(), ax.get_xlim()), ("y", ax.get_yscale(), ax.get_ylim())):
            if scale == "log" and not (np.all(np.isfinite(limits)) and min(limits) > 0):
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


def fmt(x, spec: str = ".3g", missing: str = "—") -> str:
    """``x`` formatted, or ``missing`` for None (numbers that are nan or inf print as such)."""
    return missing if x is None else format(x, spec)


def save(fig: Figure, path: Path) -> Path:
    """Render ``fig`` to PNG and write it atomically; closes the figure."""
    linear_where_nothing_positive(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return atomic_write_bytes(Path(path), buffer.getvalue())
