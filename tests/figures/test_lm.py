"""lm figures from a real tiny run (one of its runs diverged): drawn, not blank, redrawn byte for byte."""

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
