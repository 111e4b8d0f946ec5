"""Thresholds only for the steps optiscope knows: torch's NAdam and RAdam against their own dynamics on a quadratic
(just above the threshold diverges, just below converges), and a subclass that steps otherwise gets none.

P is frozen as the analysis assumes by an ε far above √v̂: θ starts at 1e-9 on ½ Σ hᵢθᵢ², so √v̂ stays below 1e-5 of
ε = 1 until θ has grown a thousandfold. Warm-up steps on a zero gradient (θ, m and v stay 0) bring NAdam's μ_t and
RAdam's rectification r_t to where the test wants them.
"""

import math

import pytest
import torch
from torch import nn

from optiscope import optim
from optiscope.curvature import sharpness, stability_threshold

X0 = 1e-9


class Bowl(nn.Module):
    """½ Σ hᵢθᵢ² with h = (4, 1, 0.25), from θ = 1e-9."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.full((3,), X0, dtype=torch.float64))
        self.register_buffer("h", torch.tensor([4.0, 1.0, 0.25], dtype=torch.float64))

    def loss(self):
        return 0.5 * (self.h * self.theta**2).sum()


def bowl_loss(model, batch):
    return model.loss()


def warmed(make, warmup):
    """A Bowl and ``make``'s optimizer over it, after ``warmup`` steps on a zero gradient."""
    model = Bowl()
    opt = make(model.parameters())
    for _ in range(warmup):
        model.theta.grad = torch.zeros_like(model.theta)
        opt.step()
    return model, opt


def run_at(make, warmup, factor, steps):
    """torch's optimizer at η such that the instrument reads ratio ``factor``, for ``steps`` steps: (the ratio read,
    the largest |θ| reached, the last |θ|), both in units of θ₀."""
    model, opt = warmed(make, warmup)
    ratio_at_1 = sharpness(model, bowl_loss, None, opt, tol=1e-12)["ratio"]
    for group in opt.param_groups:
        group["lr"] = factor / ratio_at_1  # threshold ∝ 1/η, P independent of η
    ratio = sharpness(model, bowl_loss, None, opt, tol=1e-12)["ratio"]
    largest = 0.0
    for _ in range(steps):
        opt.zero_grad()
        model.loss().backward()
        opt.step()
        largest = max(largest, float(model.theta.detach().abs().max()))
    return ratio, largest / X0, float(model.theta.detach().abs().max()) / X0


CASES = {
    # NAdam at the start of its schedule (one warm-up step: P is read from its state; μ ≈ 0.45 at β₁ = 0.9: 3.49/η),
    # later in it (μ_3001 = 0.62: 4.9/η), and with μ = β₁ from the first step (momentum_decay 100, μ's product
    # forgotten after 300 steps: Nesterov's 13.6/η)
    "nadam-fresh": (lambda ps: torch.optim.NAdam(ps, lr=1.0, eps=1.0), 1, 150),
    "nadam-late": (lambda ps: torch.optim.NAdam(ps, lr=1.0, eps=1.0), 3000, 300),
    "nadam-mu-at-beta1": (lambda ps: torch.optim.NAdam(ps, lr=1.0, eps=1.0, momentum_decay=100.0), 300, 300),
    # RAdam rectified at r = 0.92 (β₂ = 0.999, t = 3000: P = (√v + ε)/√(1 − β₂ᵗ)), rectified at r ≈ 1, and never
    # rectified (β₂ = 0.5: ρ_∞ = 3 ≤ 5, so every step is η m̂: heavy ball with dampening β₁, on H itself)
    "radam-rectified": (lambda ps: torch.optim.RAdam(ps, lr=1.0, eps=1.0), 3000, 300),
    "radam-rectified-r1": (lambda ps: torch.optim.RAdam(ps, lr=1.0, eps=1.0, betas=(0.9, 0.9)), 200, 300),
    "radam-unrectified": (lambda ps: torch.optim.RAdam(ps, lr=1.0, eps=1.0, betas=(0.9, 0.5)), 100, 300),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_known_adaptive_threshold_diverges_just_above_and_converges_just_below(case):
    make, warmup, steps = CASES[case]
    ratio_hi, largest_hi, _ = run_at(make, warmup, 1.1, steps)
    ratio_lo, largest_lo, last_lo = run_at(make, warmup, 0.9, steps)
    assert ratio_hi == pytest.approx(1.1, rel=1e-9) and ratio_lo == pytest.approx(0.9, rel=1e-9)
    assert largest_hi > 1e3, largest_hi
    assert largest_lo < 1e2 and last_lo < 1e-3, (largest_lo, last_lo)


def test_radams_rectified_threshold_bounds_its_own_preconditioner():
    """RAdam's P is (√v + ε)/√(1 − β₂ᵗ), not Adam's √v̂ + ε: with v = 0 the instrument's λ₁(P⁻¹H) is 4√(1 − β₂ᵗ)/ε,
    against (2 + 2β₁)/((1 − β₁) r η) with torch's r_{t+1} written out here."""
    model, opt = warmed(lambda ps: torch.optim.RAdam(ps, lr=0.01, eps=1.0), 3000)
    t, beta2 = 3001, 0.999
    rho_inf = 2 / (1 - beta2) - 1
    rho = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
    out = sharpness(model, bowl_loss, None, opt, tol=1e-12)
    assert out["eigenvalues"][0] == pytest.approx(4 * math.sqrt(1 - beta2**3000), rel=1e-10)
    assert out["threshold"] == pytest.approx(38 / (r * 0.01), rel=1e-12) and out["preconditioned"]


class OwnStepAdam(torch.optim.Adam):
    """An Adam subclass with a step of its own (sign descent): Adam's threshold would be wrong for it."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


class OwnRuleSGD(optim.SGD):
    """optiscope's SGD with another rule in ``update_group`` (the base class's ``step`` calls it)."""

    def update_group(self, group, params, impl):
        for p in params:
            p.add_(p.grad.sign(), alpha=-group["lr"])


class SameStepAdam(torch.optim.Adam):
    """A subclass that keeps Adam's step (a new default, say): Adam's threshold stands."""


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (OwnStepAdam, "no known stability threshold for OwnStepAdam (its step() is not torch.optim.Adam's)"),
        (OwnRuleSGD, "no known stability threshold for OwnRuleSGD (its step() is not optiscope.optim.SGD's)"),
        (torch.optim.Adamax, "no known stability threshold for Adamax"),
    ],
)
def test_a_step_the_analysis_does_not_know_has_no_threshold_and_says_why(make, said):
    """It had the threshold of the class it subclasses (38/η for any torch.optim.Adam subclass). The sign step
    really is not Adam's: on ½·4θ² at 1.5× Adam's threshold it stays bounded (|θ| ≤ η), where Adam would diverge."""
    stability = stability_threshold(make([nn.Parameter(torch.zeros(2))], lr=0.05))
    assert stability.threshold is None and stability.reason == said
    theta = nn.Parameter(torch.ones(1, dtype=torch.float64))
    opt = OwnStepAdam([theta], lr=1.5 * 2 / 4)  # 1.5× GD's 2/η, far beyond what any linear step survives
    for _ in range(100):
        opt.zero_grad()
        (2 * theta**2).sum().backward()
        opt.step()
    assert float(theta.detach().abs()) <= 0.75 + 1e-12


def test_a_subclass_that_keeps_the_known_step_keeps_its_threshold():
    stability = stability_threshold(SameStepAdam([nn.Parameter(torch.zeros(2))], lr=0.05))
    assert stability.threshold == pytest.approx(38 / 0.05, rel=1e-12) and stability.preconditioned


def test_nadam_and_radam_parameters_at_different_step_counts_get_no_threshold():
    """μ_t and r_t depend on t: parameters stepped different numbers of times share no threshold, and the reason
    says so (Adam's threshold does not depend on t and stands)."""
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    for cls in (torch.optim.NAdam, torch.optim.RAdam):
        opt = cls([a, b], lr=0.01)
        for grads in ((a, b), (a,)):
            opt.zero_grad(set_to_none=True)
            sum((p**2).sum() for p in grads).backward()
            opt.step()
        stability = stability_threshold(opt)
        assert stability.threshold is None and "different numbers of steps ([1.0, 2.0])" in stability.reason
