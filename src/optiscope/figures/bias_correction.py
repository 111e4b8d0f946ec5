"""``bias_correction.png``: Adam with and without bias correction over its first steps on f(x) = x²."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style

LABELS = {"adam": "Adam (bias-corrected)", "adam-no-bc": "Adam without bias correction"}


def bias_title(story: dict[str, Any]) -> str:
    corrected, raw = story["runs"]["adam"], story["runs"]["adam-no-bc"]
    lr, start = story["lr"], abs(story["start"])
    diverged = [
        f"{LABELS.get(name, name)} diverged at step {run['diverged_at']}"
        for name, run in story["runs"].items()
        if run.get("diverged_at") is not None
    ]
    if diverged:  # its largest step and overshoot stop where x does: no comparison to make
        return (
            f"Bias correction on f(x) = x² from x₀ = {story['start']:g}, η = {lr:g}: "
            f"{'; '.join(diverged)} (x not finite), so the steps are not compared"
        )
    return (
        f"Bias correction on f(x) = x² from x₀ = {story['start']:g}, η = {lr:g}: without it the first step is "
        f"{raw['first_step'] / lr:.1f}η (with it {corrected['first_step'] / lr:.2f}η),\nthe largest "
        f"{raw['largest_step'] / lr:.1f}η at step {raw['largest_step_at']}, and "
        f"{overshoot_clause(raw['overshoot'], corrected['overshoot'], start)}"
    )


def overshoot_clause(raw: float, corrected: float, start: float) -> str:
    """How far x goes past the minimum without and with correction (|x₀| = ``start``); an overshoot of 0
    means x never crossed it, which is said in words rather than as 'overshoots by 0'."""
    if raw > 0 and corrected > 0:
        return (
            f"x overshoots the minimum by {raw:.3g} ({raw / start:.0%} of |x₀|) against {corrected:.3g} "
            f"({corrected / start:.1%})"
        )
    if raw > 0:
        return f"x overshoots the minimum by {raw:.3g} ({raw / start:.0%} of |x₀|); with correction it never crosses it"
    if corrected > 0:
        return (
            f"x never crosses the minimum; with correction it overshoots it by {corrected:.3g} "
            f"({corrected / start:.1%} of |x₀|)"
        )
    return "x never crosses the minimum, with or without correction"


def bias_correction(story: dict[str, Any]) -> Figure:
    # the iterate full width, the step size and the factors side by side below it
    fig = plt.figure(figsize=(style.WIDTH, 9.5), layout="constrained")
    grid = fig.add_gridspec(2, 2)
    x_ax, step_ax, factor_ax = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    steps = np.arange(story["steps"] + 1)
    for name, run in story["runs"].items():
        color = style.optimizer_color(name)
        x = np.asarray(run["x"])
        x_ax.plot(steps, x, color=color, lw=1.6, label=LABELS.get(name, name))
        ratio = np.abs(np.diff(x)) / story["lr"]
        step_ax.plot(steps[1:], ratio, color=color, lw=1.6, label=LABELS.get(name, name))
        if run["overshoot"] > 0:
            # the farthest finite point past the minimum (argmax would pick a NaN of a run that diverged)
            far = int(np.argmax(np.where(np.isfinite(x), -np.sign(story["start"]) * x, -np.inf)))
            x_ax.annotate(
                f"overshoot {run['overshoot']:.3g}",
                (far, x[far]),
                textcoords="offset points",
                xytext=(45, -8 if story["start"] > 0 else 8),
                fontsize=style.SMALL,
                color=color,
                arrowprops=dict(arrowstyle="->", color=color, lw=1),
            )
    x_ax.axhline(0, color=style.INK, lw=0.8, ls="--", alpha=0.5)
    low, high = x_ax.get_ylim()
    x_ax.set_ylim(low - 0.06 * (high - low), high)
    x_ax.set_xscale("symlog", linthresh=10)
    x_ax.set_xlim(0, story["steps"])
    x_ax.set_xlabel("step t (linear to 10, then log)")
    x_ax.set_ylabel("x_t")
    x_ax.set_title("The iterate: the minimum is x = 0", fontsize=10.5)
    x_ax.legend(loc="upper right")

    t = np.arange(1, story["steps"] + 1)
    step_ax.plot(
        t,
        story["predicted_uncorrected_step_ratio"],
        color=style.MUTED,
        lw=1.2,
        ls="--",
        label="(1 − β1ᵗ)/√(1 − β2ᵗ): the uncorrected\nstep for a constant g",
    )
    step_ax.axhline(1, color=style.INK, lw=0.8, ls=":", alpha=0.6)
    step_ax.set_xscale("log")
    step_ax.set_xlabel("step t (log scale)")
    step_ax.set_ylabel("|x_t − x_{t−1}| / η")
    step_ax.set_title("Step size in units of η", fontsize=10.5)
    step_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2))

    factor_ax.plot(
        t,
        story["first_moment_correction"],
        color=style.optimizer_color("momentum"),
        lw=1.6,
        label=f"1 − β1ᵗ, shrinks m (β1 = {story['beta1']:g})",
    )
    factor_ax.plot(
        t,
        story["second_moment_correction"],
        color=style.optimizer_color("rmsprop"),
        lw=1.6,
        label=f"1 − β2ᵗ, shrinks v (β2 = {story['beta2']:g})",
    )
    factor_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2))
    for mark in (1, 10, 100, 1000):
        if mark <= story["steps"]:
            value = story["second_moment_correction"][mark - 1]
            factor_ax.annotate(
                f"{value:.3g}", (mark, value), textcoords="offset points", xytext=(3, -11), fontsize=style.SMALL
            )
    factor_ax.set_xscale("log")
    factor_ax.set_yscale("log")
    factor_ax.set_xlabel("step t (log scale)")
    factor_ax.set_ylabel("the factor m and v are shrunk by")
    factor_ax.set_title("What bias correction divides out", fontsize=10.5)

    fig.suptitle(style.fill(bias_title(story).replace("\n", " "), style.WIDTH, 11.5), fontsize=11.5, fontweight="bold")
    return fig
