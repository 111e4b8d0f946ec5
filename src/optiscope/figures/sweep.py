"""Figures of a sweep (``optiscope sweep``), drawn from its results.json alone.

* ``sweep_sensitivity.png`` — the objective against the learning rate, one colour per optimizer: every
  tuning trial a point (diverged or crashed ones as crosses at the top), the mean over the tuning seeds
  as a line, the tuned learning rate ringed, and the fresh seeds' mean there as a diamond.
* ``sweep_tuned.png`` — each optimizer at its tuned learning rate: the fresh seeds as points, their mean
  with its Student's t 95 % interval; the title says whether the best two differ beyond the seed noise.
* ``sweep_steps_to_target.png`` — for objectives read from a curve: the steps each tuned optimizer
  needs to reach the common target (fresh seeds as points, their mean as a bar).

Results written before sweeps ran fresh seeds (no ``fresh_seeds``) hold the tuning seeds' values as
``values`` and ``mean``; they are drawn as such, without a diamond.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style


def _title(results: dict[str, Any]) -> str:
    objective = results["objective"]["description"]
    verdict = (results.get("comparison") or {}).get("verdict") or "fewer than two optimizers were tuned"
    return f"sweep of {results['swept']}: {objective} — {verdict}"


def sensitivity(results: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(style.WIDTH, 5.5), layout="constrained")
    lrs, values = [], []
    colors = style.run_colors(results["optimizers"])
    for name, tuned in results["optimizers"].items():
        color = colors[name]
        points = tuned["sensitivity"]
        xs = [p["lr"] for p in points]
        means = style.finite([p["mean"] for p in points])
        ax.plot(xs, means, "-", color=color, label=name, lw=1.5)
        for p in points:
            ys = style.finite(p["values"])
            ax.plot([p["lr"]] * len(ys), ys, "o", color=color, ms=4, alpha=0.7)
            values.extend(ys[np.isfinite(ys)])
        lrs.extend(xs)
        chosen = tuned.get("tuning_mean", tuned["mean"])
        if tuned["tuned_lr"] is not None and math.isfinite(chosen):
            ax.plot(tuned["tuned_lr"], chosen, "o", ms=12, mfc="none", mec=color, mew=1.5)
        if "tuning_mean" in tuned and tuned["tuned_lr"] is not None and math.isfinite(tuned["mean"]):
            ax.plot(tuned["tuned_lr"], tuned["mean"], "D", color=color, ms=7)
            values.append(tuned["mean"])
    top = max(values) if values else 1.0
    for name, tuned in results["optimizers"].items():
        for p in tuned["sensitivity"]:
            bad = sum(1 for v in p["values"] if v is None or not math.isfinite(v))
            if bad:
                ax.plot(p["lr"], top, "x", color=colors[name], ms=8, mew=2)
    if lrs:
        style.log_scale(ax, "x", lrs)
    ax.set_xlabel("learning rate η")
    ax.set_ylabel(results["objective"]["description"])
    ax.legend()
    legend = "× : a trial that diverged, crashed or never got there"
    if "fresh_seeds" in results:
        legend = "points, lines: the tuning seeds; ◆: the fresh seeds' mean at the tuned η; " + legend
    ax.set_title(style.fill(_title(results) + "\n" + legend, style.column(1), 10), fontsize=10)
    return fig


def tuned(results: dict[str, Any]) -> Figure:
    names = [n for n, t in results["optimizers"].items() if t["tuned_lr"] is not None]
    fig, ax = plt.subplots(figsize=(style.WIDTH, 5.0), layout="constrained")
    if not names:
        style.nothing_to_show(ax, "no optimizer has a tuned learning rate (every trial failed)")
        return fig
    for i, name in enumerate(names):
        t = results["optimizers"][name]
        color = style.optimizer_color(name, names)
        ys = style.finite(t["values"])
        ax.plot([i] * len(ys), ys, "o", color=color, alpha=0.6)
        mean = style.finite([t["mean"]])[0]
        low, high = style.finite(t["interval"])
        if np.isfinite(mean):
            err = [[mean - low], [high - mean]] if np.isfinite(low) and np.isfinite(high) else None
            ax.errorbar([i + 0.15], [mean], yerr=err, fmt="s", color=color, capsize=4)
    labels = [f"{style.wrap_name(n)}\nη = {results['optimizers'][n]['tuned_lr']:g}" for n in names]
    ax.set_xticks(range(len(names)), labels)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel(results["objective"]["description"])
    one_seed = all(len(results["optimizers"][n]["values"]) < 2 for n in names)
    shown = "one seed: no spread, no interval" if one_seed else "mean with Student's t 95% interval"
    seeds = "fresh seeds (which chose nothing)" if "fresh_seeds" in results else "seeds"
    ax.set_title(style.fill(_title(results) + f"\n{seeds} as points; {shown}", style.column(1), 10), fontsize=10)
    return fig


def steps_to_target(results: dict[str, Any]) -> Figure:
    found = results.get("steps_to_target")
    fig, ax = plt.subplots(figsize=(style.WIDTH, 5.0), layout="constrained")
    if not found:
        style.nothing_to_show(ax, "no curve of several points (evaluations in training) to read steps to a target from")
        return fig
    names = list(found["optimizers"])
    for i, name in enumerate(names):
        entry = found["optimizers"][name]
        color = style.optimizer_color(name, names)
        steps = style.finite([entry["steps"]])[0]
        if np.isfinite(steps):
            ax.bar(i, steps, color=color, alpha=0.35)
        else:
            ax.text(i, 0.02, "not reached", transform=ax.get_xaxis_transform(), ha="center", color=style.BAD)
        ys = style.finite(entry["seed_steps"])
        ax.plot([i] * len(ys), ys, "o", color=color)
        missed = int(np.isnan(ys).sum())  # a seed whose own curve never got there has no point to draw: say so
        if missed:
            ax.text(
                i,
                0.97,
                f"{missed} of {len(ys)}\nseeds never\nreached it",
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=style.SMALL,
                color=style.BAD,
            )
    ax.set_xticks(range(len(names)), [style.wrap_name(n) for n in names])
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("steps")
    reaches = "≥" if results["objective"].get("direction") == "max" else "≤"
    over = "fresh seeds" if "fresh_seeds" in results else "seeds"
    title = (
        f"steps until {results['objective'].get('curve', 'the curve')} {reaches} {found['target']:.4g} "
        f"(the worst tuned mean of {results['objective']['description']}), "
        f"at each tuned η\nbars: the mean curve over the {over}; points: each one's own curve\n"
        f"{(results.get('comparison') or {}).get('verdict', '')}"
    )
    ax.set_title(style.fill(title, style.column(1), 10), fontsize=10)
    return fig


FIGURES = {
    "sweep_sensitivity.png": sensitivity,
    "sweep_tuned.png": tuned,
    "sweep_steps_to_target.png": steps_to_target,
}
