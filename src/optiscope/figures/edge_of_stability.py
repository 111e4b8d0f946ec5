"""Figures of the ``edge-of-stability`` experiment, drawn from its results.json alone.

* ``sharpness.png`` — runs judged by λ₁(H) (gradient descent, momentum): sharpness against step with each
  run's threshold (2/η, 3.8/η) dashed in its colour, and the training loss below.
* ``preconditioned.png`` — runs judged by λ₁(P⁻¹H) (Adam): the same with 38/η.

Titles name the panel's optimizers and account for every run: the measured equilibrium ratio (median
sharpness/threshold after a run first reached its edge), the largest ratio of a run that never reached its edge,
or where a run diverged (and whether it had reached its edge before). A thin vertical line marks where a run
reached its edge (never for a diverged run that got there only by blowing up), a dotted one where it diverged.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style

if TYPE_CHECKING:
    from ..experiments.edge_of_stability import Results, RunResults


def _title(runs: list[RunResults], what: str, edge: float) -> str:
    """What every run did, none left out: the equilibrium ratio of those that reached ``edge`` × their threshold,
    the largest ratio of those that never did, and where each diverged run did (after its edge, if it got there)."""
    if not runs:
        return f"{what}: no run of this kind in these results"
    reached = [f"{r['label']} {_ratio(r['equilibrium'])}×" for r in runs if r["equilibrium"] is not None]
    short = [
        f"{r['label']} (at most {_ratio(r['max_ratio'])}×)"
        for r in runs
        if r["equilibrium"] is None and r["status"] != "diverged"
    ]
    diverged = [f"{r['label']}{_diverged_at(r, edge)}" for r in runs if r["status"] == "diverged"]
    clauses = [
        *([f"median sharpness/threshold once at {edge:g}× or more: {', '.join(reached)}"] if reached else []),
        *([f"never reached {edge:g}× its threshold: {', '.join(short)}"] if short else []),
        *([", ".join(diverged)] if diverged else []),
    ]
    return "\n".join([f"{what} against each run's threshold", "; ".join(clauses)])  # broken to width by the figure


def _ratio(x: Any) -> str:
    """A ratio to two decimals, unless they round it onto a whole number it is not (0.996 is short of its
    threshold and must not read "1.00"; more decimals then), or the sign of a value that is no number: NaN, ∞
    or −∞ (a title's short forms; the report's headlines spell NaN out)."""
    if x is None:
        return "—"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return style.unrounded(x, lambda decimals: f"{x:.{decimals}f}", range(2, 9))


def _diverged_at(run: RunResults, edge: float) -> str:
    before = f", which had reached {edge:g}× at step {run['edge_step']}" if edge_before_divergence(run) else ""
    return _status(run) + before


def _divergence_step(run: RunResults) -> Any:
    return (run.get("divergence") or {}).get("step") if run.get("status") == "diverged" else None


def edge_before_divergence(run: RunResults) -> bool:
    """Whether the run reached its edge and, if it diverged, did so before the step it diverged at: a diverged
    run's blow-up is no edge reached. (The report's headlines read it too.)"""
    edge = run.get("edge_step")
    if not isinstance(edge, int | float):
        return False
    if run.get("status") != "diverged":
        return True
    step = _divergence_step(run)
    return isinstance(step, int | float) and edge < step


def _what(runs: list[RunResults], preconditioned: bool) -> str:
    """The optimizers of the panel's runs, by name, and the sharpness they are judged by; for a panel without
    runs, the kind of optimizer it would draw."""
    if not runs:
        return "Adam: preconditioned sharpness" if preconditioned else "Full-batch GD and momentum: sharpness"
    names = ", ".join(dict.fromkeys(r["optimizer"] for r in runs))
    return f"{names}: {'preconditioned sharpness λ₁(P⁻¹H)' if preconditioned else 'sharpness λ₁(H)'}"


def _panel(results: Results, preconditioned: bool) -> Figure:
    chosen = [r for r in results["runs"] if r["preconditioned"] is preconditioned]
    what = _what(chosen, preconditioned)
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(style.WIDTH, 7.5),
        sharex=True,
        height_ratios=[3, 2],
        layout="constrained",  # room for title and legend
    )
    fig.suptitle(style.fill(_title(chosen, what, results["edge"]), style.WIDTH, 10.5), fontsize=10.5)
    if not chosen:
        style.nothing_to_show(top, "no run of this kind in these results")
        style.nothing_to_show(bottom, "")
        return fig
    colors = style.run_colors(r["label"] for r in chosen)
    shades = [colors[r["label"]] for r in chosen]
    sharp_values: list[Any] = []
    labels: list[Any] = []  # the thresholds' labels, right of the panel
    for run, color in zip(chosen, shades, strict=True):
        steps, sharp, loss = style.finite(run["step"]), style.finite(run["sharpness"]), style.finite(run["loss"])
        n = min(len(steps), len(sharp), len(loss))
        marker = "o" if n == 1 else None  # one measurement before a divergence draws no line
        top.plot(steps[:n], sharp[:n], color=color, lw=1.6, marker=marker, ms=4, label=f"{run['label']}{_status(run)}")
        bottom.plot(steps[:n], loss[:n], color=color, lw=1.2, marker=marker, ms=4)
        sharp_values.append(sharp)
        if run["threshold"] is not None and np.isfinite(run["threshold"]) and abs(run["threshold"]) < style.DRAWABLE:
            top.axhline(run["threshold"], color=color, ls=style.DASHED, lw=1)
            labels.append(
                top.annotate(
                    f"{run['threshold_label']} = {style.number(run['threshold'])}",
                    (1.0, run["threshold"]),
                    xycoords=("axes fraction", "data"),
                    xytext=(3, 0),
                    textcoords="offset points",
                    fontsize=style.SMALL,
                    color=color,
                    va="center",
                )
            )
            sharp_values.append([run["threshold"]])
        if edge_before_divergence(run):
            top.axvline(run["edge_step"], color=color, lw=0.6, alpha=0.4)
        if isinstance(_divergence_step(run), int | float):
            for ax in (top, bottom):
                ax.axvline(_divergence_step(run), color=color, ls=style.DOTTED, lw=1.2)
    top.set_ylabel("preconditioned sharpness λ₁(P⁻¹H)" if preconditioned else "sharpness λ₁(H)")
    style.log_scale(top, "y", *sharp_values)
    # above the panel, clear of the curves and the dashed thresholds
    # above the panel's right end: its left end holds the axis's offset ("1e−17") where the values are tiny
    top.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=min(len(chosen), 3), frameon=False)
    top.text(
        0.01,
        0.01,
        f"thin line: where a run first reached {results['edge']:g}× its threshold; dotted: where it diverged",
        transform=top.transAxes,
        fontsize=style.SMALL,
        color="0.4",
        va="bottom",
    )
    bottom.set_ylabel("training loss (full batch)")
    bottom.set_xlabel("step")
    style.log_scale(bottom, "y", *[r["loss"] for r in chosen])
    _apart(fig, labels)
    return fig


def _apart(fig: Figure, labels: list[Any]) -> None:
    """Moves the thresholds' labels up, each just clear of the one below it where two thresholds are so close
    that their labels would overlap; the dashed lines stay where the thresholds are."""
    if len(labels) < 2:
        return
    fig.canvas.draw()  # the layout places the axes: the labels' extents are final
    points_per_pixel = 72 / fig.dpi
    below = -math.inf
    for label in sorted(labels, key=lambda a: a.get_window_extent().y0):
        box = label.get_window_extent()
        shift = max(0.0, below - box.y0 + 1)  # pixels up, one more for a hairline between them
        if shift:
            x, y = label.xyann
            label.xyann = (x, y + shift * points_per_pixel)
        below = box.y1 + shift


def _status(run: RunResults) -> str:
    if run["status"] == "diverged":
        step = _divergence_step(run)
        return f" (diverged at step {step})" if step is not None else " (diverged)"
    return ""


def sharpness(results: Results) -> Figure:
    return _panel(results, False)


def preconditioned(results: Results) -> Figure:
    return _panel(results, True)


FIGURES = {"sharpness.png": sharpness, "preconditioned.png": preconditioned}
