"""On quadratics with a known Hessian the edge and the optimum are known in closed form: ``sharpness`` reads the
edge exactly and its suggestion falls inside the band they define, for SGD, heavy ball and Adam with its
preconditioner frozen; ``limits`` (the default) takes the noise-free greedy step where it binds first."""

import math

import numpy as np
import pytest

from optiscope import suggest_lr

from .fake_trainee import quadratic
from .test_suggest import A, weights


def test_sgd_on_a_quadratic_reads_its_edge_and_its_band_holds_the_optimum():
    """Gradient descent on ½wᵀHw is stable below 2/λ_max = 0.2 and fastest at 2/(λ_max + λ_min) = 2/11.

    σ is fitted on noisy minibatch tasks, where η* lies well below the edge; on this noiseless quadratic the
    suggestion is therefore a stable step below GD's optimum, and the band it states holds the optimum."""
    s = suggest_lr(weights(1.0, 1.0), "sgd", quadratic, [A], steps=20, method="sharpness")
    assert s.edge == pytest.approx(2 / 10, rel=1e-3) and s.threshold == "2/η"
    assert 0 < s.lr < 2 / 10
    assert s.low <= 2 / 11 <= s.high


def test_heavy_ball_on_a_quadratic_reads_its_edge_and_suggests_within_its_optimal_band():
    """Heavy ball at β = 0.9 is stable below (2 + 2β)/λ_max = 0.38; every η in [(1 − √β)²/λ_min, (1 + √β)²/λ_max]
    converges at its best rate √β (the eigenvalues of its iteration matrix are then complex, of modulus √β)."""
    s = suggest_lr(weights(1.0, 1.0), "momentum", quadratic, [A], steps=20, method="sharpness")
    beta = 0.9
    assert s.edge == pytest.approx(3.8 / 10, rel=1e-3) and s.threshold == "3.8/η"
    assert (1 - math.sqrt(beta)) ** 2 / 1.0 <= s.lr <= (1 + math.sqrt(beta)) ** 2 / 10


def test_adam_with_its_preconditioner_frozen_reads_its_edge_and_suggests_within_its_optimal_band():
    """At η = 0 the weights stay and every gradient is g = a ⊙ w, so P = √v̂ + ε = |g| + ε is frozen: P⁻¹H =
    diag(aᵢ/(|aᵢwᵢ| + ε)), built here by hand. Adam with P frozen is heavy ball on P⁻¹H at η(1 − β₁), β = β₁: stable
    below 38/h_max, at its best rate for η(1 − β₁) in [(1 − √β₁)²/h_min, (1 + √β₁)²/h_max]."""
    w = np.array([1.0, 0.5])
    a = A.double().numpy()
    h = np.sort(a / (np.abs(a * w) + 1e-8))  # eigenvalues of the diagonal P⁻¹H
    s = suggest_lr(weights(*w), "adam", quadratic, [A], steps=30, method="sharpness")
    assert s.edge == pytest.approx(38 / h[-1], rel=1e-3) and s.threshold == "38/η"
    beta1 = 0.9
    assert (
        (1 - math.sqrt(beta1)) ** 2 / ((1 - beta1) * h[0])
        <= s.lr
        <= (1 + math.sqrt(beta1)) ** 2 / ((1 - beta1) * h[-1])
    )


def test_limits_takes_the_greedy_step_where_it_binds_before_the_edge():
    """Without gradient noise the noise limit is the greedy step along g = Hw: gᵀg/gᵀHg = 101/1001 at w = (1, 1),
    below GD's edge 2/10, so it binds (heavy ball: over 1/(1 − β) = 10, below its edge 3.8/10)."""
    for optimizer, expected in (("sgd", 101 / 1001), ("momentum", 0.1 * 101 / 1001)):
        s = suggest_lr(weights(1.0, 1.0), optimizer, quadratic, [A], steps=30)
        assert s.method == "limits" and s.edge == pytest.approx(expected, rel=1e-3)
        assert 0 < s.lr < s.edge and s.low < s.lr < s.high
