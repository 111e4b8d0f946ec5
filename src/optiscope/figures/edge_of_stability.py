"""Figures of the ``edge-of-stability`` experiment, drawn from its results.json alone.

* ``sharpness.png`` — runs judged by λ₁(H) (gradient descent, momentum): sharpness against step with each
  run's threshold (2/η, 3.8/η) dashed in its colour, and the training loss below.
* ``preconditioned.png`` — runs judged by λ₁(P⁻¹H) (Adam): the same with 38/η.

Titles carry the measured equilibrium ratio (median sharpness/threshold after a run first reached its edge),
or say where a run diverged.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style

if TYPE_CHECKING:
    from ..experiments.edge_of_stability import Results, RunResults


def _title(runs: list[RunResults], what: str, edge: float) -> str:
    if not runs:
        return f"{what}: no run of this kind in these results"
    parts = []
    for r in runs:
        if r["equilibrium"] is not None:
            parts.append(f"{r['label']} {style.fmt(r['equilibrium'], '.2f')}×")
        elif r["status"] == "diverged":
            parts.append(f"{r['label']}{_status(r)}")
    if not parts:
        return f"{what}: no run reached {edge:g}× its threshold"
    lines = textwrap.wrap(f"median sharpness/threshold once at {edge:g}× or more: {', '.join(parts)}", 110)
    return "\n".join([f"{what} against its threshold", *lines])


def _panel(results: Results, preconditioned: bool, what: str) -> Figure:
    chosen = [r for r in results["runs"] if r["preconditioned"] is preconditioned]
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(9, 7),
        sharex=True,
        height_ratios=[3, 2],
        layout="constrained",  # room for title and legend
    )
    fig.suptitle(_title(chosen, what, results["edge"]), fontsize=10)
    if not chosen:
        style.nothing_to_show(top, "no run of this kind in these results")
        style.nothing_to_show(bottom, "")
        return fig
    shades = _shades(chosen)
    sharp_values: list[Any] = []
    for run, color in zip(chosen, shades, strict=True):
        steps, sharp, loss = style.finite(run["step"]), style.finite(run["sharpness"]), style.finite(run["loss"])
        n = min(len(steps), len(sharp), len(loss))
        marker = "o" if n == 1 else None  # one measurement before a divergence draws no line
        top.plot(steps[:n], sharp[:n], color=color, lw=1.6, marker=marker, ms=4, label=f"{run['label']}{_status(run)}")
        bottom.plot(steps[:n], loss[:n], color=color, lw=1.2, marker=marker, ms=4)
        sharp_values.append(sharp)
        if run["threshold"] is not None and np.isfinite(run["threshold"]) and abs(run["threshold"]) < style.DRAWABLE:
            top.axhline(run["threshold"], color=color, ls="--", lw=1)
            top.annotate(
                f"{run['threshold_label']} = {style.fmt(run['threshold'])}",
                (1.0, run["threshold"]),
                xycoords=("axes fraction", "data"),
                xytext=(3, 0),
                textcoords="offset points",
                fontsize=7.5,
                color=color,
                va="center",
            )
            sharp_values.append([run["threshold"]])
        if run["edge_step"] is not None:
            top.axvline(run["edge_step"], color=color, lw=0.6, alpha=0.4)
    top.set_ylabel("preconditioned sharpness λ₁(P⁻¹H)" if preconditioned else "sharpness λ₁(H)")
    style.log_scale(top, "y", *sharp_values)
    # above the panel, clear of the curves and the dashed thresholds
    top.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(len(chosen), 4), frameon=False, fontsize=8)
    bottom.set_ylabel("training loss (full batch)")
    bottom.set_xlabel("step")
    style.log_scale(bottom, "y", *[r["loss"] for r in chosen])
    return fig


def _shades(runs: list[RunResults]) -> list[Any]:
    """Each run in its recipe's colour, lighter for smaller learning rates of the same recipe."""
    out = []
    for i, run in enumerate(runs):
        same = sorted({r["lr"] for r in runs if r["optimizer"] == run["optimizer"]})
        base = np.array(plt.matplotlib.colors.to_rgb(style.optimizer_color(run["optimizer"], i)))
        mix = 0.55 * (1 - (same.index(run["lr"]) + 1) / len(same)) if len(same) > 1 else 0.0
        out.append(tuple(base + (1 - base) * mix))
    return out


def _status(run: RunResults) -> str:
    if run["status"] == "diverged":
        step = (run["divergence"] or {}).get("step")
        return f" (diverged at step {step})"
    return ""


def sharpness(results: Results) -> Figure:
    return _panel(results, False, "Full-batch GD and momentum: sharpness")


def preconditioned(results: Results) -> Figure:
    return _panel(results, True, "Adam: preconditioned sharpness")


FIGURES = {"sharpness.png": sharpness, "preconditioned.png": preconditioned}
