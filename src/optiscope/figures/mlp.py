"""Figures of the ``mlp`` experiment, drawn from its results.json alone.

* ``mlp_curves.png`` — validation loss (top) and accuracy (below) against step, one colour per run, with the
  training loss faint beside the validation loss; a diverged run ends in a cross at the step it diverged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from . import style
from .lm import status_note

if TYPE_CHECKING:
    from ..experiments.mlp import Results


def curves(results: Results) -> Figure:
    fig, (loss_ax, accuracy_ax) = plt.subplots(2, 1, figsize=(style.WIDTH, 8.2))
    colors = style.run_colors(results["runs"])
    starts = []
    for label, run in results["runs"].items():
        color, ev, train = colors[label], run["eval"], run["train"]
        val_loss, train_loss = style.finite(ev["val_loss"]), style.finite(train["loss"])
        starts += [v for v in val_loss[:1] if np.isfinite(v)]
        loss_ax.plot(style.finite(train["step"]), train_loss, color=color, lw=0.8, alpha=0.35)
        steps = style.finite(ev["step"])
        shown = f"{label}{status_note(run)}"
        loss_ax.plot(steps, val_loss, color=color, lw=2, marker="o", ms=3, label=shown)
        accuracy_ax.plot(steps, style.finite(ev["accuracy"]), color=color, lw=2, marker="o", ms=3, label=shown)
        step = (run["divergence"] or {}).get("step") if run["status"] == "diverged" else None
        finite = [v for v in val_loss[::-1] if np.isfinite(v)]
        if step is not None and finite:
            loss_ax.plot([step], [finite[0]], marker="x", ms=11, mew=2.5, color=color)
    if starts and max(starts) > 0:
        loss_ax.set_ylim(top=max(starts) * 1.08)  # a run that blew up does not flatten the others
    loss_ax.set(xlabel="optimizer step", ylabel="cross-entropy (nats)", title="Validation (solid) and training (faint)")
    accuracy_ax.set(xlabel="optimizer step", ylabel="validation accuracy", title="Validation accuracy")
    style.fraction_axis(accuracy_ax)
    loss_ax.legend(loc="upper right")
    task = results["task"]
    title = (
        f"MLP of {task['parameters']:,} parameters on a teacher's {task['classes']} classes "
        f"({task['examples']:,} training examples, {task['label_noise']:.0%} of labels random)"
    )
    fig.suptitle(style.fill(title, style.WIDTH, 11), fontsize=11)
    fig.tight_layout()
    return fig


FIGURES = {"mlp_curves.png": curves}
