"""The adder figures: drawn from a real (tiny) run's results.json, non-blank, deterministic."""

import matplotlib.image as mpimg
import pytest
import torch

from optiscope import runs
from optiscope.experiments import adder as E
from optiscope.figures import adder as F
from optiscope.models.adder import AdderConfig

VARIANTS = {
    "spiral-arc": None,  # the presets as they are
    "table-learned": AdderConfig(
        tok_dim=3, pos_dim=2, token_embedding="table", positions="learned", n_heads=2, attn_rank=2, norm="separate"
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def results(request, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    patch = pytest.MonkeyPatch()
    if VARIANTS[request.param] is not None:
        patch.setattr(E, "PRESETS", {"variant": VARIANTS[request.param]})
    try:
        out = tmp_path_factory.mktemp(request.param)
        cfg = E.Config(params_budget=10_000, steps=12, eval_every=6, log_every=3, warmup_steps=2)
        return {"experiment": "adder", **E.run(cfg, out)}
    finally:
        patch.undo()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def drawn(results, tmp_path_factory):
    return F.draw(results, tmp_path_factory.mktemp("figures"))


def test_figures_are_drawn_and_not_blank(drawn):
    assert [p.name for p in drawn] == ["adder_explainer.png", "adder_training.png"]
    for path in drawn:
        pixels = mpimg.imread(path)
        assert pixels.shape[0] > 400 and pixels.shape[1] > 800
        assert pixels[..., :3].std() > 0.05  # drawn on, not a blank canvas


def test_redrawn_from_results_json_byte_for_byte(results, drawn, tmp_path):
    if results["explain"]["config"]["token_embedding"] != "arc":
        pytest.skip("one variant is enough to check determinism")
    reread = runs.read_json(runs.atomic_write_json(tmp_path / "results.json", results))
    assert [p.read_bytes() for p in F.draw(reread, tmp_path)] == [p.read_bytes() for p in drawn]


def test_numbers_come_from_the_results(results):
    totals = F.component_totals(results["explain"]["budget"])
    assert sum(totals.values()) == results["explain"]["params"]
    best = F.best_record(results)
    assert F.accuracy_line(best, 10_010) == f"{best['correct']:,}/10,010 exact ({100 * best['correct'] / 10_010:.2f}%)"
