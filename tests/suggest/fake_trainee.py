"""An experiment whose run a suggestion probes, for command-line tests: a quadratic, its batches empty or its loss
NaN on request."""

from dataclasses import dataclass

import torch
from torch import nn

from optiscope.experiments import Trainee
from optiscope.optim.recipes import parse_runs

SUMMARY = "a quadratic to probe (tests)"


@dataclass
class Config:
    optimizers: str = "sgd"
    steps: int = 400
    batches: str = "full"  # or "empty"
    loss: str = "finite"  # or "nan"
    quiet: bool = False


QUICK: dict = {}


def runs_of(config):
    return parse_runs(config.optimizers, 0.1)


def quadratic(model, a):
    """½ Σ aᵢwᵢ²: H = diag(a)."""
    return 0.5 * (a * model.weight[0] ** 2).sum()


def trainee(config, spec):
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    a = torch.tensor([10.0, 1.0])
    batches = [] if config.batches == "empty" else [a]
    loss_fn = (lambda m, b: quadratic(m, b) * float("nan")) if config.loss == "nan" else quadratic
    return Trainee(model, loss_fn, batches, config.steps, 1)


def run(config, run_dir):
    return {}
