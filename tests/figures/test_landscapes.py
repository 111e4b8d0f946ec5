"""Landscapes figures: table cells, verdict sentences built from the measurements, robustness to divergence.

The figures of a normal run are opened and checked, and redrawn byte for byte, by the CLI test in
tests/experiments/test_landscapes.py.
"""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from figure_checks import assert_drawn_png, overlaps
from optiscope.experiments import landscapes as ls
from optiscope.experiments.bias_correction import bias_correction_story
from optiscope.experiments.weight_decay import seed_claims
from optiscope.figures import bias_correction, style, weight_decay
from optiscope.figures import landscapes as fig


def run(best_lr=0.1, reached_at=None, final_gap=0.5):
    return {"best_lr": best_lr, "reached_at": reached_at, "final_gap": final_gap}


def test_table_cells_say_how_each_run_ended():
    assert fig.outcome(run(reached_at=97, best_lr=0.01), 3000) == "97 steps (η = 0.01)"
    assert fig.outcome(run(best_lr=0.003, final_gap=0.00037), 3000) == (
        "not reached in 3000 steps\n(closest: f − f* = 0.00037 at η = 0.003)"
    )
    assert fig.outcome(run(best_lr=None), 3000) == "diverged at every η"


def story_with(skew_w, skew_l2, kurt_w, kurt_l2, max_w, max_l2, n=300):
    def stats(skew, kurt, max_abs):
        return {"skewness": skew, "excess_kurtosis": kurt, "max_abs": max_abs}

    adamw, adaml2 = stats(skew_w, kurt_w, max_w), stats(skew_l2, kurt_l2, max_l2)
    return {
        "runs": {
            "adamw": {"stats": adamw, "rms_distance_to_l2_optimum": 0.2},
            "adaml2": {"stats": adaml2, "rms_distance_to_l2_optimum": 0.01},
        },
        "seed_claims": seed_claims(adamw, adaml2, n),
        "skewness_standard_error": (6 / n) ** 0.5,
    }


def test_claim_lines_follow_the_measurement():
    contradicted = " ".join(weight_decay.claim_lines(story_with(-0.1, -0.14, 1.0, 1.2, 2.7, 2.6)))
    assert "AdamW symmetric, and Adam+L2 not skewed either" in contradicted
    assert "no clear difference in the tails" in contradicted
    assert "max |w| 2.7 vs 2.6 (AdamW's is larger)" in contradicted
    confirmed = " ".join(weight_decay.claim_lines(story_with(0.0, 0.9, 0.2, 3.0, 2.0, 4.0)))
    assert "Adam+L2 skewed, as the seed says" in confirmed
    assert "Adam+L2's tails are heavier" in confirmed and "(Adam+L2's is larger)" in confirmed


def test_equal_largest_weights_are_said_to_be_equal():
    """A tie in max |w| made the line say "AdamW's is larger" (the claim Adam+L2's is larger being false)."""
    tied = " ".join(weight_decay.claim_lines(story_with(0.0, 0.9, 0.2, 3.0, 2.5, 2.5)))
    assert "max |w| 2.5 vs 2.5 (equal)" in tied


def test_a_diverged_run_tests_no_claim():
    story = story_with(float("nan"), 0.9, float("nan"), 3.0, float("nan"), 4.0)
    assert story["seed_claims"] is None
    lines = " ".join(weight_decay.claim_lines(story))
    assert "Not measured: AdamW (decoupled decay) diverged" in lines and "skewed" not in lines.split("Not")[1]


def test_bias_title_reads_the_runs():
    story = {
        "lr": 0.05,
        "start": 3.0,
        "runs": {
            "adam": {"first_step": 0.05, "largest_step": 0.05, "largest_step_at": 1, "overshoot": 0.006},
            "adam-no-bc": {"first_step": 0.158, "largest_step": 0.29, "largest_step_at": 7, "overshoot": 0.9},
        },
    }
    title = bias_correction.bias_title(story)
    assert "without it the first step is 3.2η (with it 1.00η)" in title
    assert "the largest 5.8η at step 7" in title
    assert "overshoots the minimum by 0.9 (30% of |x₀|) against 0.006 (0.2%)" in title


def test_bias_title_of_a_run_that_diverged_compares_nothing():
    finite = {"first_step": 1e300, "largest_step": 1e300, "largest_step_at": 1, "overshoot": 1e300}
    story = {
        "lr": 1e300,
        "start": 3.0,
        "runs": {"adam": {**finite, "diverged_at": None}, "adam-no-bc": {**finite, "diverged_at": 2}},
    }
    title = bias_correction.bias_title(story)
    assert "Adam without bias correction diverged at step 2 (x not finite)" in title
    assert "overshoots" not in title and "largest" not in title


def test_bias_title_says_when_x_never_crosses_the_minimum():
    """At η = 0.001 neither run reaches x = 0 from x₀ = 3 in 50 steps (each step is at most 6.6η): 'overshoots
    the minimum by 0' would claim a crossing that did not happen."""
    story = bias_correction_story(lr=1e-3, start=3.0, steps=50)
    assert all(min(run["x"]) > 2.5 for run in story["runs"].values())
    title = bias_correction.bias_title(story)
    assert title.endswith("x never crosses the minimum, with or without correction") and "overshoots" not in title
    one_sided = bias_correction.overshoot_clause(0.9, 0.0, 3.0)
    assert one_sided == "x overshoots the minimum by 0.9 (30% of |x₀|); with correction it never crosses it"


@pytest.fixture(scope="module")
def diverging_results():
    """η = 2 everywhere: SGD diverges on the ravine and on Rosenbrock."""
    config = ls.Config(steps=60, lrs=(2.0,), optimizers="sgd,adam", bias_steps=20, decay_steps=20, weights_per_group=5)
    return {"experiment": "landscapes", **ls.run(config, None)}


def test_landscape_figures_survive_runs_that_diverged_at_every_rate(diverging_results, tmp_path):
    assert diverging_results["surfaces"]["rosenbrock"]["runs"]["sgd"]["best_lr"] is None
    for draw, name in ((fig.landscapes, "landscapes.png"), (fig.convergence_table, "table.png")):
        assert_drawn_png(style.save(draw(diverging_results), tmp_path / name))


def test_the_png_check_rejects_a_blank_figure(tmp_path):
    blank = plt.figure(figsize=(8, 6))
    path = style.save(blank, tmp_path / "blank.png")
    with pytest.raises(AssertionError, match="looks blank"):
        assert_drawn_png(path)


def test_the_overshoot_arrow_points_at_the_farthest_finite_x_of_a_run_that_diverged_later():
    """np.argmax finds a NaN first: the arrow was placed at a NaN and silently not drawn. The oracle:
    NumPy's nanargmax of the distance past the minimum."""
    story = bias_correction_story(lr=0.05, start=3.0, steps=40)
    raw = story["runs"]["adam-no-bc"]
    x = raw["x"]
    x[-5:] = [float("nan")] * 5  # as a run whose x stopped being finite late
    fig = bias_correction.bias_correction(story)
    (arrow,) = [a for a in fig.axes[0].texts if a.get_text() == f"overshoot {raw['overshoot']:.3g}"]
    far = int(np.nanargmax(-np.asarray(x)))
    assert arrow.xy == (far, x[far]) and np.isfinite(arrow.xy[1])
    plt.close(fig)


def test_a_class_path_optimizer_fits_the_table(tmp_path):
    """A user's optimizer by dotted path, described as the class with its options: the table's optimizer column
    holds the description inside its cells, nothing runs over another text or off the canvas."""
    pytest.importorskip("pytorch_optimizer")
    spec = "pytorch_optimizer.ScheduleFreeAdamW@0.1"
    config = ls.Config(
        steps=30, lrs=(0.1,), optimizers=f"adam,{spec}", bias_steps=10, decay_steps=10, weights_per_group=5
    )
    results = {"experiment": "landscapes", **ls.run(config, None)}
    setting = results["surfaces"]["ravine"]["runs"][spec]["setting"]
    assert "ScheduleFreeAdamW" in setting and len(setting) > 60, setting
    drawn = fig.convergence_table(results)
    style.finish(drawn)
    found = overlaps(drawn)
    style.close_all()
    assert not found, found
