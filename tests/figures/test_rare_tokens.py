"""Rare-tokens figures: sentences built from the numbers, colours by frequency, and robustness to divergence.

The figures of a normal run are opened and checked, and redrawn byte for byte, by the CLI test in
tests/experiments/test_rare_tokens.py.
"""

import numpy as np

from figure_checks import assert_drawn_png
from optiscope import figures
from optiscope.experiments import rare_tokens as rt
from optiscope.figures import rare_tokens as fig
from optiscope.figures import style


def results_with(sgd_final, adam_final, **extra):
    """A minimal results dict: two tokens, the second one rare."""

    def run(final, optimizer):
        return {
            "optimizer": optimizer,
            "lr": 0.01,
            "diverged_at": None,
            "final_weight": final,
            "final_error": [abs(w - 1) for w in final],
            "tail_rms_error": [abs(w - 1) for w in final],
        }

    return {
        "lr": 0.01,
        "steps": 1000,
        "batch_size": 32,
        "true_weight": 1.0,
        "learned_within": 0.1,
        "tokens": ["token 1", "token 2"],
        "frequencies": [0.999, 0.001],
        "rarest": 1,
        "most_common": 0,
        "optimizers": {"sgd": run(sgd_final, "sgd"), "adam": run(adam_final, "adam")},
        "pair": {"sgd": "sgd", "adam": "adam"},
        **extra,
    }


def test_colours_go_from_blue_for_common_to_red_for_rare_in_any_order():
    frequencies = [0.01, 0.6, 0.09, 0.3]
    colours = fig.token_colors(frequencies)
    ramp = style.ramp(4)
    assert colours[1] == ramp[0] and colours[0] == ramp[-1]
    assert colours[3] == ramp[1] and colours[2] == ramp[2]
    assert ramp[0][2] > ramp[0][0] and ramp[-1][0] > ramp[-1][2]  # blue first, red last


def test_titles_say_what_the_run_measured():
    moved = results_with([1.0, 0.95], [1.0, 1.02])
    title = fig.trajectory_title(moved, "sgd", "SGD")
    assert "the rarest token reached 95.0% of its target" in title
    assert "2 of 2 tokens end within 0.1 of w*" in title
    stuck = results_with([1.0, 0.016], [1.0, 1.044])
    assert "reached 1.6% of its target; 1 of 2 tokens" in fig.trajectory_title(stuck, "sgd", "SGD")
    assert fig.comparison(stuck) == "Adam's final rarest-token error is smaller than SGD's (0.044 vs 0.984)"
    assert "not smaller than SGD's (0.100 vs 0.050)" in fig.comparison(results_with([1.0, 0.95], [1.0, 0.9]))


def test_titles_of_diverged_runs():
    results = results_with([1.0, 0.5], [1.0, 0.9])
    results["optimizers"]["sgd"].update(diverged_at=12, final_weight=None, final_error=None)
    assert fig.trajectory_title(results, "sgd", "SGD") == "SGD: diverged at step 12"
    assert fig.comparison(results) == "SGD diverged"


def test_sweep_title_reports_the_rescue_or_its_absence():
    findings = {
        "rescue_lr": 2.0,
        "rescue_common_tail_std": 0.1,
        "nominal_common_tail_std": 0.002,
        "rescue_jitter_ratio": 50.0,
        "smallest_diverging_sgd_lr": 3.0,
    }
    results = results_with([1, 0], [1, 1], lr_sweep={"findings": findings})
    title = fig.sweep_title(results)
    assert "SGD learns the rarest token from η = 2" in title and "jitters 50× as much as at η = 0.01" in title
    assert title.endswith("SGD diverges from η = 3")
    findings.update(rescue_lr=None, smallest_diverging_sgd_lr=None)
    title = fig.sweep_title(results)
    assert title.startswith("No swept learning rate lets SGD learn the rarest token")
    assert title.endswith("no swept η diverged")


def test_figures_survive_a_diverged_sgd(tmp_path):
    """At η = 80 SGD diverges at the nominal rate and across the sweep; every figure still draws."""
    config = rt.Config(steps=120, lr=80.0, optimizers="sgd,adam,lion", sweep_lrs=(0.01, 80.0))
    results = {"experiment": "rare-tokens", **rt.run(config, None)}
    assert results["optimizers"]["sgd"]["diverged_at"] is not None
    assert results["lr_sweep"]["findings"]["smallest_diverging_sgd_lr"] == 80.0
    drawn = figures.draw(results, tmp_path)
    assert not drawn.failures
    assert [p.name for p in drawn.paths] == ["sgd_vs_adam.png", "optimizers.png", "lr_sweep.png"]
    for path in drawn.paths:
        assert_drawn_png(path)
    assert np.isfinite(results["optimizers"]["adam"]["effective_lr"]).all()


def test_sweep_title_of_a_rescue_when_sgd_diverged_at_the_nominal_lr():
    findings = {
        "rescue_lr": 2.0,
        "rescue_common_tail_std": 0.1,
        "nominal_common_tail_std": None,
        "rescue_jitter_ratio": None,
        "smallest_diverging_sgd_lr": None,
    }
    title = fig.sweep_title(results_with([1, 0], [1, 1], lr_sweep={"findings": findings}))
    assert title.startswith("SGD learns the rarest token from η = 2, where the most common token jitters")
    assert "with std 0.100" in title
    assert "(at the nominal η = 0.01 SGD diverged)" in title
