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
    ax.text(x + w / 2, y + h * 0.76, title, ha="center", va="center", fontsize=10.5, weight="bold", color=color)
    ax.text(x + w / 2, y + h * 0.32, sub, ha="center", va="center", fontsize=style.SMALL, color=style.MUTED)


# ----------------------------------------------------------------------------------------- panels
def panel_flow(ax, ex: dict, cfg: dict, totals: dict[str, int]) -> None:
    """The forward pass as boxes, each labelled with its real parameter count."""
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 34)
    ax.axis("off")
    ax.set_title("Data flow: one layer, every box with the parameters it really has", loc="left")
    example = ex["example"]
    ax.text(
        1,
        33,
        f"input (least significant digit first):  {' '.join(example['tokens'][:22])}",
        fontsize=9,
        family="monospace",
        va="top",
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
    # two rows of three boxes, read left to right, then the second row: wide enough for their names at 10.5 pt
    width, gap = 28.5, 4.5
    for i, (name, sub) in enumerate(steps):
        x, y = 1.5 + (i % 3) * (width + gap), 20.5 if i < 3 else 9.5
        box(ax, x, y, width, 8, name, f"{sub}\n{totals.get(name, 0)} params", COMPONENT_COLORS[name])
        if i % 3:
            ax.annotate("", xy=(x - 0.6, y + 4), xytext=(x - gap + 0.6, y + 4), arrowprops=dict(arrowstyle="->"))
    ax.annotate(  # from the end of the first row to the start of the second
        "",
        xy=(1.5 + width / 2, 17.9),
        xytext=(1.5 + 2 * (width + gap) + width / 2, 19.8),
        arrowprops=dict(arrowstyle="->", connectionstyle="arc3,rad=-0.05"),
    )
    residual = (
        f"residual: d = {d} = {cfg['tok_dim']} token dims | {cfg['pos_dim']} position dims;  "
        "x ← x + attention(norm x);  x ← x + FFN(norm x);  logits = head(norm x) · e(0…9)ᵀ → argmax"
    )
    ax.text(1, 7.6, style.fill(residual, style.column(1)), fontsize=style.SMALL, color=style.MUTED, va="top")
    ax.text(
        1,
        3.3,
        f"answer written by greedy decoding (least significant first):\n{written_digits(example)}"
        f"   →   {example['a']:,} + {example['b']:,} = {example['answer']:,}",
        fontsize=9,
        family="monospace",
        va="top",
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
        # the arc alone sets the axes (the whole circle squeezed the ten digits, and their labels, together)
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
    middle = np.nanmean(xy[:, 0]) if np.isfinite(xy[:, 0]).any() else 0.0
    for (px, py), label, alone in shared_labels(xy):  # (the note below is ``text``: a label had replaced it)
        if alone:  # inside its marker
            ax.text(px, py, label, ha="center", va="center", color="white", weight="bold", zorder=4)
        else:  # digits at one point: beside it, towards the panel's middle, so that the text stays inside it
            right = px <= middle + 1e-12
            ax.annotate(
                label,
                (px, py),
                xytext=(9 if right else -9, 0),
                textcoords="offset points",
                ha="left" if right else "right",
                va="center",
                weight="bold",
                zorder=4,
            )
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("token dim 0")
    ax.set_ylabel("token dim 1")
    ax.set_title(style.fill(title, style.column(2), 10.5))
    # a legend of no entries, for its placement: "best" keeps the note off the digits wherever the arc lies
    ax.legend([], [], title=text, loc="best", frameon=True, alignment="left", title_fontsize=style.SMALL)


def panel_positions(ax, ex: dict) -> None:
    table = np.array(ex["positions"])
    labels = ex["position_labels"]
    if table.shape[1] < 3:
        table = np.pad(table, ((0, 0), (0, 3 - table.shape[1])))
    places = table[:10, :3]
    ax.plot(*places.T, color=COMPONENT_COLORS["positions"], lw=1.5, alpha=0.5)
    # the digit places in the token panel's colours, unlabelled: neighbours in the projection hid each other's labels
    ax.scatter(*places.T, c=plt.get_cmap("viridis")(np.linspace(0, 0.95, 10)), s=70, depthshade=False)
    cfg = ex["config"]
    if cfg["positions"] == "spiral":
        how = "learned" if cfg["learned_points"] else "frozen"
        for name, label, marker, color in (("=", "EQUALS", "D", "#1f6fb2"), ("z9", "CARRY", "*", style.BAD)):
            p = table[labels.index(name), :3]
            # named in the legend: a label beside the point covered a digit place or the axis's ticks
            ax.scatter(*p, marker=marker, s=180, color=color, depthshade=False, label=f"{label} ({how})")
        ax.legend(loc="upper left")
        a, phase, slope, offset = cfg["spiral"]
        formula = f"p(i) = ({a:g} cos(2πi/{cfg['turn']} {phase:+g}), {a:g} sin(…), {slope:g}·i {offset:+g})"
        title = (
            f"Positions: frozen spiral, {cfg['turn']} places per turn; EQUALS, CARRY {how}\n"
            f"{formula}; xᵢ, yᵢ, zᵢ share place i (colours: i = 0…9 as the digits'), PLUS at 0"
        )
    else:
        title = "Positions: learned table (first 3 dims), digit places of x (colours: i = 0…9 as the digits')"
    ax.set_title(style.fill(title, style.column(2), 10), fontsize=10)
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
        ax.set_xticks(range(len(writers)), [f"{w}→z{i}" for i, w in enumerate(writers)], rotation=45)
        ax.set_ylabel("1 / RMS(residual): the norm's gain")
        ax.legend()
        applied = "not applied" if cfg["norm"] == "none" else "applied; no learned weights (0 parameters)"
        title = f"Norm: RMSNorm {applied}; its gain on the example, where answer digits are written"
        ax.set_title(style.fill(title, style.column(2), 10), fontsize=10)
        return
    sites = ["shared (attention, FFN, head)"] if len(weights) == 1 else SITES
    x = np.arange(len(names))
    width = 0.8 / len(weights)
    for i, (site, w) in enumerate(zip(sites, weights, strict=True)):
        bars = ax.bar(x + (i - (len(weights) - 1) / 2) * width, w, width, label=site, color=style.ramp(len(weights))[i])
        ax.bar_label(bars, fmt="%.2f", fontsize=style.SMALL, rotation=90, padding=2)
    ax.axhline(1, color=style.MUTED, lw=0.8, ls="--")
    ax.set_ylim(top=1.3 * float(np.nanmax(style.finite(np.ravel(weights)), initial=1.0)))  # room for upright labels
    ax.set_xticks(x, names)
    ax.set_ylabel("RMSNorm weight (1 = untouched)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    ax.set_title(
        style.fill(f"Norm weights: {cfg['norm']} ({len(weights) * len(names)} parameters)", style.column(2), 10)
    )


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
    ax.set_xticks(range(att.shape[2]), [f"{lab}\n{tok}" for lab, tok in zip(labels, tokens, strict=True)])
    ylabels = [f"h{h}: {labels[r]}→z{r - first}" for h in range(att.shape[0]) for r in rows]
    ax.set_yticks(range(len(ylabels)), ylabels)
    ax.grid(False)
    for i, row in enumerate(block):
        for k in np.argsort(row)[-2:]:
            if row[k] >= 0.1:  # in percent: two digits fit a cell at a legible size, "0.43" did not
                ax.text(k, i, f"{100 * row[k]:.0f}", ha="center", va="center", fontsize=style.SMALL, color="white")
    summary = "; ".join(f"head {h}: {text}" for h, text in enumerate(ex["routing"]))
    title = (
        f"Attention while adding {example['a']:,} + {example['b']:,}: where each answer digit looks "
        f"(weights ≥ 10 % printed, in %)\nslot of zⱼ (writes zⱼ₊₁): {summary}"
    )
    ax.set_title(style.fill(title, style.column(1), 10), loc="left", fontsize=10)


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
                ax.text(k, i, f"{v:.2f}", ha="center", va="center", fontsize=style.SMALL, color=ink)
        ax.set_xticks(range(len(names)), names)
        ax.set_yticks(range(len(labels)), labels)
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
        ax.set_yticks(y, [n for n, _ in rows])
        ax.axvline(0, color=style.INK, lw=0.6)
    ax.set_title(style.fill(title, style.column(2), 10), fontsize=10)
    if digits_ax is None:
        return
    digit_values = np.array(ex["digit_values"])  # (H, r, 10)
    for h in range(digit_values.shape[0]):
        for r in range(digit_values.shape[1]):
            digits_ax.plot(range(10), digit_values[h, r], marker="o", ms=4, label=f"h{h} U{r}·e(d)")
    digits_ax.set_xticks(range(10))
    digits_ax.set_xlabel("digit d")
    digits_ax.set_ylabel("value offered")
    digits_ax.set_title(style.fill("What each digit offers to attention: U·e(d)", style.column(2), 10), fontsize=10)
    digits_ax.legend()


def budget_segments(ex: dict) -> list[tuple[float, float, str, str]]:
    """(left, width, label, colour) of each bar segment of the parameter budget, the bar spanning 0 to 100."""
    total, left, segments = ex["params"], 0.0, []
    for row in (r for r in ex["budget"] if r["params"] > 0):
        width = 100 * row["params"] / total
        segments.append(
            (left, width, f"{row['name']} ({row['params']})", COMPONENT_COLORS.get(row["component"], style.MUTED))
        )
        left += width
    return segments


def label_rows(segments: list[tuple[float, float, str, str]]) -> list[tuple[int, float]]:
    """(row, centre) of each segment's label, horizontal under its segment's centre (moved right where it would
    start left of the bar): the first row where it clears the labels already there, so that a sliver of one
    parameter gets its name like a wide segment."""
    units_per_point = 100 / (72 * style.column(1))  # the bar spans the figure, less its margins
    ends: list[float] = []  # the right end of the last label of each row
    rows = []
    for left, width, text, _ in segments:
        half = 0.5 * len(text) * style.SMALL * 0.66 * units_per_point + 0.6  # DejaVu's glyphs, generously; a margin
        centre = max(left + width / 2, half)
        row = next((k for k, end in enumerate(ends) if centre - half > end), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = centre + half
        rows.append((row, centre))
    return rows


#: inches of the budget panel: the bar, each row of labels, the two lines of text below them
BAR, LABEL_ROW, BELOW = 0.35, 0.19, 0.75


def budget_height(ex: dict) -> float:
    """Inches the budget panel needs, its title aside."""
    rows = 1 + max((row for row, _ in label_rows(budget_segments(ex))), default=0)
    return BAR + 0.1 + LABEL_ROW * rows + BELOW


def panel_budget(ax, ex: dict) -> None:
    """The parameter budget as one bar, a segment per tensor, its labels in rows below it; the y axis in inches."""
    frozen = [r for r in ex["budget"] if r["params"] == 0]
    height = budget_height(ex)
    ax.set_xlim(0, 100)
    ax.set_ylim(0, height)
    ax.axis("off")
    ax.set_title(f"Parameter budget: all {ex['params']} parameters, read from the module", loc="left")
    segments = budget_segments(ex)
    top = height - BAR
    for (left, width, text, color), (row, centre) in zip(segments, label_rows(segments), strict=True):
        ax.add_patch(
            FancyBboxPatch((left, top), width, BAR, boxstyle="square,pad=0", facecolor=color, edgecolor="white")
        )
        y = top - 0.1 - LABEL_ROW * row
        ax.plot([centre, centre], [top, y], color=style.MUTED, lw=0.5)
        ax.text(centre, y, text, ha="center", va="top", fontsize=style.SMALL)
    free = ", ".join(f"{row['name']} {tuple(row['shape'])}" for row in frozen) or "none"
    said = style.fill(f"free (frozen, 0 parameters): {free}", style.column(1))
    ax.text(0, BELOW - 0.05, said, fontsize=style.SMALL, color=style.MUTED, va="top")
    x = 0.0
    for name, n in ex["component_totals"].items():  # the totals in their components' colours, in one line
        text = f"{name}: {n}"
        ax.text(x, 0.02, text, fontsize=style.SMALL, va="bottom", color=COMPONENT_COLORS.get(name, style.INK))
        x += 100 * (len(text) + 3) * style.SMALL * 0.66 / (72 * style.column(1))


# ---------------------------------------------------------------------------------------- figures
def explainer(results: dict[str, Any]) -> Figure:
    ex = results["explain"]
    best = best_record(results)
    # one column, the page's width: the flow, then the panels two by two, the attention and the budget full width
    att = np.array(ex["example"]["attention"])
    attention_height = 1.6 + 0.2 * att.shape[0] * (att.shape[1] - ex["position_labels"].index("="))
    heights = [4.2, 4.2, 4.6, attention_height, budget_height(ex) + 0.4]
    fig = plt.figure(figsize=(style.WIDTH, sum(heights) + 1.0), layout="constrained")
    grid = fig.add_gridspec(5, 2, height_ratios=heights)
    panel_flow(fig.add_subplot(grid[0, :]), ex, ex["config"], ex["component_totals"])
    panel_tokens(fig.add_subplot(grid[1, 0]), ex)
    panel_positions(fig.add_subplot(grid[1, 1], projection="3d"), ex)
    panel_norm(fig.add_subplot(grid[2, 0]), ex)
    if ex["digit_values"] is None:  # values read more than the token dims: no per-digit offer to draw
        panel_values(fig.add_subplot(grid[2, 1]), None, ex)
    else:
        value_grid = grid[2, 1].subgridspec(2, 1, height_ratios=[2.2, 1])
        panel_values(fig.add_subplot(value_grid[0]), fig.add_subplot(value_grid[1]), ex)
    panel_attention(fig.add_subplot(grid[3, :]), ex)
    panel_budget(fig.add_subplot(grid[4, :]), ex)
    success = results["success"][best["label"]]
    measured = (
        f"measured on the 10,010-case suite by greedy decoding: {accuracy_line(best, results['cases'])}  ·  "
        f"{best['label']}, seed {best['seed']}, {best['best_step']:,} steps  ·  {success['perfect']}/"
        f"{success['tried']} seeds at 100%  ·  1 layer, d_model {ex['config']['tok_dim'] + ex['config']['pos_dim']}"
    )
    title = f"A {ex['params']}-parameter transformer that adds two 10-digit numbers"
    fig.suptitle(f"{title}\n{style.fill(measured, style.WIDTH, 12)}", fontsize=12, fontweight="bold")
    return fig


def training(results: dict[str, Any]) -> Figure:
    fig, (loss_ax, acc_ax, wrong_ax) = plt.subplots(3, 1, figsize=(style.WIDTH, 10.5), layout="constrained")
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
    title = f"adder, {results['params']} parameters: {reached} reached {cases:,}/{cases:,}"
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    return fig


FIGURES = {"adder_explainer.png": explainer, "adder_training.png": training}
