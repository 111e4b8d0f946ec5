"""Figures of the ``lm`` experiment, drawn from its results.json alone.

* ``lm_loss.png`` — validation (solid) and training (faint) loss against step and against training
  wall-clock, one colour per optimizer; a diverged run ends in a cross at the step it diverged.
* ``lm_update_ratio.png`` — u/w of each layer over training, one panel per run.
* ``lm_embedding_rows.png`` — each embedding row's mean update against how often its token occurs,
  one panel per run, with the Spearman rank correlation measured between the two.
* ``lm_summary.png`` — the table of final validation loss, perplexity and throughput, and the greedy
  samples of the last evaluation.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..monitor.stats import spearman
from . import style


def _label_style(label: str, run: dict[str, Any], index: int) -> dict[str, Any]:
    default_lr = "@" not in label
    return {"color": style.optimizer_color(run["optimizer"], index), "ls": "-" if default_lr else "--"}


def _status_note(run: dict[str, Any]) -> str:
    return "" if run["status"] == "ok" else f" ({run['status']})"


def draw_losses(results: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    top = 0.0
    for i, (label, run) in enumerate(results["runs"].items()):
        st = _label_style(label, run, i)
        train, ev = run["train"], run["eval"]
        finite_train = [x for x in train["loss"] if x is not None and math.isfinite(x)]
        top = max([top] + finite_train[:1] + ev["val_loss"][:1])
        for ax, key in ((axes[0], "step"), (axes[1], "seconds")):
            ax.plot(train[key], train["loss"], color=st["color"], ls=st["ls"], lw=0.8, alpha=0.35)
            ax.plot(
                ev[key] if key == "step" else ev["seconds"],
                ev["val_loss"],
                color=st["color"],
                ls=st["ls"],
                lw=2,
                marker="o",
                ms=3,
                label=f"{label}{_status_note(run)}",
            )
            if run["divergence"]:
                d = run["divergence"]
                x = d["step"] if key == "step" else (train["seconds"][-1] if train["seconds"] else 0)
                y = train["loss"][-1] if train["loss"] else (ev["val_loss"][-1] if ev["val_loss"] else 0)
                y = y if y is not None and math.isfinite(y) else top
                ax.plot([x], [y], marker="x", ms=11, mew=2.5, color=st["color"])
    for ax, xlabel in ((axes[0], "optimizer step"), (axes[1], "training wall-clock (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats/token)")
        if top > 0:
            ax.set_ylim(top=top * 1.08)
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
    return style.save(fig, path)


def draw_update_ratios(results: dict[str, Any], path: Path) -> Path:
    items = list(results["runs"].items())
    cols = min(3, len(items))
    rows = math.ceil(len(items) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax, (label, run) in zip(axes.flat, items, strict=False):
        ratios = run["update_ratio"]
        layers = sorted(ratios["layers"])
        colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(layers), 1)))
        for color, layer in zip(colors, layers, strict=True):
            values = np.asarray(ratios["layers"][layer], dtype=float)
            ax.plot(ratios["step"], np.where(values > 0, values, np.nan), color=color, lw=1.2, label=layer)
        ax.set_yscale("log")
        ax.set_title(f"{label}{_status_note(run)}", fontsize=10)
        ax.set_xlabel("step")
        if ax in axes[:, 0]:
            ax.set_ylabel("u / w per step")
    for ax in list(axes.flat)[len(items) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.suptitle("Update-to-weight ratio of each layer (‖Δθ‖ / ‖θ‖, measured by the monitor)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return style.save(fig, path)


def draw_embedding_rows(results: dict[str, Any], path: Path) -> Path:
    items = [(k, r) for k, r in results["runs"].items() if r["embedding_rows"]["update"]]
    cols = min(3, max(len(items), 1))
    rows = max(math.ceil(len(items) / cols), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    for i, (ax, (label, run)) in enumerate(zip(axes.flat, items, strict=False)):
        counts = np.asarray(run["embedding_rows"]["count"], dtype=float)
        update = np.asarray(run["embedding_rows"]["update"], dtype=float)
        seen = counts > 0
        rho = spearman(torch.as_tensor(counts[seen]), torch.as_tensor(update[seen]))
        ax.scatter(
            counts[seen], np.maximum(update[seen], 1e-12), s=14, alpha=0.75, color=_label_style(label, run, i)["color"]
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("token count in the training text")
        ax.set_ylabel("mean ‖Δ row‖ per measured step")
        ax.set_title(f"{label}: Spearman ρ = {rho:+.2f}", fontsize=10)
    for ax in list(axes.flat)[len(items) :]:
        ax.axis("off")
    fig.suptitle("Embedding rows: how far each token's row moves vs how often the token occurs", fontsize=11)
    fig.tight_layout()
    return style.save(fig, path)


def draw_summary(results: dict[str, Any], path: Path) -> Path:
    items = list(results["runs"].items())
    header = ["run", "status", "steps", "final val loss", "perplexity", "tokens/s"]
    rows = []
    for label, run in items:
        f = run["final"]
        rows.append(
            [
                label,
                run["status"],
                f"{f['steps']}",
                f"{f['val_loss']:.3f}" if math.isfinite(f["val_loss"]) else "—",
                f"{f['perplexity']:.2f}" if math.isfinite(f["perplexity"]) else str(f["perplexity"]),
                f"{f['tokens_per_s']:,.0f}" if math.isfinite(f["tokens_per_s"]) else "—",
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
                text = (s["prompt"] + " ▸ " + s["output"]).replace("\n", "⏎")
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
    return style.save(fig, path)


def draw(results: dict[str, Any], fig_dir: Path) -> list[Path]:
    style.apply()
    return [
        draw_losses(results, fig_dir / "lm_loss.png"),
        draw_update_ratios(results, fig_dir / "lm_update_ratio.png"),
        draw_embedding_rows(results, fig_dir / "lm_embedding_rows.png"),
        draw_summary(results, fig_dir / "lm_summary.png"),
    ]
