"""suggest_lr leaves the caller's model and random state exactly as they were, falls back where an optimizer has no
threshold and says so, replays a one-shot iterator, stays within its steps, and refuses each bad input in one line."""

import math
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optiscope import suggest_lr
from optiscope.errors import ConfigError, SuggestionError
from optiscope.optim import Lion
from optiscope.suggest.methods import METHODS

from .fake_trainee import quadratic

A = torch.tensor([10.0, 1.0])  # H = diag(10, 1): λ_max = 10, λ_min = 1


def weights(*values: float) -> nn.Linear:
    model = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))
    return model


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.last = nn.Linear(8, 1)

    def forward(self, x):
        return self.last(self.drop(torch.relu(self.norm(self.first(x)))))


def test_the_model_and_the_global_random_state_come_back_bit_for_bit():
    torch.manual_seed(0)
    model = Net()
    model.first.bias.requires_grad_(False)
    model.drop.eval()  # a submodule in another mode than its parent
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)  # shuffling draws from torch's generator
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [(p.requires_grad, p.grad) for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())

    s = suggest_lr(model, "adamw", lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), loader, steps=40)

    assert s.lr > 0 and s.steps_used <= 40
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert [(p.requires_grad, p.grad) for p in model.parameters()] == flags
    assert [m.training for m in model.modules()] == modes
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]
    assert all(np.array_equal(u, v) for u, v in zip(np.random.get_state(), rng[2], strict=True))


def test_an_optimizer_without_a_threshold_gets_a_fallback_that_says_so():
    s = suggest_lr(weights(1.0, 1.0), lambda params, lr: Lion(params, lr=lr), quadratic, [A], steps=20)
    assert s.method == "fallback: range test" and s.threshold == ""
    assert any("no known stability threshold for Lion" in note for note in s.notes)
    assert "fallback" in s.explain()


def test_a_one_shot_iterator_is_replayed_when_it_runs_out():
    s = suggest_lr(weights(1.0, 1.0), "sgd", quadratic, iter([A, A]), steps=20, method="sharpness")
    assert s.edge == pytest.approx(0.2, rel=1e-3)


@pytest.mark.parametrize(
    ("call", "error", "said"),
    [
        (lambda: suggest_lr(weights(1.0), "sgd", quadratic, [], steps=20), SuggestionError, "batches gave no batch"),
        (
            lambda: suggest_lr(weights(1.0), "suggest.no_lr.Sign", quadratic, [A[:1]], steps=20),
            ConfigError,
            "takes no lr",
        ),
        (
            lambda: suggest_lr(weights(1.0), lambda p, lr: _without_lr(p), quadratic, [A[:1]], steps=20),
            SuggestionError,
            "hold lr=[None]",
        ),
        (
            lambda: suggest_lr(weights(1.0), "sgd", lambda m, b: quadratic(m, b) * math.nan, [A[:1]], steps=20),
            SuggestionError,
            "the loss is nan at the first probe step",
        ),
        (
            lambda: suggest_lr(weights(1.0), "adam", quadratic, [A[:1]], steps=3),
            SuggestionError,
            "the least that works",
        ),
        (lambda: suggest_lr(weights(1.0), "sgd", quadratic, [A[:1]], steps=0), ValueError, "steps=0"),
        (lambda: suggest_lr(weights(1.0), "sgd", quadratic, [A[:1]], method="best"), ValueError, "valid: limits"),
        (lambda: suggest_lr("model", "sgd", quadratic, [A[:1]]), TypeError, "not a torch.nn.Module"),
        (lambda: suggest_lr(weights(1.0), "sgd", quadratic, 5), TypeError, "iterable of batches"),
    ],
    ids=[
        "empty-batches",
        "class-without-lr",
        "groups-without-lr",
        "nan-loss",
        "too-few-steps",
        "steps-0",
        "method",
        "model",
        "batches",
    ],
)
def test_each_bad_input_is_refused_in_one_line(call, error, said):
    with pytest.raises(error) as caught:
        call()
    assert said in str(caught.value) and "\n" not in str(caught.value)


def _without_lr(params):
    optimizer = torch.optim.SGD(params, lr=0.1)
    optimizer.param_groups[0]["lr"] = None  # an lr the optimizer works out itself (🤗 Adafactor's lr=None)
    return optimizer


def test_too_few_steps_says_the_least_that_works_and_that_least_works():
    with pytest.raises(SuggestionError) as caught:
        suggest_lr(weights(1.0, 1.0), "adam", quadratic, [A], steps=3)
    least = int(str(caught.value).rsplit(" ", 1)[-1])
    assert suggest_lr(weights(1.0, 1.0), "adam", quadratic, [A], steps=least).steps_used <= least


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_stays_within_its_steps(method):
    s = suggest_lr(weights(1.0, 1.0), "momentum", quadratic, [A], steps=30, method=method)
    assert 0 < s.steps_used <= 30 and s.lr > 0 and s.method == method


def test_limits_explains_both_limits_and_lists_only_the_sharpness_as_lambda():
    """Heavy ball on the quadratic: the edge is 3.8/λ_max = 0.38; the noise limit (one batch: no noise, the greedy
    step along g over the momentum's gain 10) is far below it, so it binds. explain() lists λ₁ from the sharpness
    measurements only, never the noise limit's directional curvature, and says which limit the suggestion took."""
    s = suggest_lr(weights(1.0, 1.0), "momentum", quadratic, [A], steps=20, method="limits")
    lambdas = [p["sharpness"] for p in s.probes if p["kind"] == "sharpness"]
    assert lambdas and all(value == pytest.approx(10, rel=1e-3) for value in lambdas)
    lines = s.explain().splitlines()
    assert lines[1].startswith("  limits: λ₁ = 10, ") and f"({len(lambdas)} measurement(s))" in lines[1]
    assert s.edge < 0.38 / 4 and f"× the lower limit, η = {s.edge:.3g}" in lines[2]
    assert lines[-1].startswith("  limits: the edge of stability η = 0.38, the noise-limited step ")
    assert lines[-1].endswith("the noise binds")
