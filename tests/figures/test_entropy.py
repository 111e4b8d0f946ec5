"""entropy figures from a real probe of a tiny GPT: drawn, not blank, redrawn byte for byte."""

from figure_checks import assert_figures_drawn_and_replotted


def test_entropy_figures(tiny_runs):
    names = [
        "entropy_delta_vs_eta.png",
        "entropy_delta_vs_eta_aggregate.png",
        "entropy_loglog.png",
        "entropy_subsets.png",
        "entropy_vs_loss.png",
    ]
    assert_figures_drawn_and_replotted(tiny_runs["entropy"], names)
