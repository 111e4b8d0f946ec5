"""The mlp experiment: its labels, its objective, and the run that suggest-lr probes being the run it trains."""

import math
import re

import pytest
import torch

from optiscope import cli, runs
from optiscope.experiments import ConfigError, build_config, mlp

TINY = {"steps": 6, "examples": 64, "val_examples": 32, "width": 16, "eval_every": 3, "log_every": 1}


def test_the_noisy_share_of_labels_is_replaced_by_random_classes():
    """The examples are drawn before the label noise: with the same data seed, the labels at noise 0.5 differ from
    those at 0 on a share 0.5 × 9/10 (a replaced label is the teacher's class once in 10), within 5 standard
    deviations of that binomial count."""
    clean = mlp.make_data(mlp.Config(label_noise=0.0, examples=4000))
    noisy = mlp.make_data(mlp.Config(label_noise=0.5, examples=4000))
    assert torch.equal(clean.x, noisy.x)
    changed = int((clean.y != noisy.y).sum())
    p = 0.5 * 0.9
    assert abs(changed - 4000 * p) <= 5 * math.sqrt(4000 * p * (1 - p))
    assert clean.y.unique().numel() > 1


def test_the_first_step_of_the_run_is_the_trainees(tmp_path):
    """The loss of the run's first step (the monitor's record at step 1, of its first batch at its initial weights)
    is the trainee's loss on its first batch: suggest-lr probes the run this experiment trains."""
    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "run",
                "mlp",
                "--out",
                str(out),
                "--optimizers",
                "adamw",
                "--quiet",
                "--steps",
                "6",
                "--examples",
                "64",
                "--val-examples",
                "32",
                "--width",
                "16",
                "--log-every",
                "1",
            ]
        )
        == 0
    )
    results = runs.read_json(out / "results.json")
    first = results["runs"]["adamw"]["train"]["loss"][0]
    config = build_config(mlp, False, {"optimizers": "adamw", **TINY})
    trainee = mlp.trainee(config, mlp.runs_of(config)[0])
    batch = next(iter(trainee.batches))
    with torch.no_grad():
        assert float(trainee.loss_fn(trainee.model, batch)) == pytest.approx(first, rel=1e-6)
    assert results["runs"]["adamw"]["final"]["val_loss"] == results["runs"]["adamw"]["eval"]["val_loss"][-1]
    assert mlp.OBJECTIVES["val_loss"].value(results | {"runs": {"adamw": results["runs"]["adamw"]}}) > 0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"batch_size": 100, "examples": 64}, "--batch-size=100 exceeds --examples=64"),
        ({"label_noise": 1.0}, "--label-noise=1.0 must be in [0, 1)"),
        ({"classes": 1}, "--classes=1 must be an integer >= 2"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        mlp.Config(**options)
