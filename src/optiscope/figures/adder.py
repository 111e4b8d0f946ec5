"""Figures of the ``adder`` experiment, drawn from results.json alone.

* ``adder_explainer.png`` — how the best model adds, in seven panels: the data flow with each
  component's real parameter count, the learned token arc, the position spiral with its EQUALS and
  CARRY points (learned or frozen), the norm weights (or, with none, the norm's gain on the
  example), the attention pattern while it adds a real example,
  the rank-r value/output vectors with each digit's value, and the parameter budget. The subtitle
  is the accuracy measured on the suite.
* ``adder_training.png`` — loss and exact suite accuracy against step, one line per seed.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from . import style

SITES = ["before attention", "before FFN", "before head"]
COMPONENT_COLORS = {
    "token embedding": "#2e8b57",
    "positions": "#7d5ba6",
    "norm": "#d4802a",
    "attention": "#b03a2e",
    "FFN": "#1f6fb2",
    "output head": "#1a9c8c",
}


# ---------------------------------------------------------------------------------------- helpers
def best_record(results: dict[str, Any]) -> dict[str, Any]:
    best = results["best"]
    return next(r for r in results["runs"] if r["label"] == best["label"] and r["seed"] == best["seed"])


def accuracy_line(record: dict[str, Any], cases: int) -> str:
    return f"{record['correct']:,}/{cases:,} exact ({100 * record['correct'] / cases:.2f}%)"


def box(ax, x: float, y: float, w: float, h: float, title: str, sub: str, color: str) -> None:
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.2", facecolor="white", edgecolor=color, linewidth=1.6)
    )
    ax.text(x + w / 2, y + h * 0.62, title, ha="center", va="center", fontsize=10.5, weight="bold", color=color)
    ax.text(x + w / 2, y + h * 0.28, sub, ha="center", va="center", fontsize=8.5, color=style.MUTED)


# ----------------------------------------------------------------------------------------- panels
def panel_flow(ax, ex: dict, cfg: dict, totals: dict[str, int]) -> None:
    """The forward pass as boxes, each labelled with its real parameter count."""
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 20)
    ax.axis("off")
    ax.set_title("Data flow: one layer, every box with the parameters it really has", loc="left")
    example = ex["example"]
    ax.text(
        1,
        18,
        f"input (least significant digit first):  {' '.join(example['tokens'][:22])}",
        fontsize=10,
        family="monospace",
    )
    d = cfg["tok_dim"] + cfg["pos_dim"]
    steps = [
        ("token embedding", f"{cfg['token_embedding']}, {cfg['tok_dim']}-D"),
        ("positions", f"{cfg['positions']}, {cfg['pos_dim']}-D"),
        ("norm", f"RMSNorm: {cfg['norm']}"),
        ("attention", f"{cfg['n_heads']} head(s), qk {cfg['qk_dim']}, rank {cfg['attn_rank']}"),
        ("FFN", f"{d}→{cfg['ffn_width']}→{d}, GELU"),
        ("output head", f"{d}→{cfg['tok_dim']} · e(digit)ᵀ"),
    ]
    width, gap = 14.5, 1.9
    for i, (name, sub) in enumerate(steps):
        x = 1 + i * (width + gap)
        box(ax, x, 7, width, 6.5, name, f"{sub}\n{totals.get(name, 0)} params", COMPONENT_COLORS[name])
        if i:
            ax.annotate("", xy=(x - 0.3, 10.2), xytext=(x - gap + 0.3, 10.2), arrowprops=dict(arrowstyle="->"))
    ax.text(
        1,
        3.5,
        f"residual: d = {d} = {cfg['tok_dim']} token dims | {cfg['pos_dim']} position dims;  "
        "x ← x + attention(norm x);  x ← x + FFN(norm x);  logits = head(norm x) · e(0…9)ᵀ → argmax",
        fontsize=9,
        color=style.MUTED,
    )
    ax.text(
        1,
        0.8,
        f"answer written by greedy decoding (least significant first):  {written_digits(example)}"
        f"   →   {example['a']:,} + {example['b']:,} = {example['answer']:,}",
        fontsize=10,
        family="monospace",
        color=style.GOOD if example["answer"] == example["a"] + example["b"] else style.BAD,
    )


def written_digits(example: dict) -> str:
    """The answer digits the model wrote, least significant first, leading zeros included: the tokens fed
    back after '=' are every digit but the last, so there are as many digits as tokens from '=' on."""
    digits = len(example["tokens"]) - example["tokens"].index("=")
    return " ".join(str(example["answer"]).zfill(digits)[::-1])


def shared_labels(points) -> list[tuple[tuple[float, ...], str, bool]]:
    """(point, label, alone) for the digit places ``points`` (row i is digit i): digits at one point (an
    untrained table, a table of zeros) share one label there, which names them all; points not finite have none."""
    places: dict[tuple[float, ...], list[str]] = {}
    for digit, point in enumerate(np.asarray(points, dtype=float)):
        if np.all(np.isfinite(point)):
            places.setdefault(tuple(point), []).append(str(digit))
    return [
        (point, digits[0] if len(digits) == 1 else f"{','.join(digits)}: one point", len(digits) == 1)
        for point, digits in places.items()
    ]


def panel_tokens(ax, ex: dict) -> None:
    vectors = np.array(ex["token_vectors"])
    weights = ex["weights"]
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.95, 10))
    if "token.radius" in weights:
        r, start, stride = weights["token.radius"], weights["token.start"], weights["token.stride"]
        circle = np.linspace(0, 2 * np.pi, 200)
        ax.plot(r * np.cos(circle), r * np.sin(circle), color="#d0d0d0", lw=0.8, ls=":")
        arc = np.linspace(start, start + 9 * stride, 100)
        ax.plot(r * np.cos(arc), r * np.sin(arc), color=COMPONENT_COLORS["token embedding"], lw=2, alpha=0.4)
        title = "Token embedding: the digits on a circular arc (3 parameters)"
        text = (
            f"radius r = {r:.3f}\nstart α = {np.degrees(start):.1f}°\nstride δ = {np.degrees(stride):.1f}°\n"
            "the same vectors score the output"
        )
    else:
        title = f"Token embedding: learned table ({len(weights['token.weight'])} × {vectors.shape[1]})"
        text = "the same vectors score the output"
    xy = vectors[:, :2]
    ax.scatter(xy[:, 0], xy[:, 1], c=colors, s=260, edgecolors="white", zorder=3)
    for (px, py), text, alone in shared_labels(xy):
        ax.text(px, py, text, ha="center", va="center", color="white" if alone else style.INK, weight="bold", zorder=4)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("token dim 0")
    ax.set_ylabel("token dim 1")
    ax.set_title(title)
    style.note(ax, text, (0.02, 0.02), va="bottom")


def panel_positions(ax, ex: dict) -> None:
    table = np.array(ex["positions"])
    labels = ex["position_labels"]
    if table.shape[1] < 3:
        table = np.pad(table, ((0, 0), (0, 3 - table.shape[1])))
    places = table[:10, :3]
    ax.plot(*places.T, color=COMPONENT_COLORS["positions"], lw=1.5, alpha=0.5)
    ax.scatter(*places.T, c=plt.get_cmap("viridis")(np.linspace(0, 0.95, 10)), s=70, depthshade=False)
    for p, text, _ in shared_labels(places):  # above each point, clear of its marker
        ax.text(*p, text, fontsize=8, ha="center", va="bottom", zorder=10)
    cfg = ex["config"]
    if cfg["positions"] == "spiral":
        how = "learned" if cfg["learned_points"] else "frozen"
        for name, label, marker, color in (("=", "EQUALS", "D", "#1f6fb2"), ("z9", "CARRY", "*", style.BAD)):
            p = table[labels.index(name), :3]
            # named in the legend: a label beside the point covered a digit place or the axis's ticks
            ax.scatter(*p, marker=marker, s=180, color=color, depthshade=False, label=f"{label} ({how})")
        ax.legend(loc="upper left", fontsize=8)
        a, phase, slope, offset = cfg["spiral"]
        formula = f"p(i) = ({a:g} cos(2πi/{cfg['turn']} {phase:+g}), {a:g} sin(…), {slope:g}·i {offset:+g})"
        title = (
            f"Positions: frozen spiral, {cfg['turn']} places per turn; EQUALS, CARRY {how}\n"
            f"{formula}; xᵢ, yᵢ, zᵢ share place i, PLUS at 0"
        )
    else:
        title = "Positions: learned table (first 3 dims), digit places of x"
    ax.set_title(title, fontsize=10.5)
    ax.set_xlabel("pos dim 0")
    ax.set_ylabel("pos dim 1")
    ax.set_zlabel("pos dim 2")
    ax.view_init(elev=22, azim=-55)


def panel_norm(ax, ex: dict) -> None:
    """Learned norm weights if there are any, else what the weightless norm does on the example."""
    cfg = ex["config"]
    names = [f"tok{i}" for i in range(cfg["tok_dim"])] + [f"pos{i}" for i in range(cfg["pos_dim"])]
    weights = ex["norm_weights"]
    if weights is None:
        sites = SITES
        writers = ["=", *[f"z{i}" for i in range(len(ex["norm_gains"][0]) - 1)]]
        for site, gains, color in zip(sites, ex["norm_gains"], style.ramp(3), strict=True):
            ax.plot(range(len(gains)), gains, marker="o", ms=4, color=color, label=site)
        ax.set_xticks(range(len(writers)), [f"{w}→z{i}" for i, w in enumerate(writers)], rotation=45, fontsize=7)
        ax.set_ylabel("1 / RMS(residual): the norm's gain")
        ax.legend()
        applied = "not applied" if cfg["norm"] == "none" else "applied; no learned weights (0 parameters)"
        ax.set_title(f"Norm: RMSNorm {applied}\nits gain on the example, where answer digits are written")
        return
    sites = ["shared (attention, FFN, head)"] if len(weights) == 1 else SITES
    x = np.arange(len(names))
    width = 0.8 / len(weights)
    for i, (site, w) in enumerate(zip(sites, weights, strict=True)):
        bars = ax.bar(x + (i - (len(weights) - 1) / 2) * width, w, width, label=site, color=style.ramp(len(weights))[i])
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1, color=style.MUTED, lw=0.8, ls="--")
    ax.set_xticks(x, names)
    ax.set_ylabel("RMSNorm weight (1 = untouched)")
    ax.legend()
    ax.set_title(f"Norm weights: {cfg['norm']} ({len(weights) * len(names)} parameters)")


def panel_attention(ax, ex: dict) -> None:
    """Rows: the positions that write answer digits; columns: every position; colour: weight."""
    example = ex["example"]
    att = np.array(example["attention"])  # (H, T, T)
    labels = ex["position_labels"]
    tokens = example["tokens"]
    first = labels.index("=")
    rows = range(first, att.shape[1])
    block = np.concatenate([att[h, first:] for h in range(att.shape[0])])
    ax.imshow(block, aspect="auto", cmap="magma_r", vmin=0, vmax=1)
    ax.set_xticks(range(att.shape[2]), [f"{lab}\n{tok}" for lab, tok in zip(labels, tokens, strict=True)], fontsize=6.5)
    ylabels = [f"h{h}: {labels[r]}→z{r - first}" for h in range(att.shape[0]) for r in rows]
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
    ax.grid(False)
    for i, row in enumerate(block):
        for k in np.argsort(row)[-2:]:
            if row[k] >= 0.1:
                ax.text(k, i, f"{row[k]:.2f}", ha="center", va="center", fontsize=5.5, color="white")
    summary = "; ".join(f"head {h}: {text}" for h, text in enumerate(ex["routing"]))
    ax.set_title(
        f"Attention while adding {example['a']:,} + {example['b']:,}: where each answer digit looks "
        f"(weights ≥ 0.1 printed)\nslot of zⱼ (writes zⱼ₊₁): {summary}",
        loc="left",
    )


def panel_values(ax, digits_ax, ex: dict) -> None:
    w = ex["weights"]
    value = np.array(w["attention.value"])  # (H, r, v)
    output = np.array(w["attention.output"])  # (H, d, r)
    cfg = ex["config"]
    names = [f"tok{i}" for i in range(cfg["tok_dim"])] + [f"pos{i}" for i in range(cfg["pos_dim"])]
    v_names = {"tok": names[: cfg["tok_dim"]], "pos": names[cfg["tok_dim"] :], "all": names}[cfg["v_source"]]
    title = f"Rank-{cfg['attn_rank']} attention output: value = U·x_{cfg['v_source']}, update = B × (mixed value)"
    heads, rank = value.shape[:2]
    if heads * rank * (len(v_names) + len(names)) > 24:  # too many bars to read: one cell per weight
        cells = np.full((2 * heads * rank, len(names)), np.nan)
        labels = []
        for h in range(heads):
            for r in range(rank):
                i = 2 * (h * rank + r)
                cells[i, [names.index(n) for n in v_names]] = value[h, r]
                cells[i + 1] = output[h, :, r]
                labels += [f"h{h} U{r} (reads)", f"h{h} B{r} (writes)"]
        bound = np.nanmax(np.abs(cells))
        ax.imshow(cells, aspect="auto", cmap="PuOr", vmin=-bound, vmax=bound)
        for (i, k), v in np.ndenumerate(cells):
            if np.isfinite(v):
                ink = "white" if abs(v) > 0.6 * bound else style.INK
                ax.text(k, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color=ink)
        ax.set_xticks(range(len(names)), names)
        ax.set_yticks(range(len(labels)), labels, fontsize=7.5)
        ax.grid(False)
    else:
        rows, colors = [], []
        for h in range(heads):
            for r in range(rank):
                rows += [(f"h{h} U{r}·{n}", v) for n, v in zip(v_names, value[h, r], strict=True)]
                rows += [(f"h{h} B{r}→{n}", v) for n, v in zip(names, output[h, :, r], strict=True)]
                colors += ["#7d5ba6"] * len(v_names) + ["#d4802a"] * len(names)
        y = np.arange(len(rows))[::-1]
        ax.barh(y, [v for _, v in rows], color=colors)
        ax.set_yticks(y, [n for n, _ in rows], fontsize=7)
        ax.yaxis.tick_right()  # on the left, these long names ran into the attention heatmap beside the panel
        ax.axvline(0, color=style.INK, lw=0.6)
    ax.set_title(title, fontsize=10)
    if digits_ax is None:
        return
    digit_values = np.array(ex["digit_values"])  # (H, r, 10)
    for h in range(digit_values.shape[0]):
        for r in range(digit_values.shape[1]):
            digits_ax.plot(range(10), digit_values[h, r], marker="o", ms=4, label=f"h{h} U{r}·e(d)")
    digits_ax.set_xticks(range(10))
    digits_ax.set_xlabel("digit d")
    digits_ax.set_ylabel("value offered")
    digits_ax.set_title("What each digit offers to attention: U·e(d)", fontsize=10)
    digits_ax.legend()


def panel_budget(ax, ex: dict) -> None:
    rows = [r for r in ex["budget"] if r["params"] > 0]
    frozen = [r for r in ex["budget"] if r["params"] == 0]
    total = ex["params"]
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 10)
    ax.axis("off")
    ax.set_title(f"Parameter budget: all {total} parameters, read from the module", loc="left")
    x, segments = 0.0, []
    for row in rows:
        width = 82 * row["params"] / total
        color = COMPONENT_COLORS.get(row["component"], style.MUTED)
        ax.add_patch(FancyBboxPatch((x, 4), width, 3, boxstyle="square,pad=0", facecolor=color, edgecolor="white"))
        segments.append((x + width / 2, f"{row['name']} ({row['params']})"))
        x += width
    label_segments(ax, segments)
    ax.text(84, 8.2, "free (frozen, 0 parameters):", fontsize=9, weight="bold", color=style.MUTED)
    frozen = frozen or [{"name": "none", "shape": []}]
    for i, row in enumerate(frozen):
        ax.text(84, 7.3 - 0.75 * i, f"{row['name']} {tuple(row['shape'])}", fontsize=8.5, color=style.MUTED)
    top = 7.3 - 0.75 * len(frozen) - 0.5
    for i, (name, n) in enumerate(ex["component_totals"].items()):
        ax.text(84, top - 0.75 * i, f"{name}: {n}", fontsize=8.5, color=COMPONENT_COLORS.get(name, style.INK))


def label_segments(ax, segments: list[tuple[float, str]], size: float = 7.5) -> None:
    """A horizontal label under each bar segment (x centre, text), joined to it by a thin line, in the first row
    where it clears the labels already there: a sliver of one parameter gets its name like a wide segment."""
    fig = ax.get_figure()
    points_per_unit = 72 * fig.get_figwidth() * ax.get_position().width / np.ptp(ax.get_xlim())
    ends: list[float] = []  # the right end of the last label of each row, in data units
    for centre, text in segments:
        half = 0.5 * len(text) * size * 0.62 / points_per_unit + 0.4  # DejaVu's mean glyph width, a margin
        centre = max(centre, half)
        row = next((k for k, end in enumerate(ends) if centre - half > end), len(ends))
        if row == len(ends):
            ends.append(centre + half)
        ends[row] = centre + half
        y = 3.3 - 1.0 * row
        ax.plot([centre, centre], [4, y + 0.2], color=style.MUTED, lw=0.5)
        ax.text(centre, y, text, ha="center", va="top", fontsize=size)
    ax.set_ylim(min(0, 3.3 - 1.0 * len(ends) - 0.5), 10)


# ---------------------------------------------------------------------------------------- figures
def explainer(results: dict[str, Any]) -> Figure:
    ex = results["explain"]
    best = best_record(results)
    fig = plt.figure(figsize=(22, 22))
    grid = fig.add_gridspec(4, 6, height_ratios=[0.6, 1.15, 1.35, 0.6], hspace=0.3, wspace=0.4)
    panel_flow(fig.add_subplot(grid[0, :]), ex, ex["config"], ex["component_totals"])
    panel_tokens(fig.add_subplot(grid[1, 0:2]), ex)
    panel_positions(fig.add_subplot(grid[1, 2:4], projection="3d"), ex)
    panel_norm(fig.add_subplot(grid[1, 4:6]), ex)
    panel_attention(fig.add_subplot(grid[2, 0:4]), ex)
    if ex["digit_values"] is None:  # values read more than the token dims: no per-digit offer to draw
        panel_values(fig.add_subplot(grid[2, 4:6]), None, ex)
    else:
        value_grid = grid[2, 4:6].subgridspec(2, 1, height_ratios=[2.2, 1], hspace=0.35)
        panel_values(fig.add_subplot(value_grid[0]), fig.add_subplot(value_grid[1]), ex)
    panel_budget(fig.add_subplot(grid[3, :]), ex)
    success = results["success"][best["label"]]
    fig.suptitle(f"A {ex['params']}-parameter transformer that adds two 10-digit numbers", fontsize=22, y=0.935)
    fig.text(
        0.5,
        0.915,
        f"measured on the 10,010-case suite by greedy decoding: {accuracy_line(best, results['cases'])}  ·  "
        f"{best['label']}, seed {best['seed']}, {best['best_step']:,} steps  ·  {success['perfect']}/"
        f"{success['tried']} seeds at 100%  ·  1 layer, d_model {ex['config']['tok_dim'] + ex['config']['pos_dim']}",
        ha="center",
        fontsize=12.5,
        color=style.MUTED,
    )
    return fig


def training(results: dict[str, Any]) -> Figure:
    fig, (loss_ax, acc_ax, wrong_ax) = plt.subplots(1, 3, figsize=(18, 4.8))
    cases = results["cases"]
    several = len({r["label"] for r in results["runs"]}) > 1
    for i, record in enumerate(results["runs"]):
        color = style.CATEGORICAL[i % len(style.CATEGORICAL)]  # seeds and settings, not recipes
        name = f"{record['label']} seed {record['seed']}" if several else f"seed {record['seed']}"
        ending = f", diverged at step {record['divergence']['step']}" if record["status"] == "diverged" else ""
        label = f"{name}: {accuracy_line(record, cases)}{ending}"
        steps = record["train"]["step"]
        loss = style.positive(record["train"]["loss"])
        loss_ax.plot(steps, loss, color=color, lw=1, label=label, **style.lone_marker(steps))
        steps = [e["step"] for e in record["evals"]]
        correct = np.array([e["correct"] for e in record["evals"]], dtype=float)
        acc_ax.plot(steps, 100 * correct / cases, color=color, marker=".", label=label)
        wrong_ax.plot(steps, cases - correct, color=color, marker=".", label=label)
    style.log_scale(loss_ax, "y", *[r["train"]["loss"] for r in results["runs"]])
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("training loss (cross-entropy per answer digit)")
    loss_ax.set_title("Loss")
    acc_ax.axhline(100, color=style.GOOD, lw=0.8, ls="--")
    acc_ax.set_xlabel("step")
    acc_ax.set_ylabel("exact answers on the suite (%)")
    style.fraction_axis(acc_ax, whole=100)
    acc_ax.set_title(f"Exact accuracy on the {cases:,} cases")
    acc_ax.legend(loc="lower right")
    wrong_ax.set_yscale("symlog", linthresh=1)
    style.count_axis(wrong_ax, [cases - e["correct"] for r in results["runs"] for e in r["evals"]])
    wrong_ax.set_xlabel("step")
    wrong_ax.set_ylabel("wrong answers (0 = all right)")
    wrong_ax.set_title("The last errors (symmetric log scale)")
    reached = "; ".join(
        f"{label}: {s['perfect']} of {s['tried']} seeds" if several else f"{s['perfect']} of {s['tried']} seeds"
        for label, s in results["success"].items()
    )
    fig.suptitle(f"adder, {results['params']} parameters: {reached} reached {cases:,}/{cases:,}")
    fig.tight_layout()
    return fig


FIGURES = {"adder_explainer.png": explainer, "adder_training.png": training}
