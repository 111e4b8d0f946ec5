"""lm figures from a results dict alone: every figure is drawn, deterministic and not blank."""

import math

from figure_checks import assert_figures_drawn_and_replotted
from optiscope import cli, runs


def fake_run(optimizer, diverged=False, steps=40):
    log = list(range(10, steps + 1, 10))
    loss = [4.0 - 0.02 * s for s in log]
    return {
        "optimizer": optimizer,
        "lr": 1e-3,
        "status": f"diverged at step {steps}" if diverged else "ok",
        "divergence": {"step": steps, "loss": math.inf, "reason": "loss is inf", "exploded_first": []}
        if diverged
        else None,
        "step": steps,
        "train_seconds": steps * 0.05,
        "train": {
            "step": log,
            "loss": loss[:-1] + [math.inf if diverged else loss[-1]],
            "seconds": [s * 0.05 for s in log],
        },
        "eval": {
            "step": [20, 40],
            "train_loss": [3.5, 3.2],
            "val_loss": [3.6, 3.3],
            "perplexity": [36.6, 27.1],
            "seconds": [1.0, 2.0],
        },
        "samples": [{"step": 40, "samples": [{"prompt": "ROMEO:", "output": " the king\nis dead"}]}],
        "update_ratio": {
            "step": log,
            "layers": {"blocks.0": [1e-2, 5e-3, 4e-3, 3e-3], "token_embedding": [2e-2, 1e-2, 8e-3, 6e-3]},
        },
        "embedding_rows": {"update": [0.1, 0.05, 0.02, 0.0], "count": [100, 30, 5, 0], "measured_steps": 4},
        "final": {
            "steps": steps,
            "val_loss": 3.3,
            "perplexity": 27.1,
            "tokens_per_s": 9000.0,
            "steps_per_s": 11.7,
            "processes": 1,
        },
    }


RESULTS = {
    "experiment": "lm",
    "corpus": {"tokenizer": "char", "train_tokens": 1000, "vocab_size": 4},
    "model": {"parameters": 12345},
    "runs": {"sgd": fake_run("sgd"), "adam@0.05": fake_run("adam", diverged=True), "muon": fake_run("muon")},
}


def test_lm_figures(tmp_path):
    runs.atomic_write_json(tmp_path / "results.json", RESULTS)
    assert cli.main(["plot", str(tmp_path)]) == 0
    names = ["lm_loss.png", "lm_update_ratio.png", "lm_embedding_rows.png", "lm_summary.png"]
    assert_figures_drawn_and_replotted(tmp_path, names)
