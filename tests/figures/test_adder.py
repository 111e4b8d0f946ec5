"""The adder figures: drawn from a real (tiny) run's results.json, non-blank, deterministic."""

import matplotlib.image as mpimg
import pytest
import torch

from figure_checks import assert_figures_drawn_and_replotted
from optiscope import figures, runs
from optiscope.experiments import adder as E
from optiscope.figures import adder as F
from optiscope.models.adder import AdderConfig


def test_figures_of_a_real_run(tiny_runs):
    assert_figures_drawn_and_replotted(tiny_runs["adder"], ["adder_explainer.png", "adder_training.png"])


def test_another_model_family_draws_too(tmp_path):
    """A table token embedding, learned positions and separate norms: every explainer panel's other branch."""
    variant = AdderConfig(
        tok_dim=3, pos_dim=2, token_embedding="table", positions="learned", n_heads=2, attn_rank=2, norm="separate"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    patch = pytest.MonkeyPatch()
    patch.setattr(E, "PRESETS", {"variant": variant})
    try:
        cfg = E.Config(params_budget=10_000, steps=12, eval_every=6, log_every=3, warmup_steps=2, quiet=True)
        results = {"experiment": "adder", **E.run(cfg, tmp_path)}
    finally:
        patch.undo()
        torch.set_num_threads(threads)
    drawn = figures.draw(runs.read_json(runs.atomic_write_json(tmp_path / "results.json", results)), tmp_path)
    assert not drawn.failures and [p.name for p in drawn.paths] == ["adder_explainer.png", "adder_training.png"]
    for path in drawn.paths:
        pixels = mpimg.imread(path)
        assert pixels.shape[0] > 400 and pixels.shape[1] > 800 and pixels[..., :3].std() > 0.05


def test_numbers_come_from_the_results(tiny_results):
    results = tiny_results["adder"]
    best = F.best_record(results)
    assert (best["label"], best["seed"]) == (results["best"]["label"], results["best"]["seed"])
    assert F.accuracy_line(best, 10_010) == f"{best['correct']:,}/10,010 exact ({100 * best['correct'] / 10_010:.2f}%)"


def test_the_written_answer_keeps_its_leading_zeros():
    """The greedy answer is 11 digits whatever its value: 0 is written 0 0 … 0, and 12,345 is 5 4 3 2 1 0 … 0."""
    tokens = [*"0987654321", "+", *"0123456789", "=", *"0000000000"]
    assert F.written_digits({"tokens": tokens, "answer": 0}) == " ".join("0" * 11)
    assert F.written_digits({"tokens": tokens, "answer": 12_345}) == "5 4 3 2 1 0 0 0 0 0 0"
    assert F.written_digits({"tokens": tokens, "answer": 11_111_111_100}) == "0 0 1 1 1 1 1 1 1 1 1"
