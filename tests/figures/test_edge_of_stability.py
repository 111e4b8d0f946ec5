"""The edge-of-stability figures account for every run: their titles name the panel's optimizers, the runs that
never reached their edge and those that diverged; a diverged run's edge is drawn only where it came before the
divergence. Oracle: the hand-written results below (what each run did is set, not measured)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from optiscope.figures import edge_of_stability as eos


def run(label, optimizer, lr, *, edge_step=None, equilibrium=None, max_ratio=0.5, diverged_at=None, pre=False):
    steps = [10, 20, 30, 40]
    threshold = (38.0 if pre else 2.0) / lr
    return {
        "label": label,
        "optimizer": optimizer,
        "lr": lr,
        "threshold": threshold,
        "threshold_label": "38/η" if pre else "2/η",
        "preconditioned": pre,
        "status": "diverged" if diverged_at is not None else "ok",
        "divergence": {"step": diverged_at, "reason": "loss is nan"} if diverged_at is not None else None,
        "step": steps,
        "sharpness": [threshold * max_ratio * s / 40 for s in steps],
        "ratio": [max_ratio * s / 40 for s in steps],
        "loss": [1.0 / s for s in steps],
        "hvps": [3] * 4,
        "edge_step": edge_step,
        "equilibrium": equilibrium,
        "max_ratio": max_ratio,
    }


@pytest.fixture
def results():
    return {
        "experiment": "edge-of-stability",
        "status": "ok",
        "task": {},
        "steps": 40,
        "measure_every": 10,
        "edge": 0.9,
        "runs": [
            run("sgd@0.5", "sgd", 0.5, edge_step=20, equilibrium=1.04, max_ratio=1.2),
            run("sgd@0.05", "sgd", 0.05, max_ratio=0.14),
            run("nesterov@0.1", "nesterov", 0.1, edge_step=10, max_ratio=1e6, diverged_at=35),
            run("momentum@0.45", "momentum", 0.45, edge_step=40, max_ratio=1e9, diverged_at=40),
        ],
    }


def vertical_lines(ax):
    """x of each vertical line (axvline: two points at one x, spanning the axes)."""
    return [
        (line.get_xdata()[0], line.get_linestyle())
        for line in ax.lines
        if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]
    ]


def test_the_title_accounts_for_every_run_and_names_the_optimizers(results):
    fig = eos.sharpness(results)
    title = " ".join(fig._suptitle.get_text().split())
    plt.close(fig)
    assert "never reached 0.9× its threshold: sgd@0.05 (at most 0.14×)" in title, title
    assert "sgd@0.5 1.04×" in title
    assert title.startswith("sgd, nesterov, momentum: sharpness λ₁(H)"), title
    assert "nesterov@0.1 (diverged at step 35), which had reached 0.9× at step 10" in title, title
    assert "momentum@0.45 (diverged at step 40)" in title and "40), which" not in title, title


@pytest.mark.parametrize(("equilibrium", "said"), [(0.996, "0.996×"), (1.0004, "1.0004×"), (1.0, "1.00×")])
def test_a_ratio_is_never_rounded_onto_the_threshold_it_is_not_at(results, equilibrium, said):
    """Two decimals, but 0.996 (short of the threshold) and 1.0004 (past it) do not read "1.00×"."""
    results["runs"][0]["equilibrium"] = equilibrium
    fig = eos.sharpness(results)
    title = " ".join(fig._suptitle.get_text().split())
    plt.close(fig)
    assert f"sgd@0.5 {said}" in title, title


def test_a_diverged_run_has_its_edge_drawn_only_before_its_divergence(results):
    fig = eos.sharpness(results)
    top = fig.axes[0]
    drawn = vertical_lines(top)
    plt.close(fig)
    edges = sorted(x for x, style in drawn if style == "-")
    divergences = sorted(x for x, style in drawn if style == ":")
    assert edges == [10, 20]  # sgd@0.5's and nesterov's (before step 35); momentum's "edge" is its blow-up
    assert divergences == [35, 40]


def test_a_panel_of_adam_names_adam(results):
    results["runs"].append(run("adamw@0.01", "adamw", 0.01, edge_step=30, equilibrium=0.98, max_ratio=1.0, pre=True))
    fig = eos.preconditioned(results)
    title = fig._suptitle.get_text()
    plt.close(fig)
    assert title.startswith("adamw: preconditioned sharpness λ₁(P⁻¹H) against each run's threshold"), title


def test_the_labels_of_close_thresholds_do_not_overlap(results):
    """Thresholds 1 % apart (2/η at η = 0.1, 0.101, 0.102) put their labels on one another; each is now clear of
    the next. The oracle: the labels' extents as matplotlib renders them, the dashed lines still at the
    thresholds."""
    results["runs"] = [run(f"sgd@{lr}", "sgd", lr, max_ratio=1.0) for lr in (0.1, 0.101, 0.102, 0.5)]
    fig = eos.sharpness(results)
    fig.canvas.draw()
    top = fig.axes[0]
    labels = sorted((t for t in top.texts if t.get_text().startswith("2/η = ")), key=lambda t: t.get_window_extent().y0)
    assert len(labels) == 4
    for lower, upper in zip(labels, labels[1:], strict=False):
        assert lower.get_window_extent().y1 <= upper.get_window_extent().y0, (lower.get_text(), upper.get_text())
    dashed = sorted(line.get_ydata()[0] for line in top.lines if line.get_linestyle() == "--")
    assert dashed == pytest.approx(sorted(2.0 / lr for lr in (0.1, 0.101, 0.102, 0.5)))
    plt.close(fig)
