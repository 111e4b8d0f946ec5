"""Figures of the ``entropy`` experiment, drawn from its results.json alone.

* ``entropy_delta_vs_eta.png`` — ΔH against η per run (true, linear, linear + quadratic; log-x), one row
  per optimizer.
* ``entropy_delta_vs_eta_aggregate.png`` — the same averaged over runs (true: mean ± std).
* ``entropy_loglog.png`` — |ΔH_true| against η on log-log axes, with the fitted slope and R² of each run.
* ``entropy_subsets.png`` — relative error of the linear prediction on random subsets of the E sequences.
* ``entropy_vs_loss.png`` — beyond the seed: how much entropy each optimizer's step moves per unit of
  validation-loss decrease (∇H·v / −∇L·v), and the true ΔH against the true ΔL along each direction.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import style

TRUE, LINEAR, QUADRATIC = style.INK, "#1f6fb2", "#d4802a"


def _curves(result: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(η, true ΔH, linear, linear + quadratic) of one run, as the experiment stored them."""
    c = result["curve"]
    return style.positive(c["eta"]), style.finite(c["true"]), style.finite(c["linear"]), style.finite(c["quadratic"])


def _lr_line(ax, lr: float) -> None:
    ax.axvline(lr, color=style.MUTED, lw=0.8, ls=":")
    ax.text(lr, 0.02, " lr", transform=ax.get_xaxis_transform(), fontsize=style.SMALL, color=style.MUTED)


def per_run(results: dict[str, Any]) -> Figure:
    runs = [(name, opt, i) for name, opt in results["optimizers"].items() for i in range(len(opt["runs"]))]
    fig, axes = style.panels(len(runs), 2.9)
    for ax, (name, opt, i) in zip(axes.flat, runs, strict=False):
        eta, true, linear, quadratic = _curves(opt["runs"][i])
        ax.plot(eta, true, "o-", color=TRUE, lw=1.6, ms=4, label="true ΔH")
        ax.plot(eta, linear, "s--", color=LINEAR, lw=1.2, ms=3, label="linear η·∇H·v")
        ax.plot(eta, quadratic, "^:", color=QUADRATIC, lw=1.2, ms=3, label="+ ½η²·vᵀ∇²H v")
        ax.set_xscale("log")
        _lr_line(ax, opt["lr"])
        ax.set_title(f"{name}, run {i}", fontsize=10)
        ax.set_ylabel("ΔH (nats/token)")
        ax.set_xlabel("step size η")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    title = f"Entropy change after one step θ → θ + ηv ({results['mode']} contexts)"
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    return fig


def aggregate(results: dict[str, Any]) -> Figure:
    optimizers = list(results["optimizers"].items())
    fig, axes = style.panels(len(optimizers), 3.4)
    for ax, (name, opt) in zip(axes.flat, optimizers, strict=False):
        a = opt["aggregate"]
        eta = style.positive(a["eta"])
        ax.errorbar(
            eta,
            style.finite(a["true_mean"]),
            yerr=np.nan_to_num(style.positive(a["true_std"])),
            fmt="o-",
            color=TRUE,
            capsize=3,
            label="true (mean ± std)",
        )
        ax.plot(eta, style.finite(a["linear_mean"]), "s--", color=LINEAR, label="linear (mean)")
        ax.plot(eta, style.finite(a["quadratic_mean"]), "^:", color=QUADRATIC, label="lin + quad (mean)")
        style.log_scale(ax, "x", eta)
        _lr_line(ax, opt["lr"])
        ax.set_title(f"{name}: {len(opt['runs'])} runs, E = {opt['runs'][0]['E']}", fontsize=10)
        ax.set_xlabel("step size η")
        ax.set_ylabel("ΔH (nats/token)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    fig.suptitle("Entropy change vs step size, averaged over runs", fontsize=11)
    return fig


def loglog(results: dict[str, Any]) -> Figure:
    optimizers = list(results["optimizers"].items())
    fig, axes = style.panels(len(optimizers), 3.6)
    for ax, (name, opt) in zip(axes.flat, optimizers, strict=False):
        colors = plt.get_cmap("tab10")
        lines = []
        for i, (result, fit) in enumerate(zip(opt["runs"], opt["fits"], strict=True)):
            eta, true, _, _ = _curves(result)
            grid = np.logspace(np.log10(eta.min()), np.log10(eta.max()), 100)
            ax.loglog(eta, np.abs(true), "o", color=colors(i), alpha=0.75, ms=4)
            ax.loglog(grid, np.exp(fit["intercept"]) * grid ** fit["slope"], color=colors(i), lw=1, alpha=0.7)
            lines.append(f"run {i}: slope {fit['slope']:.2f}, R² {fit['r2']:.3f}")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step size η")
        ax.set_ylabel("|ΔH_true|")
        style.note(ax, "\n".join(lines), (0.03, 0.97))
    title = "|ΔH_true| vs η: a slope of 1 means the change is linear in the step size"
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    return fig


def subsets(results: dict[str, Any]) -> Figure:
    optimizers = list(results["optimizers"].items())
    fig, axes = style.panels(len(optimizers), 3.6)
    colors = plt.get_cmap("tab10")
    for ax, (name, opt) in zip(axes.flat, optimizers, strict=False):
        per_run = [style.finite(r["subsets"]["errors"]) for r in opt["runs"]]
        per_run = [e[np.isfinite(e)] for e in per_run]
        pooled = np.concatenate(per_run) if per_run else np.zeros(0)
        # the axis spans the central 96 %: a run whose ∇H·v is near 0 has huge relative errors
        lo, hi = np.percentile(pooled, [2, 98]) if len(pooled) else (-1.0, 1.0)
        hi = max(hi, lo + max(abs(lo) * 1e-6, 1e-12))
        lines = []
        for i, (errors, result) in enumerate(zip(per_run, opt["runs"], strict=True)):
            ax.hist(np.clip(errors, lo, hi), bins=40, range=(lo, hi), histtype="step", lw=1.4, color=colors(i))
            lines.append(f"run {i}: {result['subsets']['mean']:+.3f} ± {result['subsets']['std']:.3f}")
        ax.axvline(0, color=style.INK, lw=0.8)
        s = opt["runs"][0]["subsets"]
        title = f"{name}: η = {s['eta']:.2e}, {s['count']} subsets of {s['size']} per run"
        ax.set_title(style.fill(title, style.column(axes.shape[1]), 10), fontsize=10)
        ax.set_xlabel("(linear − true) / |true|, clipped to the axis")
        ax.set_ylabel("subsets")
        style.note(ax, "mean ± std\n" + "\n".join(lines), (0.97, 0.97), ha="right")
    title = "Relative error of the linear prediction on random subsets of the evaluation sequences"
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    return fig


def entropy_vs_loss(results: dict[str, Any]) -> Figure:
    """Both first-order changes of the real step (η = lr), and the true changes up to it."""
    optimizers = list(results["optimizers"].items())
    fig, (left, right) = plt.subplots(2, 1, figsize=(style.WIDTH, 8.6), layout="constrained")
    x = np.arange(len(optimizers))
    steps = [opt["real_step"] for _, opt in optimizers]
    colors = style.run_colors(results["optimizers"])
    # the loss bars grey, the entropy bars in each optimizer's colour: the legend says so with neutral swatches
    for offset, key, color in (
        (-0.2, "loss", "#9a9a9a"),
        (0.2, "entropy", [colors[name] for name, _ in optimizers]),
    ):
        means = style.finite([s[f"{key}_mean"] for s in steps])
        spreads = style.finite([s[f"{key}_std"] for s in steps])
        left.bar(x + offset, np.nan_to_num(means), 0.4, yerr=np.nan_to_num(spreads), capsize=3, color=color)
    swatches = [
        Patch(facecolor="#9a9a9a", label="lr·∇L·v  (validation loss)"),
        Patch(facecolor="none", edgecolor=style.INK, label="lr·∇H·v  (entropy), in the optimizer's colour"),
    ]
    ticks = [f"{n}\nΔH / (−ΔL) = {s['entropy_per_loss']:+.2f}" for (n, _), s in zip(optimizers, steps, strict=True)]
    left.set_xticks(x, ticks)
    left.axhline(0, color=style.INK, lw=0.8)
    left.set_ylabel("first-order change of the real step")
    left.set_title("Entropy vs loss change of one real step (mean ± std over runs)", fontsize=10)
    left.legend(handles=swatches, loc="best")
    drawn: dict[str, list] = {}  # optimizer -> its end points, to name one drawn exactly on another
    for k, (name, opt) in enumerate(optimizers):
        ends = []
        for r in opt["runs"]:
            dh = {e["eta"]: e["delta_h_true"] for e in r["true"]["entries"]}
            dl = {e["eta"]: e["delta"] for e in r["loss_probe"]["true"]}
            etas = [e for e in sorted(dh) if e <= opt["lr"] * (1 + 1e-9) and e in dl]
            right.plot([dl[e] for e in etas], [dh[e] for e in etas], "-", color=colors[name], alpha=0.5)
            ends += [(dl[etas[-1]], dh[etas[-1]])] if etas else []
        under = [other for other, points in drawn.items() if ends and np.allclose(points, ends, equal_nan=True)]
        drawn[name] = ends
        # rings of growing size: an optimizer whose steps equal another's (Adam and AdamW without decay) still shows
        right.plot(
            *(np.array(ends).T if ends else ([], [])),
            "o",
            color=colors[name],
            ms=6 + 3 * k,
            mfc=colors[name] if k == 0 else "none",
            mew=1.6,
            label=name + (f" (on {under[0]}: the same steps)" if under else ""),
        )
    right.axhline(0, color=style.MUTED, lw=0.6)
    right.axvline(0, color=style.MUTED, lw=0.6)
    right.set_xlabel("true ΔL (validation loss)")
    right.set_ylabel("true ΔH (entropy)")
    right.set_title("True changes for η up to the real step (dots: η = lr)", fontsize=10)
    right.legend()
    return fig


FIGURES = {
    "entropy_delta_vs_eta.png": per_run,
    "entropy_delta_vs_eta_aggregate.png": aggregate,
    "entropy_loglog.png": loglog,
    "entropy_subsets.png": subsets,
    "entropy_vs_loss.png": entropy_vs_loss,
}
