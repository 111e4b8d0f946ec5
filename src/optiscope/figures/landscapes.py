"""Figures of the landscapes experiment, drawn from its results.json alone.

* ``landscapes.png`` — contours of the ravine, the saddle and Rosenbrock with every optimizer's path at
  its best learning rate, and f − f* against the step.
* ``convergence_table.png`` — steps to reach the tolerance per optimizer and surface at the best η, and
  the whole learning-rate grid behind it.
* ``bias_correction.png`` and ``adamw_vs_adaml2.png`` — see ``figures.bias_correction`` and
  ``figures.weight_decay``.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from . import style
from .bias_correction import bias_correction
from .weight_decay import weight_decay

SURFACE_TITLES = {"ravine": "Ravine", "saddle": "Saddle", "rosenbrock": "Rosenbrock"}


def outcome(run: dict[str, Any], budget: int) -> str:
    """'97 steps (η = 0.01)', 'not reached in 3000 steps …' or 'diverged at every η'."""
    if run["best_lr"] is None:
        return "diverged at every η"
    if run["reached_at"] is None:
        return f"not reached in {budget} steps\n(closest: f − f* = {run['final_gap']:.2g} at η = {run['best_lr']:g})"
    return f"{run['reached_at']} steps (η = {run['best_lr']:g})"


# -------------------------------------------------------------------------------------- contours
def plot_contours(ax, surface: dict[str, Any]) -> None:
    contours = surface["contours"]
    gap = style.positive(contours["gap"])
    top = np.nanmax(gap) if np.isfinite(gap).any() else np.nan
    bottom = max(np.nanmin(gap), top * 1e-6) if np.isfinite(top) else np.nan
    if np.isfinite(top) and bottom < top:  # log-spaced contours of f − f*, where it has a range to show
        levels = np.geomspace(bottom, top, 16)
        shaded = np.clip(np.nan_to_num(gap, nan=bottom), bottom, top)
        ax.contourf(contours["x"], contours["y"], shaded, levels=levels, norm=LogNorm(), cmap="Greys_r", alpha=0.35)
        ax.contour(
            contours["x"], contours["y"], shaded, levels=levels, norm=LogNorm(), colors="#8a8a8a", linewidths=0.5
        )
    colors = style.run_colors(surface["runs"])
    for name, run in surface["runs"].items():
        if not run["path"]:
            continue
        path = style.finite(run["path"]).reshape(-1, 2)
        color = colors[name]
        ax.plot(path[:, 0], path[:, 1], color=color, lw=1.3, alpha=0.9)
        ax.plot(*path[-1], marker="o", ms=4, color=color)
    ax.plot(*surface["start"], marker="o", ms=7, color=style.INK, zorder=6)
    ax.annotate("start", surface["start"], textcoords="offset points", xytext=(6, 6), fontsize=style.SMALL)
    for minimum in surface["minima"]:
        ax.plot(*minimum, marker="*", ms=13, color="gold", markeredgecolor=style.INK, zorder=6)
    x_min, x_max, y_min, y_max = surface["extent"]
    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.grid(False)


def plot_gap_curves(ax, surface: dict[str, Any], tolerance: float, budget: int) -> None:
    colors = style.run_colors(surface["runs"])
    for name, run in surface["runs"].items():
        if run["gap_curve"] is None:
            continue
        steps = np.asarray(run["gap_curve"]["steps"], dtype=float)
        values = style.positive(run["gap_curve"]["values"])  # log axes: an exact 0 cannot be drawn
        ax.plot(
            np.maximum(steps, 1),
            values,
            color=colors[name],
            lw=1.4,
            label=f"{name} (η = {run['best_lr']:g})",
        )
    if all(run["gap_curve"] is None for run in surface["runs"].values()):
        style.note(ax, "every run diverged at every η: no curve to draw", (0.5, 0.5), ha="center", va="center")
    ax.axhline(tolerance, color=style.GOOD, lw=0.9, ls="--")
    ax.text(1, tolerance, f" tolerance {tolerance:g}", color=style.GOOD, fontsize=style.SMALL, va="bottom")
    ax.axvline(budget, color=style.MUTED, lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1, budget * 1.3)  # steps from the first to the budget, with or without a curve on them
    ax.set_xlabel("step (log scale)")
    ax.set_ylabel("f − f* (log scale)")


def landscapes(results: dict[str, Any]) -> Figure:
    names = list(results["surfaces"])
    # a surface per row, its paths beside its f − f* curves: more surfaces make the figure taller, never wider
    fig, axes = plt.subplots(
        len(names), 2, figsize=(style.WIDTH, 5.2 * len(names)), squeeze=False, layout="constrained"
    )
    half = style.column(2)
    for row, name in enumerate(names):
        surface = results["surfaces"][name]
        plot_contours(axes[row, 0], surface)
        winners = surface["fastest"]
        verdict = f"fastest: {', '.join(winners)}" if winners else "no optimizer reached the tolerance"
        title = f"{SURFACE_TITLES.get(name, name)}: {surface['formula']}\n{verdict}"
        axes[row, 0].set_title(style.fill(title, half, 10.5), fontsize=10.5)
        plot_gap_curves(axes[row, 1], surface, results["tolerance"], results["steps"])
        axes[row, 1].set_title(style.fill("f − f* at each optimizer's best η (colours of the paths)", half, 10))
        if axes[row, 1].get_legend_handles_labels()[1]:
            axes[row, 1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    grid = ", ".join(f"{lr:g}" for lr in results["lrs"])
    title = (
        f"Optimizer paths at each one's best learning rate from the grid {grid}"
        f" (budget {results['steps']} steps; a path ends where f − f* ≤ {results['tolerance']:g})"
    )
    fig.suptitle(style.fill(title, style.WIDTH, 12), fontsize=12, fontweight="bold")
    return fig


# ----------------------------------------------------------------------------------------- table
def grid_cell(entry: dict[str, Any]) -> str:
    if entry["reached_at"] is not None:
        return str(entry["reached_at"])
    return "div." if entry["diverged_at"] is not None else "—"


def convergence_table(results: dict[str, Any]) -> Figure:
    surfaces = results["surfaces"]
    names = list(surfaces)
    optimizers = list(next(iter(surfaces.values()))["runs"])
    settings = [surfaces[names[0]]["runs"][o]["setting"] for o in optimizers]
    # the optimizer's column a third of the width, the surfaces' the rest; each cell's text broken to fit its column
    widths = [1 / 3] + [2 / 3 / len(names)] * len(names)
    inner = [0.75 * w * style.WIDTH for w in widths]  # inches of text a cell holds: matplotlib pads a tenth each side
    described = [
        style.wrap_name(f"{o}: {s}", int(inner[0] * 72 / (0.62 * style.SMALL)))
        for o, s in zip(optimizers, settings, strict=True)
    ]
    cells, colors = [], []
    for optimizer in optimizers:
        row, row_colors = [], []
        for name in names:
            run = surfaces[name]["runs"][optimizer]
            row.append(style.fill(outcome(run, results["steps"]), inner[1]))
            if optimizer in surfaces[name]["fastest"]:
                row_colors.append("#d7eedf")
            elif run["reached_at"] is None:
                row_colors.append("#f6dcd8")
            else:
                row_colors.append("white")
        cells.append(row)
        colors.append(row_colors)
    header = [
        "optimizer",
        *(style.fill(f"{SURFACE_TITLES.get(n, n)}: {surfaces[n]['formula']}", inner[1]) for n in names),
    ]
    lines = max(
        text.count("\n") + 1
        for row in [header, *zip(described, *zip(*cells, strict=True), strict=True)]
        for text in row
    )  # every row as tall as the tallest (the table spreads its rows evenly)
    table_height = 0.24 * lines * (len(optimizers) + 1) + 0.6  # the title above it takes a share of its row
    heat_height = 1.2 + 0.3 * len(optimizers)
    fig = plt.figure(figsize=(style.WIDTH, 0.8 + table_height + heat_height * len(names)), layout="constrained")
    grid = fig.add_gridspec(1 + len(names), 1, height_ratios=[table_height] + [heat_height] * len(names))

    table_ax = fig.add_subplot(grid[0])
    table_ax.axis("off")
    table = table_ax.table(
        cellText=[[d, *row] for d, row in zip(described, cells, strict=True)],
        cellColours=[["white", *row] for row in colors],
        colLabels=header,
        colWidths=widths,
        cellLoc="center",
        bbox=[0, 0, 1, 1],
    )
    table.auto_set_font_size(False)
    table.set_fontsize(style.SMALL)
    title = (
        f"Steps until f − f* ≤ {results['tolerance']:g} at each optimizer's best η "
        "(green: fastest; red: not reached at any η)"
    )
    table_ax.set_title(style.fill(title, style.WIDTH, 11), fontsize=11)

    for row, name in enumerate(names, 1):
        ax = fig.add_subplot(grid[row])
        lrs = sorted({entry["lr"] for run in surfaces[name]["runs"].values() for entry in run["grid"]})
        steps = np.full((len(optimizers), len(lrs)), np.nan)
        for i, optimizer in enumerate(optimizers):
            for entry in surfaces[name]["runs"][optimizer]["grid"]:
                j = lrs.index(entry["lr"])
                steps[i, j] = entry["reached_at"] if entry["reached_at"] is not None else np.nan
                ax.text(j, i, grid_cell(entry), ha="center", va="center", fontsize=style.SMALL)
        ax.imshow(np.log10(steps), cmap="YlGn_r", aspect="auto", vmin=0, vmax=np.log10(results["steps"]))
        ax.set_xticks(range(len(lrs)))
        ax.set_xticklabels([f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(optimizers)))
        ax.set_yticklabels(optimizers)
        ax.set_xlabel("learning rate η")
        ax.grid(False)
        ax.set_title(f"{SURFACE_TITLES.get(name, name)}: steps per η (—: not reached, div.: diverged)", fontsize=10)
    return fig


FIGURES = {
    "landscapes.png": landscapes,
    "convergence_table.png": convergence_table,
    "bias_correction.png": lambda results: bias_correction(results["bias_correction"]),
    "adamw_vs_adaml2.png": lambda results: weight_decay(results["weight_decay"]),
}
