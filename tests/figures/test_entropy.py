"""entropy figures from a real probe result of a tiny model: drawn, deterministic, not blank."""

import torch

from figure_checks import assert_figures_drawn_and_replotted
from optiscope import cli, runs
from optiscope.experiments.entropy import eta_grid, loglog_fit
from optiscope.probe import probe_step, subset_errors, update_direction
from tiny_lm import lm_loss, setup


def probe_results():
    out = {"experiment": "entropy", "mode": "fixed", "model": "tiny", "parameters": 1, "optimizers": {}}
    for name in ("sgd", "adamw"):
        model, opt, data, batch = setup(optimizer=name)
        lr = opt.param_groups[0]["lr"]
        etas = eta_grid(lr, 3, 5)
        runs = []
        for r in range(2):
            v = update_direction(model, opt, lm_loss, batch[r:] if r else batch)
            result = probe_step(model, v, data, etas)
            loss = probe_step(model, v, data, etas, functional="loss")
            result["subsets"] = subset_errors(result, etas[1], 4, 30, r)
            result["loss_probe"] = {
                "delta_per_lr": loss["approx"]["delta_h_per_lr"],
                "vHvv": 0.0,
                "base": 0.0,
                "true": [{"eta": e["eta"], "delta": e["delta_h_true"]} for e in loss["true"]["entries"]],
            }
            runs.append(result)
        out["optimizers"][name] = {"lr": lr, "etas": etas, "runs": runs, "fits": [loglog_fit(r) for r in runs]}
    return out


def test_entropy_figures(tmp_path):
    results = probe_results()
    assert torch.isfinite(torch.tensor(results["optimizers"]["sgd"]["fits"][0]["slope"]))
    runs.atomic_write_json(tmp_path / "results.json", results)
    assert cli.main(["plot", str(tmp_path)]) == 0
    names = [
        "entropy_delta_vs_eta.png",
        "entropy_delta_vs_eta_aggregate.png",
        "entropy_loglog.png",
        "entropy_subsets.png",
        "entropy_vs_loss.png",
    ]
    assert_figures_drawn_and_replotted(tmp_path, names)
