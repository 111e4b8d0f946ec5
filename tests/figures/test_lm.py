"""lm figures from a real tiny run (one of its runs diverged): drawn, not blank, redrawn byte for byte."""

import copy

from figure_checks import assert_figures_drawn_and_replotted
from optiscope.figures import lm as fig


def test_lm_figures(tiny_runs):
    names = ["lm_loss.png", "lm_update_ratio.png", "lm_embedding_rows.png", "lm_summary.png"]
    assert_figures_drawn_and_replotted(tiny_runs["lm"], names)


def test_a_diverged_run_says_where(tiny_results):
    run = tiny_results["lm"]["runs"]["sgd@1e30"]
    assert run["status"] == "diverged"
    assert fig.status_note(run) == f" (diverged at step {run['divergence']['step']})"
    assert fig.status_note(tiny_results["lm"]["runs"]["adamw"]) == ""


def test_a_run_of_one_recorded_step_draws_its_update_ratios_as_points(tiny_results):
    """A line of one point draws nothing: each layer's single u/w is marked instead."""
    results = copy.deepcopy(tiny_results["lm"])
    run = results["runs"]["adamw"]
    ratios = run["update_ratio"]
    ratios["layers"] = {layer: values[:1] for layer, values in ratios["layers"].items()}
    ratios["step"] = ratios["step"][:1]
    results["runs"] = {"adamw": run}
    figure = fig.update_ratios(results)
    lines = figure.axes[0].get_lines()
    assert lines and all(line.get_marker() == "o" and len(line.get_xdata()) == 1 for line in lines)
