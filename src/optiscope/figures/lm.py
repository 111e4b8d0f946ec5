"""Figures of the ``lm`` experiment, drawn from its results.json alone.

* ``lm_loss.png`` — validation (solid) and training (faint) loss against step and against training
  wall-clock, one colour per optimizer; a diverged run ends in a cross at the step it diverged.
* ``lm_update_ratio.png`` — u/w of each layer over training, one panel per run.
* ``lm_embedding_rows.png`` — each embedding row's mean update against how often its token occurs,
  one panel per run, with the Spearman rank correlation the experiment measured between the two.
* ``lm_summary.png`` — the table of final validation loss, perplexity and throughput, and the greedy
  samples of the last evaluation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style

if TYPE_CHECKING:
    from ..experiments.lm import Results, RunResults


def status_note(run: RunResults) -> str:
    """'' for a finished run, ' (diverged at step N)' for a diverged one."""
    if run["status"] == "ok":
        return ""
    step = (run["divergence"] or {}).get("step")
    return f" (diverged at step {step})" if step is not None else f" ({run['status']})"


def losses(results: Results) -> Figure:
    fig, axes = plt.subplots(2, 1, figsize=(style.WIDTH, 8.4), layout="constrained")
    starts = []
    colors = style.run_colors(results["runs"])
    for label, run in results["runs"].items():
        color = colors[label]
        train, ev = run["train"], run["eval"]
        train_loss, val_loss = style.finite(train["loss"]), style.finite(ev["val_loss"])
        starts += [v for v in (*train_loss[:1], *val_loss[:1]) if np.isfinite(v)]
        for ax, key in ((axes[0], "step"), (axes[1], "seconds")):
            ax.plot(style.finite(train[key]), train_loss, color=color, ls=style.SOLID, lw=0.8, alpha=0.35)
            ax.plot(
                style.finite(ev[key]),
                val_loss,
                color=color,
                ls=style.DASHED,
                lw=2,
                marker="o",
                ms=3,
                label=f"{label}{status_note(run)}",
            )
            if run["divergence"]:
                x = run["divergence"].get("step") if key == "step" else (train["seconds"] or [0])[-1]
                finite = [v for v in (*train_loss[::-1], *val_loss[::-1]) if np.isfinite(v)]
                y = finite[0] if finite else (max(starts) if starts else 0.0)
                if x is not None and np.isfinite(x):
                    ax.plot([x], [y], marker="x", ms=11, mew=2.5, color=color)
    for ax, xlabel in ((axes[0], "optimizer step"), (axes[1], "training wall-clock (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        if starts and max(starts) > 0:
            ax.set_ylim(top=max(starts) * 1.08)  # a run that blew up does not flatten the others
    axes[0].set_title("Validation (dashed) and training (faint) loss per step")
    axes[1].set_title("… against training time")
    axes[0].legend(loc="upper right")
    corpus = results["corpus"]
    title = (
        f"{results['model']['parameters'] / 1e6:.2f}M-parameter GPT on {corpus['tokenizer']}-level text "
        f"({corpus['train_tokens']:,} training tokens, vocabulary {corpus['vocab_size']})"
    )
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    return fig


def update_ratios(results: Results) -> Figure:
    items = list(results["runs"].items())
    fig, axes = style.panels(len(items), 3.2, 1.6, sharey=True)
    # one colour per layer in every panel (and in the report): the layers of all runs, in the model's order
    layer_colors = {
        layer: style.CATEGORICAL[i % len(style.CATEGORICAL)]
        for i, layer in enumerate(dict.fromkeys(layer for _, run in items for layer in run["update_ratio"]["layers"]))
    }
    for ax, (label, run) in zip(axes.flat, items, strict=False):
        ratios = run["update_ratio"]
        for layer in ratios["layers"]:
            color = layer_colors[layer]
            ax.plot(
                ratios["step"],
                style.positive(ratios["layers"][layer]),
                color=color,
                lw=1.2,
                label=layer,
                **style.lone_marker(ratios["step"]),
            )
        style.log_scale(ax, "y", *ratios["layers"].values())
        ax.set_title(style.fill(f"{label}{status_note(run)}", style.column(axes.shape[1]), 10), fontsize=10)
        ax.set_xlabel("step")
        if ax in axes[:, 0]:
            ax.set_ylabel("u / w per step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4))
    fig.suptitle(style.fill(update_ratio_title(results), style.WIDTH, 11), fontsize=11)
    return fig


def update_ratio_title(results: Results) -> str:
    """Which layer moved most, relative to its size, at each run's last measured step: a sentence from the run."""
    last = {}  # run -> (largest u/w at the last step, its layer)
    for label, run in results["runs"].items():
        ends = {layer: values[-1] for layer, values in run["update_ratio"]["layers"].items() if values}
        ends = {layer: v for layer, v in ends.items() if isinstance(v, int | float) and math.isfinite(v) and v > 0}
        if ends:
            layer = max(ends, key=ends.get)
            last[label] = (ends[layer], layer)
    head = "Update-to-weight ratio ‖Δθ‖ / ‖θ‖ of each layer, measured by the monitor"
    if not last:
        return f"{head}: no run has a finite, positive u/w at its last step"
    layers = [layer for _, layer in last.values()]
    top = max(set(layers), key=layers.count)
    value, where = max(last.values())
    return (
        f"{head}\nat the last step, {top} moves most in {layers.count(top)} of {len(last)} runs; the largest "
        f"u/w there is {style.number(value)} ({where}, {max(last, key=last.get)})"
    )


def embedding_title(results: Results) -> str:
    """How many runs move a frequent token's embedding row further than a rare one's (Spearman ρ > 0), and the
    run where the link is strongest: a sentence from the run."""
    rho = {label: run["embedding_rows"]["spearman"] for label, run in results["runs"].items()}
    rho = {label: r for label, r in rho.items() if isinstance(r, int | float) and math.isfinite(r)}
    head = "Embedding rows: how far each token's row moves against how often the token occurs"
    if not rho:
        return f"{head}\nno run has a rank correlation to show"
    positive = sum(r > 0 for r in rho.values())
    strongest = max(rho, key=lambda label: abs(rho[label]))
    return (
        f"{head}\nin {positive} of {len(rho)} runs a frequent token's row moves further (Spearman ρ > 0); "
        f"the strongest link: {strongest}, ρ = {rho[strongest]:+.2f}"
    )


def embedding_rows(results: Results) -> Figure:
    items = list(results["runs"].items())
    fig, axes = style.panels(len(items), 3.5)
    colors = style.run_colors(results["runs"])
    for ax, (label, run) in zip(axes.flat, items, strict=False):
        rows = run["embedding_rows"]
        counts, update = style.positive(rows["count"]), style.positive(rows["update"])
        shown = np.isfinite(counts) & np.isfinite(update) if len(update) == len(counts) else np.zeros(0, bool)
        if not shown.any():
            style.nothing_to_show(ax, f"{label}{status_note(run)}:\nno embedding-row updates were measured")
            continue
        ax.scatter(counts[shown], update[shown], s=14, alpha=0.75, color=colors[label])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("token count in the training text")
        ax.set_ylabel("mean ‖Δ row‖ per measured step")
        title = f"{label}: Spearman ρ = {rows['spearman']:+.2f}{status_note(run)}"
        ax.set_title(style.fill(title, style.column(axes.shape[1]), 10), fontsize=10)
    fig.suptitle(style.fill(embedding_title(results), style.WIDTH, 11), fontsize=11)
    return fig


def summary_title(results: Results) -> str:
    """The run with the lowest final validation loss, and by how much, from the run's own numbers."""
    finals = {label: run["final"]["val_loss"] for label, run in results["runs"].items()}
    finals = {label: v for label, v in finals.items() if isinstance(v, int | float) and math.isfinite(v)}
    if not finals:
        return "Language model: no run has a finite final validation loss; the samples each run wrote"
    best = min(finals, key=finals.get)
    final = results["runs"][best]["final"]
    others = [v for label, v in finals.items() if label != best]
    gap = f", {min(others) - finals[best]:.3f} below the next run" if others else ""
    return (
        f"Language model: {best} ends with the lowest validation loss, {finals[best]:.3f} "
        f"(perplexity {style.fmt(final['perplexity'], '.2f')}) after {final['steps']} steps{gap}"
    )


def summary(results: Results) -> Figure:
    items = list(results["runs"].items())
    header = ["run", "status", "steps", "final val loss", "perplexity", "tokens/s"]
    rows = []
    for label, run in items:
        f = run["final"]
        rows.append(
            [
                label,
                "ok" if run["status"] == "ok" else status_note(run).strip(" ()"),
                f"{f['steps']}",
                style.fmt(f["val_loss"], ".3f"),
                style.fmt(f["perplexity"], ".2f"),
                style.fmt(f["tokens_per_s"], ",.0f"),
            ]
        )
    lines: list[tuple[str, dict[str, Any]]] = [
        ("Greedy samples (temperature 0) at the last evaluation; ⏎ marks a newline", {"fontweight": "bold"})
    ]
    per_line = int(style.WIDTH * 72 / (0.6 * style.SMALL)) - 6  # monospace: 0.6 em a character; 4 of indent
    for label, run in items:
        if run["samples"]:
            last = run["samples"][-1]
            lines.append((f"{label} (step {last['step']})", {"fontweight": "bold"}))
            for s in last["samples"]:
                text = (s["prompt"] + " ▸ " + s["output"]).replace("\n", "⏎").replace("$", r"\$")
                text = text if len(text) <= 2 * per_line else text[: 2 * per_line - 1] + "…"
                # cut, not wrapped at spaces: the spaces are the model's output too
                lines += [
                    ("    " + text[i : i + per_line], {"family": "monospace"}) for i in range(0, len(text), per_line)
                ]
    table_h, line_h = 0.27 * (len(rows) + 1), 0.24
    fig = plt.figure(figsize=(style.WIDTH, 1.0 + table_h + line_h * len(lines)))
    height = fig.get_figheight()
    table_ax = fig.add_axes((0.01, 1 - (0.55 + table_h) / height, 0.98, table_h / height))
    table_ax.axis("off")
    table = table_ax.table(cellText=rows, colLabels=header, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.auto_set_column_width(range(len(header)))  # each column as wide as its text: a status is longer
    table.scale(1, 1.3)
    y = 1 - (0.75 + table_h) / height
    for text, kwargs in lines:
        fig.text(0.01, y, text, fontsize=style.SMALL, va="top", **kwargs)
        y -= line_h / height
    fig.suptitle(style.fill(summary_title(results), style.WIDTH, 11), fontsize=11, y=1 - 0.1 / height, va="top")
    return fig


FIGURES = {
    "lm_loss.png": losses,
    "lm_update_ratio.png": update_ratios,
    "lm_embedding_rows.png": embedding_rows,
    "lm_summary.png": summary,
}
