"""``adamw_vs_adaml2.png``: final weight distributions and effective decay per parameter, AdamW vs Adam+L2."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style

LABELS = {"adamw": "AdamW (decoupled decay)", "adaml2": "Adam+L2 (decay in the gradient)"}


def claim_lines(story: dict[str, Any]) -> list[str]:
    """The seed's claims, then what was measured, in words chosen by the measurement."""
    w, l2 = story["runs"]["adamw"]["stats"], story["runs"]["adaml2"]["stats"]
    claims = story["seed_claims"]
    if claims is None:  # a run diverged: the experiment tested no claim
        diverged = [
            LABELS.get(name, name)
            for name, run in story["runs"].items()
            if not np.isfinite(style.finite(list(run["stats"].values()))).all()
        ]
        return [
            "The seed: AdamW's weights 'symmetric, bounded', Adam+L2's 'skewed, longer tail'.",
            f"Not measured: {' and '.join(diverged)} diverged (weights not finite), so there is nothing to compare.",
        ]
    two_se = 2 * story["skewness_standard_error"]
    skew = {
        (True, False): "AdamW symmetric, and Adam+L2 not skewed either",
        (True, True): "AdamW symmetric, Adam+L2 skewed, as the seed says",
        (False, True): "both skewed",
        (False, False): "AdamW skewed, Adam+L2 not",
    }[(claims["adamw_symmetric"], claims["adaml2_skewed"])]
    tails = "Adam+L2's tails are heavier" if claims["adaml2_heavier_tails"] else "no clear difference in the tails"
    largest = "Adam+L2's is larger" if claims["adaml2_larger_max_abs"] else "AdamW's is larger"
    largest = "equal" if w["max_abs"] == l2["max_abs"] else largest  # the claim is 'Adam+L2's larger': false at a tie
    return [
        "The seed: AdamW's weights 'symmetric, bounded', Adam+L2's 'skewed, longer tail'. Measured, AdamW vs Adam+L2:",
        f"skewness {w['skewness']:.2f} vs {l2['skewness']:.2f} (2 SE = {two_se:.2f}: {skew}); "
        f"excess kurtosis {w['excess_kurtosis']:.2f} vs {l2['excess_kurtosis']:.2f} ({tails});",
        f"max |w| {w['max_abs']:.3g} vs {l2['max_abs']:.3g} ({largest}); RMS distance to the L2 optimum "
        f"{story['runs']['adamw']['rms_distance_to_l2_optimum']:.3g} vs "
        f"{story['runs']['adaml2']['rms_distance_to_l2_optimum']:.3g}",
    ]


def stats_text(stats: dict[str, float]) -> str:
    return (
        f"std {stats['std']:.3g}\nskewness {stats['skewness']:+.2f}\n"
        f"excess kurtosis {stats['excess_kurtosis']:+.2f}\nmax |w| {stats['max_abs']:.3g}"
    )


def weight_decay(story: dict[str, Any]) -> Figure:
    fig, axes = plt.subplots(2, 2, figsize=(style.WIDTH, 10), layout="constrained")
    half = style.column(2)
    group = np.asarray(story["group"])
    scales = story["group_scales"]
    colors = style.ramp(len(scales))
    true_weights = np.asarray(story["true_weights"])
    finals = {name: style.finite(run["final_weights"]) for name, run in story["runs"].items()}  # diverged: nan
    drawn = np.concatenate([true_weights, *finals.values()])
    drawn = drawn[np.isfinite(drawn)]
    reach = max(float(np.abs(drawn).max()) if drawn.size else 0.0, 1e-12) * 1.05
    bins = np.linspace(-reach, reach, 41)

    for ax, (name, final) in zip(axes[0], finals.items(), strict=True):
        lost = int((~np.isfinite(final)).sum())
        if lost:
            style.note(ax, f"{lost} of {final.size} weights diverged\n(not finite: not drawn)", (0.02, 0.6))
        ax.hist(
            [final[(group == j) & np.isfinite(final)] for j in range(len(scales))],
            bins=bins,
            stacked=True,
            color=colors,
            label=[f"group s = {s:g}" for s in scales],
        )
        ax.hist(true_weights, bins=bins, histtype="step", color=style.INK, lw=1, ls="--", label="true weights w*")
        ax.set_title(f"{LABELS.get(name, name)}: final weights", fontsize=10.5)
        ax.set_xlabel("weight value")
        ax.set_ylabel("count")
        ax.legend(loc="upper left")
        style.note(ax, stats_text(story["runs"][name]["stats"]), (0.98, 0.97), ha="right")
    top = max(ax.get_ylim()[1] for ax in axes[0])
    for ax in axes[0]:
        ax.set_ylim(0, top)

    decay_ax = axes[1, 0]
    index = np.arange(len(group))
    for position, (name, run) in enumerate(story["runs"].items()):
        decay = style.positive(run["effective_decay"])
        decay_ax.scatter(index, decay, s=6, color=style.optimizer_color(name), label=LABELS.get(name, name))
        # the first run's labels go under its points, the second's over them, so they cannot collide
        below = position == 0
        for j in range(len(scales)):
            median, members = run["effective_decay_median"][j], decay[group == j]
            if not np.isfinite(members).any():
                continue
            decay_ax.annotate(
                f"median {median:.2g}",
                (index[group == j].mean(), float(np.nanmin(members) if below else np.nanmax(members))),
                textcoords="offset points",
                xytext=(0, -11 if below else 5),
                ha="center",
                fontsize=style.SMALL,
                color=style.optimizer_color(name),
            )
    for j in range(1, len(scales)):
        decay_ax.axvline(index[group == j][0] - 0.5, color=style.MUTED, lw=0.6, ls=":")
    style.log_scale(decay_ax, "y", *(run["effective_decay"] for run in story["runs"].values()))
    decay_ax.set_xticks([index[group == j].mean() for j in range(len(scales))])
    decay_ax.set_xticklabels([f"group s = {s:g}" for s in scales])
    decay_ax.set_ylabel("fraction of θ removed per step (log)")
    title = "Effective decay per parameter: ηλ (AdamW) vs ηλ/(√v̂ + ε) (Adam+L2)"
    decay_ax.set_title(style.fill(title, half, 10.5), fontsize=10.5)
    decay_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12))

    fit_ax = axes[1, 1]
    optimum = np.asarray(story["l2_optimum"])
    markers = {"adamw": "o", "adaml2": "x"}
    for name, final in finals.items():
        distance = story["runs"][name]["rms_distance_to_l2_optimum"]
        fit_ax.scatter(
            optimum,
            final,
            s=10,
            marker=markers.get(name, "."),
            color=style.optimizer_color(name),
            alpha=0.8,
            label=f"{LABELS.get(name, name)}: RMS distance {distance:.3f}",
        )
    line = np.array([optimum.min(), optimum.max()])
    fit_ax.plot(line, line, color=style.INK, lw=0.8, ls="--", label="final = L2 optimum")
    fit_ax.set_xlabel("L2 optimum s²/(s² + λ) · w*")
    fit_ax.set_ylabel("final weight")
    fit_ax.set_title(style.fill("Where each method ends, against the L2-regularised optimum", half, 10.5))
    fit_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12))

    head = (
        f"AdamW vs Adam+L2: λ = {story['weight_decay']:g}, η = {story['lr']:g}, {story['steps']} steps, "
        f"{len(group)} weights in {len(scales)} groups whose features (and gradients) are scaled by "
        f"{', '.join(f'{s:g}' for s in scales)}"
    )
    fig.suptitle(
        style.fill("\n".join([head, *claim_lines(story)]), style.WIDTH, 10.5), fontsize=10.5, fontweight="bold"
    )
    return fig
