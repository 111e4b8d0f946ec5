"""Figures of the rare-tokens experiment, drawn from its results.json alone.

* ``sgd_vs_adam.png`` — the seed's layout: SGD and Adam weight trajectories, final errors, and Adam's
  effective learning rate against token frequency.
* ``optimizers.png`` — every optimizer's error against token frequency, and the rarest token's path.
* ``lr_sweep.png`` — can SGD be rescued by a larger learning rate, and what does it cost the common tokens.

Titles and notes are sentences built from the numbers in results, so they say what this run measured.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style


# ---------------------------------------------------------------------------------------- helpers
def token_colors(frequencies: list[float]) -> list[tuple[float, float, float]]:
    """Blue for the most common token through red for the rarest, whatever order the tokens come in."""
    ramp = style.ramp(len(frequencies))
    order = np.argsort(-np.asarray(frequencies), kind="stable")
    colors: list[tuple[float, float, float]] = [ramp[0]] * len(frequencies)
    for position, k in enumerate(order):
        colors[k] = ramp[position]
    return colors


def token_label(results: dict[str, Any], k: int) -> str:
    return f"{results['tokens'][k]} (p={results['frequencies'][k]:.2g})"


def learned_count(errors: list[float] | None, within: float) -> int:
    return 0 if errors is None else sum(e is not None and e <= within for e in errors)


def trajectory_title(results: dict[str, Any], name: str, label: str) -> str:
    """'SGD: the rarest token reached 1.6% of its target; 2 of 6 tokens within 0.1'."""
    run = results["optimizers"][name]
    if run["diverged_at"] is not None:
        return f"{label}: diverged at step {run['diverged_at']}"
    rarest = results["rarest"]
    share = run["final_weight"][rarest] / results["true_weight"]
    learned = learned_count(run["final_error"], results["learned_within"])
    return (
        f"{label} — weight trajectories (η = {run['lr']:g})\n"
        f"the rarest token reached {share:.1%} of its target; "
        f"{learned} of {len(results['tokens'])} tokens end within {results['learned_within']:g} of w*"
    )


def plot_trajectories(ax, results: dict[str, Any], name: str, label: str) -> None:
    run = results["optimizers"][name]
    colors = token_colors(results["frequencies"])
    steps = np.asarray(run["trajectory"]["steps"])
    weights = style.finite(run["trajectory"]["weights"])
    ax.axhline(results["true_weight"], color=style.INK, lw=1, ls="--", alpha=0.35, label="true weight w*")
    for k, color in enumerate(colors):
        ax.plot(steps, weights[k], color=color, lw=1.5, label=token_label(results, k))
    finite = weights[np.isfinite(weights)]
    top = max(1.8, float(finite.max()) + 0.1) if finite.size else 1.8
    bottom = min(-0.3, float(finite.min()) - 0.1) if finite.size else -0.3
    ax.set_ylim(bottom, top)
    ax.set_xlim(0, max(steps[-1], 1))
    ax.set_title(trajectory_title(results, name, label), fontsize=10.5)
    ax.set_xlabel("training step")
    ax.set_ylabel("learned weight w")
    ax.legend(loc="upper center", ncol=4)
    if run["diverged_at"] is None and np.isfinite(style.finite(run["final_weight"])[results["rarest"]]):
        annotate_rarest(ax, results, name, colors[results["rarest"]], steps[-1], bottom, top)


def annotate_rarest(ax, results: dict[str, Any], name: str, color, last_step: int, bottom: float, top: float) -> None:
    """An arrow to the rarest token's final weight, the text placed in the emptier half of the axes."""
    rarest = results["rarest"]
    w = results["optimizers"][name]["final_weight"][rarest]
    height = (w - bottom) / (top - bottom)
    text_y = bottom + (top - bottom) * (0.2 if height > 0.45 else 0.5)
    ax.annotate(
        f"rarest token: w = {w:.3f} after {results['steps']} steps\n"
        f"({results['occurrences'][rarest]:.0f} occurrences in {results['steps'] * results['batch_size']} draws)",
        xy=(last_step, w),
        xytext=(last_step * 0.5, text_y),
        fontsize=style.SMALL,
        color=color,
        va="center",
        arrowprops=dict(arrowstyle="->", color=color, lw=1.1),
        bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=color, alpha=0.9, lw=0.8),
    )


# -------------------------------------------------------------------------------------- the seed
def sgd_vs_adam(results: dict[str, Any]) -> Figure:
    missing = [name for name in ("sgd", "adam") if name not in results["pair"]]
    if missing:
        fig, ax = plt.subplots(figsize=(style.WIDTH, 4))
        style.nothing_to_show(ax, f"SGD vs Adam: no {' and no '.join(missing)} run (--optimizers)")
        return fig
    # one column: the two trajectories full width, the errors and Adam's effective LR side by side below
    fig = plt.figure(figsize=(style.WIDTH, 12), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.25])
    plot_trajectories(fig.add_subplot(grid[0, :]), results, results["pair"]["sgd"], "SGD")
    plot_trajectories(fig.add_subplot(grid[1, :]), results, results["pair"]["adam"], "Adam")
    plot_final_errors(fig.add_subplot(grid[2, 0]), results)
    plot_effective_lr(fig.add_subplot(grid[2, 1]), results)
    sgd, adam = (results["optimizers"][results["pair"][n]] for n in ("sgd", "adam"))
    same = f"same η = {sgd['lr']:g}" if sgd["lr"] == adam["lr"] else f"η = {sgd['lr']:g} and {adam['lr']:g}"
    title = (
        f"SGD vs Adam on rare tokens: same data, {same}, {results['steps']} steps of "
        f"{results['batch_size']} token draws — {comparison(results)}"
    )
    fig.suptitle(style.fill(title, style.WIDTH, 12), fontsize=12, fontweight="bold")
    return fig


def comparison(results: dict[str, Any]) -> str:
    """Which of SGD and Adam ends closer to w* on the rarest token (or which diverged)."""
    sgd, adam = (results["optimizers"][results["pair"][n]] for n in ("sgd", "adam"))
    diverged = [label for label, run in (("SGD", sgd), ("Adam", adam)) if run["diverged_at"] is not None]
    if diverged:
        return f"{' and '.join(diverged)} diverged"
    rarest = results["rarest"]
    a, s = adam["final_error"][rarest], sgd["final_error"][rarest]
    verdict = "smaller than" if a < s else "not smaller than"
    return f"Adam's final rarest-token error is {verdict} SGD's ({a:.3f} vs {s:.3f})"


def plot_final_errors(ax, results: dict[str, Any]) -> None:
    sgd, adam = (results["optimizers"][results["pair"][n]] for n in ("sgd", "adam"))
    x = np.arange(len(results["tokens"]))
    width = 0.38
    for offset, run, name, label in ((-width / 2, sgd, "sgd", "SGD"), (width / 2, adam, "adam", "Adam")):
        errors = style.finite(run["final_error"] if run["final_error"] is not None else [np.nan] * len(x))
        bars = ax.bar(x + offset, errors, width, color=style.optimizer_color(name), alpha=0.9, label=label)
        texts = [f"{e:.2f}" if np.isfinite(e) else "" for e in errors]
        # upright, the labels of neighbouring bars ran into each other at a legible size
        ax.bar_label(bars, labels=texts, fontsize=style.SMALL, padding=2, color=style.MUTED, rotation=90)
    # in the legend: a label at the line ran into the bars' own
    ax.axhline(
        results["learned_within"], color=style.MUTED, lw=0.8, ls=":", label=f"learned: ≤ {results['learned_within']:g}"
    )
    ax.set_xticks(x)
    ax.set_xticklabels([f"{k + 1}\n{p:.2g}" for k, p in enumerate(results["frequencies"])])
    ax.set_xlabel("token, and its frequency p")
    ax.set_ylabel("final |w − w*|")
    ax.set_title("Final weight error (lower is better)", fontsize=10.5)
    ax.legend(loc="upper left")
    top = np.nanmax(np.concatenate([style.finite(r["final_error"] or []) for r in (sgd, adam)] + [[1.0]]))
    ax.set_ylim(0, top * 1.25)  # room for the upright labels above the tallest bar


def plot_effective_lr(ax, results: dict[str, Any]) -> None:
    adam = results["optimizers"][results["pair"]["adam"]]
    frequencies = style.positive(results["frequencies"])
    effective = style.positive(adam["effective_lr"] if adam["effective_lr"] is not None else [])
    shown = np.isfinite(effective) & np.isfinite(frequencies) if len(effective) == len(frequencies) else []
    if adam["effective_lr"] is None or not np.any(shown):
        why = f"Adam diverged at step {adam['diverged_at']}" if adam["diverged_at"] is not None else "Adam"
        style.nothing_to_show(ax, f"{why}:\nno positive effective learning rate to show")
        return
    colors = token_colors(results["frequencies"])
    ax.scatter(
        frequencies[shown],
        effective[shown],
        c=[c for c, s in zip(colors, shown, strict=True) if s],
        s=110,
        zorder=5,
        edgecolors="white",
        linewidths=1.5,
    )
    for k, token in enumerate(results["tokens"]):
        if shown[k]:
            ax.annotate(
                token, (frequencies[k], effective[k]), textcoords="offset points", xytext=(7, 4), fontsize=style.SMALL
            )
    fit = adam["effective_lr_fit"]
    span = np.geomspace(np.nanmin(frequencies[shown]), np.nanmax(frequencies[shown]), 50)
    if fit is not None and np.isfinite(fit["slope"]) and np.isfinite(fit["intercept"]):
        ax.plot(span, np.exp(fit["intercept"]) * span ** fit["slope"], color=style.MUTED, lw=1, alpha=0.6)
    ax.axhline(adam["lr"], color=style.INK, lw=1, ls="--", alpha=0.5)
    ax.text(span[0], adam["lr"] * 1.25, f"nominal η = {adam['lr']:g}", fontsize=style.SMALL, color=style.INK)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(min(adam["lr"], np.nanmin(effective[shown])) / 3, max(adam["lr"], np.nanmax(effective[shown])) * 4)
    ax.set_xlim(span[0] / 2.5, span[-1] * 3)
    ax.set_xlabel("token frequency p (log scale)")
    ax.set_ylabel("effective LR η/(√v̂ + ε) at the end (log)")
    if fit is not None:
        fitted = fit.get("tokens", len(frequencies))
        over = f" over the {fitted} tokens seen" if fitted < len(frequencies) else ""
        slope = (
            f"fitted slope {fit['slope']:.2f}{over} (−1 would cancel the frequency exactly)"
            if np.isfinite(fit["slope"])
            else "no slope: fewer than two distinct frequencies among the tokens seen"
        )
        ratio = (
            f"the rarest token's is {fit['ratio']:.0f}× the most common's"
            if np.isfinite(fit["ratio"])
            else "the rarest token was never seen"
        )
        ax.set_title(style.fill(f"Adam's effective LR: {ratio}; {slope}", style.column(2), 10), fontsize=10)


# ------------------------------------------------------------------------------- every optimizer
def optimizers(results: dict[str, Any]) -> Figure:
    fig, (errors_ax, rarest_ax) = plt.subplots(2, 1, figsize=(style.WIDTH, 10.5), layout="constrained")
    frequencies = np.asarray(results["frequencies"])
    order = np.argsort(frequencies)
    within = results["learned_within"]
    finished = {name: run for name, run in results["optimizers"].items() if run["diverged_at"] is None}
    # A final error can be ~0 by chance (Lion's ±η steps land on w* exactly); on log axes those
    # markers sit on a floor a decade below the smallest RMS error, so they do not stretch the axis.
    smallest = [np.nanmin(style.positive(r["tail_rms_error"])) for r in finished.values()]
    smallest = [v for v in smallest if np.isfinite(v)]
    floor = min(smallest, default=within) / 10
    counts = []
    colors = style.run_colors(results["optimizers"])
    for name, run in results["optimizers"].items():
        color = colors[name]
        if run["diverged_at"] is not None:
            counts.append(f"{name}: diverged at step {run['diverged_at']}")
            continue
        tail = style.positive(run["tail_rms_error"])[order]
        final = style.finite(run["final_error"])[order]
        errors_ax.plot(frequencies[order], tail, color=color, lw=1.8, marker="o", ms=4, label=name)
        errors_ax.scatter(frequencies[order], np.maximum(final, floor), color=color, marker="x", s=22, lw=1)
        counts.append(f"{name}: {learned_count(run['tail_rms_error'], within)}/{len(frequencies)}")
        steps = np.asarray(run["trajectory"]["steps"])
        rarest_ax.plot(steps, style.finite(run["trajectory"]["weights"][results["rarest"]]), color=color, lw=1.4)
    errors_ax.axhline(within, color=style.MUTED, lw=0.8, ls=":")
    errors_ax.set_xscale("log")
    shown = [r["tail_rms_error"] for r in finished.values()] + [r["final_error"] for r in finished.values()]
    if style.log_scale(errors_ax, "y", *shown):
        errors_ax.set_ylim(bottom=floor / 1.5)
    errors_ax.set_xlabel("token frequency p (log scale)")
    errors_ax.set_ylabel(
        f"line: RMS of w − w* over the last quarter\n×: final |w − w*| (drawn at {floor:.1g} when below it)"
    )
    lrs = sorted({run["lr"] for run in results["optimizers"].values()})
    at = f"every optimizer at η = {lrs[0]:g}" if len(lrs) == 1 else "each optimizer at its η"
    errors_ax.set_title(f"Error against token frequency, {at}", fontsize=10.5)
    style.note(errors_ax, f"tokens learned (RMS ≤ {within:g}):\n" + "\n".join(counts), (0.02, 0.03), va="bottom")
    rarest = results["rarest"]
    rarest_ax.axhline(results["true_weight"], color=style.INK, lw=1, ls="--", alpha=0.35)
    rarest_ax.set_xlabel("training step")
    rarest_ax.set_ylabel("weight of the rarest token")
    rarest_ax.set_title(
        f"The rarest token ({token_label(results, rarest)}, {results['occurrences'][rarest]:.0f} occurrences)",
        fontsize=10.5,
    )
    rarest_ax.legend(
        *errors_ax.get_legend_handles_labels(),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=min(len(results["optimizers"]), 5),
    )
    settings = "; ".join(f"{name} = {run['setting']}" for name, run in results["optimizers"].items())
    named = {run["optimizer"] for run in results["optimizers"].values()}
    notes = "".join(f"\n{name}: {note}" for name, note in results["notes"].items() if name in named)
    title = f"Rare tokens, every optimizer: same data stream, {results['steps']} steps, " + at.replace(
        "every optimizer ", ""
    )
    fig.suptitle(style.fill(title, style.WIDTH, 12), fontsize=12, fontweight="bold")
    fig.supxlabel(style.fill(settings + notes, style.WIDTH), fontsize=style.SMALL, color=style.MUTED)
    return fig


# ------------------------------------------------------------------------------------ the LR sweep
def sweep_title(results: dict[str, Any]) -> str:
    sweep = results["lr_sweep"]
    findings = sweep["findings"]
    diverging = findings["smallest_diverging_sgd_lr"]
    diverges = f"; SGD diverges from η = {diverging:g}" if diverging is not None else "; no swept η diverged"
    if findings["rescue_lr"] is None:
        return (
            "No swept learning rate lets SGD learn the rarest token "
            f"(tail RMS error ≤ {results['learned_within']:g}){diverges}"
        )
    learns = f"SGD learns the rarest token from η = {findings['rescue_lr']:g}"
    if findings["nominal_common_tail_std"] is None:  # SGD diverged at the nominal η: no jitter to compare with
        return (
            f"{learns}, where the most common token jitters with std {findings['rescue_common_tail_std']:.3f} "
            f"(at the nominal η = {results['lr']:g} SGD diverged){diverges}"
        )
    return (
        f"{learns}, but there the most common token jitters "
        f"{findings['rescue_jitter_ratio']:.0f}× as much as at η = {results['lr']:g} "
        f"(std {findings['rescue_common_tail_std']:.3f} vs "
        f"{findings['nominal_common_tail_std']:.4f}){diverges}"
    )


def plot_sweep_errors(ax, results: dict[str, Any], name: str, label: str) -> None:
    sweep = results["lr_sweep"]
    lrs = np.asarray(sweep["lrs"])
    colors = token_colors(results["frequencies"])
    diverged = [run["diverged_at"] is not None for run in sweep[name]]
    for k, color in enumerate(colors):
        errors = [np.nan if run["diverged_at"] is not None else run["tail_rms_error"][k] for run in sweep[name]]
        ax.plot(lrs, style.positive(errors), color=color, lw=1.6, marker="o", ms=3.5, label=token_label(results, k))
    if any(diverged):
        first = lrs[diverged.index(True)]
        ax.axvspan(first / 1.1, lrs.max() * 1.3, color=style.BAD, alpha=0.08, lw=0)
        # right-aligned in the panel: at the shaded span's edge it was cut to "dive" where the span is narrow
        ax.text(
            0.99,
            0.9,
            f"shaded: diverged, from η = {first:g}",
            transform=ax.transAxes,
            color=style.BAD,
            fontsize=style.SMALL,
            ha="right",
            va="top",
        )
    ax.axhline(results["learned_within"], color=style.MUTED, lw=0.8, ls=":")
    ax.axvline(results["lr"], color=style.INK, lw=0.8, ls="--", alpha=0.5)
    ax.text(  # clipped: a nominal η outside the swept range is not drawn, and does not stretch the layout
        results["lr"],
        0.97,
        " nominal η",
        transform=ax.get_xaxis_transform(),
        fontsize=style.SMALL,
        color=style.MUTED,
        va="top",
        clip_on=True,
    )
    ax.set_xlim(lrs.min() / 1.3, lrs.max() * 1.3)  # before the log scale: one swept η gives equal data limits
    ax.set_xscale("log")
    alive = [r["tail_rms_error"] for r in sweep[name] if r["diverged_at"] is None]
    why = {} if alive else {"empty": "diverged at every swept η: no error to draw"}
    style.log_scale(ax, "y", *alive, **why)
    ax.set_xlabel("learning rate η (log scale)")
    ax.set_ylabel("RMS of w − w*, last quarter (log)")
    ax.set_title(f"{label}: error per token against η", fontsize=10.5)


def plot_tradeoff(ax, results: dict[str, Any]) -> None:
    """Rarest-token error against the most common token's jitter, one point per η."""
    sweep = results["lr_sweep"]
    rarest, common = results["rarest"], results["most_common"]
    for name, label in (("sgd", "SGD"), ("adam", "Adam")):
        points = [
            (lr, run["tail_rms_error"][rarest], run["tail_std"][common])
            for lr, run in zip(sweep["lrs"], sweep[name], strict=True)
            if run["diverged_at"] is None
        ]
        if not points:
            continue
        lrs, rare_error, jitter = (style.positive(v) for v in zip(*points, strict=True))
        color = style.optimizer_color(name)
        ax.plot(jitter, rare_error, color=color, lw=1.6, marker="o", ms=4, label=label)
        for lr, x, y in zip(lrs, rare_error, jitter, strict=True):
            if np.isfinite(x) and np.isfinite(y):
                ax.annotate(
                    f"{lr:g}", (y, x), textcoords="offset points", xytext=(4, 3), fontsize=style.SMALL, color=color
                )
    ax.axhline(results["learned_within"], color=style.MUTED, lw=0.8, ls=":")
    ax.text(
        0.99,
        results["learned_within"],
        f"learned: RMS ≤ {results['learned_within']:g}",
        transform=ax.get_yaxis_transform(),
        fontsize=style.SMALL,
        color=style.MUTED,
        ha="right",
        va="bottom",
    )
    alive = [r for name in ("sgd", "adam") for r in sweep[name] if r["diverged_at"] is None]
    why = {} if alive else {"empty": "every swept η diverged: no trade-off to draw"}
    if style.log_scale(ax, "x", *[[r["tail_std"][common] for r in alive]], **why):
        style.log_scale(ax, "y", *[[r["tail_rms_error"][rarest] for r in alive]])
    ax.set_xlabel(f"jitter of the most common token ({results['tokens'][common]}): std of w, last quarter")
    ax.set_ylabel(f"rarest token ({results['tokens'][rarest]}): RMS error, last quarter")
    ax.set_title("The trade-off (labels: η); lower left is better", fontsize=10.5)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="center left")


def lr_sweep(results: dict[str, Any]) -> Figure:
    # the two optimizers' errors side by side (one y scale), the trade-off full width below them
    fig = plt.figure(figsize=(style.WIDTH, 9.5), layout="constrained")
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    plot_sweep_errors(axes[0], results, "sgd", "SGD")
    plot_sweep_errors(axes[1], results, "adam", "Adam")
    plot_tradeoff(axes[2], results)
    lows = [ax.get_ylim()[0] for ax in axes[:2]]
    highs = [ax.get_ylim()[1] for ax in axes[:2]]
    for ax in axes[:2]:
        ax.set_ylim(min(lows), max(highs))
    # one legend for both panels, which share the tokens' colours (the SGD panel had none)
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 3))
    fig.suptitle(style.fill(sweep_title(results), style.WIDTH, 12), fontsize=12, fontweight="bold")
    return fig


FIGURES = {"sgd_vs_adam.png": sgd_vs_adam, "optimizers.png": optimizers, "lr_sweep.png": lr_sweep}
