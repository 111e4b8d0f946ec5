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


def _line_style(label: str, run: RunResults, index: int) -> dict[str, Any]:
    return {"color": style.optimizer_color(run["optimizer"], index), "ls": "-" if "@" not in label else "--"}


def status_note(run: RunResults) -> str:
    """'' for a finished run, ' (diverged at step N)' for a diverged one."""
    if run["status"] == "ok":
        return ""
    step = (run["divergence"] or {}).get("step")
    return f" (diverged at step {step})" if step is not None else f" ({run['status']})"


def losses(results: Results) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    starts = []
    for i, (label, run) in enumerate(results["runs"].items()):
        st = _line_style(label, run, i)
        train, ev = run["train"], run["eval"]
        train_loss, val_loss = style.finite(train["loss"]), style.finite(ev["val_loss"])
        starts += [v for v in (*train_loss[:1], *val_loss[:1]) if np.isfinite(v)]
        for ax, key in ((axes[0], "step"), (axes[1], "seconds")):
            ax.plot(style.finite(train[key]), train_loss, color=st["color"], ls=st["ls"], lw=0.8, alpha=0.35)
            ax.plot(
                style.finite(ev[key]),
                val_loss,
                color=st["color"],
                ls=st["ls"],
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
                    ax.plot([x], [y], marker="x", ms=11, mew=2.5, color=st["color"])
    for ax, xlabel in ((axes[0], "optimizer step"), (axes[1], "training wall-clock (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        if starts and max(starts) > 0:
            ax.set_ylim(top=max(starts) * 1.08)  # a run that blew up does not flatten the others
    axes[0].set_title("Validation (solid) and training (faint) loss per step")
    axes[1].set_title("… against training time")
    axes[0].legend(loc="upper right")
    corpus = results["corpus"]
    fig.suptitle(
        f"{results['model']['parameters'] / 1e6:.2f}M-parameter GPT on {corpus['tokenizer']}-level text "
        f"({corpus['train_tokens']:,} training tokens, vocabulary {corpus['vocab_size']})",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def _grid(n: int, width: float, height: float, **kwargs: Any) -> tuple[Figure, np.ndarray]:
    cols = min(3, max(n, 1))
    rows = max(math.ceil(n / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **kwargs)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, axes


def update_ratios(results: Results) -> Figure:
    items = list(results["runs"].items())
    fig, axes = _grid(len(items), 4.6, 3.4, sharey=True)
    for ax, (label, run) in zip(axes.flat, items, strict=False):
        ratios = run["update_ratio"]
        layers = sorted(ratios["layers"])
        colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(layers), 1)))
        for color, layer in zip(colors, layers, strict=True):
            ax.plot(
                ratios["step"],
                style.positive(ratios["layers"][layer]),
                color=color,
                lw=1.2,
                label=layer,
                **style.lone_marker(ratios["step"]),
            )
        style.log_scale(ax, "y", *ratios["layers"].values())
        ax.set_title(f"{label}{status_note(run)}", fontsize=10)
        ax.set_xlabel("step")
        if ax in axes[:, 0]:
            ax.set_ylabel("u / w per step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.suptitle("Update-to-weight ratio of each layer (‖Δθ‖ / ‖θ‖, measured by the monitor)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig


def embedding_rows(results: Results) -> Figure:
    items = list(results["runs"].items())
    fig, axes = _grid(len(items), 4.6, 3.8)
    for i, (ax, (label, run)) in enumerate(zip(axes.flat, items, strict=False)):
        rows = run["embedding_rows"]
        counts, update = style.positive(rows["count"]), style.positive(rows["update"])
        shown = np.isfinite(counts) & np.isfinite(update) if len(update) == len(counts) else np.zeros(0, bool)
        if not shown.any():
            style.nothing_to_show(ax, f"{label}{status_note(run)}:\nno embedding-row updates were measured")
            continue
        ax.scatter(counts[shown], update[shown], s=14, alpha=0.75, color=_line_style(label, run, i)["color"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("token count in the training text")
        ax.set_ylabel("mean ‖Δ row‖ per measured step")
        ax.set_title(f"{label}: Spearman ρ = {rows['spearman']:+.2f}{status_note(run)}", fontsize=10)
    fig.suptitle("Embedding rows: how far each token's row moves vs how often the token occurs", fontsize=11)
    fig.tight_layout()
    return fig


def summary(results: Results) -> Figure:
    items = list(results["runs"].items())
    header = ["run", "status", "steps", "final val loss", "perplexity", "tokens/s"]
    rows = []
    for label, run in items:
        f = run["final"]
        rows.append(
            [
                label,
                (run["status"] + status_note(run)).strip(),
                f"{f['steps']}",
                style.fmt(f["val_loss"], ".3f"),
                style.fmt(f["perplexity"], ".2f"),
                style.fmt(f["tokens_per_s"], ",.0f"),
            ]
        )
    lines: list[tuple[str, dict[str, Any]]] = [
        ("Greedy samples (temperature 0) at the last evaluation; ⏎ marks a newline", {"fontweight": "bold"})
    ]
    for label, run in items:
        if run["samples"]:
            last = run["samples"][-1]
            lines.append((f"{label} (step {last['step']})", {"fontweight": "bold"}))
            for s in last["samples"]:
                text = (s["prompt"] + " ▸ " + s["output"]).replace("\n", "⏎").replace("$", r"\$")
                text = text if len(text) <= 140 else text[:139] + "…"  # spaces kept: they are output too
                lines.append(("    " + text, {"family": "monospace"}))
    table_h, line_h = 0.27 * (len(rows) + 1), 0.24
    fig = plt.figure(figsize=(13, 0.8 + table_h + line_h * len(lines)))
    height = fig.get_figheight()
    table_ax = fig.add_axes((0.01, 1 - (0.55 + table_h) / height, 0.98, table_h / height))
    table_ax.axis("off")
    table = table_ax.table(cellText=rows, colLabels=header, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.3)
    y = 1 - (0.75 + table_h) / height
    for text, kwargs in lines:
        fig.text(0.01, y, text, fontsize=8.5, va="top", **kwargs)
        y -= line_h / height
    fig.suptitle("Language model: final numbers and samples", fontsize=11, y=1 - 0.1 / height)
    return fig


FIGURES = {
    "lm_loss.png": losses,
    "lm_update_ratio.png": update_ratios,
    "lm_embedding_rows.png": embedding_rows,
    "lm_summary.png": summary,
}
