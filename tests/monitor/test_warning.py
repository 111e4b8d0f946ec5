"""The early-warning signals against their oracles: torch.optim's own Adam step, float64 sums, ZClip's recurrences
written out in NumPy, and closed forms on a quadratic."""

import math

import numpy as np
import pytest
import torch

from optiscope.monitor.warning import (
    ALPHA,
    WARMUP,
    Z_CLIP,
    Average,
    Signals,
    adam_lag,
    adam_moments,
    adam_step_size,
    squared_norms,
)


def tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g), torch.randn(7, generator=g), torch.randn(2, 2, 2, generator=g)]


def test_squared_norms_are_float64_sums_of_squares_even_in_bfloat16():
    xs = [*tensors(), torch.full((5,), 300.0, dtype=torch.bfloat16)]
    expected = [float((x.double() ** 2).sum()) for x in xs]
    assert squared_norms(xs).tolist() == pytest.approx(expected, rel=1e-5)
    assert squared_norms([]).numel() == 0


def test_adam_step_size_is_the_step_torch_adam_takes():
    """s = mean (m̂/(√v̂ + ε))² is the step torch.optim.Adam applies, over η, squared and averaged: ‖u‖²/(η²n)."""
    params = [torch.nn.Parameter(x) for x in tensors()]
    lr, betas, eps = 0.05, (0.9, 0.95), 1e-8
    opt = torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)
    for seed in range(1, 5):
        for p, g in zip(params, tensors(seed), strict=True):
            p.grad = g
        before = [p.detach().clone() for p in params]
        opt.step()
    state = [opt.state[p] for p in params]
    t = float(state[0]["step"])
    size = adam_step_size(
        [s["exp_avg"] for s in state],
        [s["exp_avg_sq"] for s in state],
        [1 - betas[0] ** t] * 3,
        [1 - betas[1] ** t] * 3,
        eps,
    )
    steps = [(p.detach() - b).double() for p, b in zip(params, before, strict=True)]
    expected = [float((u**2).sum()) / (lr**2 * u.numel()) for u in steps]
    assert size.tolist() == pytest.approx(expected, rel=1e-4)


def test_adam_moments_read_each_groups_betas_and_amsgrads_maximum():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.Adam([{"params": [a]}, {"params": [b], "betas": (0.5, 0.9), "amsgrad": True, "eps": 1e-3}])
    assert adam_moments(opt, [a, b]) is None  # not stepped yet
    for scale in (1.0, 0.1):
        a.grad, b.grad = scale * torch.ones(3), scale * torch.ones(2)
        opt.step()
    moments = adam_moments(opt, [a, b])
    assert moments.bias_corrections1 == pytest.approx([1 - 0.9**2, 1 - 0.5**2])
    assert moments.bias_corrections2 == pytest.approx([1 - 0.999**2, 1 - 0.9**2])
    assert moments.eps == [1e-8, 1e-3]
    assert moments.second[1] is opt.state[b]["max_exp_avg_sq"] and moments.first[0] is opt.state[a]["exp_avg"]
    assert adam_moments(torch.optim.SGD([a], lr=0.1, momentum=0.9), [a]) is None


def test_adam_lag_in_closed_form_and_against_float64():
    """A constant v = c at bias correction b and a gradient of entries ±a give ρ = a²/(√(c/b) + ε)² exactly; random
    inputs match the definition summed in float64."""
    a, c, b, eps = 3.0, 4.0, 0.25, 1e-3
    g = torch.tensor([a, -a, a, -a])
    lag = adam_lag([g], [torch.full((4,), c)], [b], eps)
    assert float(lag[0]) == pytest.approx(a**2 / (math.sqrt(c / b) + eps) ** 2, rel=1e-6)
    grads, v = tensors(1), [x.abs() + 0.1 for x in tensors(2)]
    lag = adam_lag(grads, v, [0.5, 0.6, 0.7], 1e-8)
    expected = [
        float((gi.double() ** 2 / ((vi.double() / bi).sqrt() + 1e-8) ** 2).mean())
        for gi, vi, bi in zip(grads, v, [0.5, 0.6, 0.7], strict=True)
    ]
    assert lag.tolist() == pytest.approx(expected, rel=1e-5)


def zclip_reference(xs: list[float]) -> list[float]:
    """ZClip's z-scores written out: the mean and population variance of the first ``WARMUP`` values, then
    μ ← αμ + (1 − α)x̃, σ² ← ασ² + (1 − α)(x̃ − μ)² with x̃ = min(x, μ + 2.5σ); z judged before x is taken in."""
    zs, first, mean, var = [], [], 0.0, 0.0
    for x in xs:
        if len(first) < WARMUP:
            zs.append(0.0)
            first.append(x)
            mean, var = float(np.mean(first)), float(np.var(first))
            continue
        zs.append((x - mean) / math.sqrt(var))
        clipped = min(x, mean + Z_CLIP * math.sqrt(var))
        mean = ALPHA * mean + (1 - ALPHA) * clipped
        var = ALPHA * var + (1 - ALPHA) * (clipped - mean) ** 2
    return zs


def test_average_follows_zclips_recurrences_and_skips_non_finite_values():
    rng = np.random.default_rng(0)
    xs = list(2 + 0.1 * rng.standard_normal(80))
    xs[50] = 9.0  # a spike: judged, then clipped before it enters the averages
    average, zs = Average(), []
    for x in [*xs[:30], math.nan, math.inf, *xs[30:]]:
        z = average.z(torch.tensor(x))
        average.add(torch.tensor(x))
        if math.isfinite(x):
            zs.append(float(z))
        else:
            assert float(z) == 0.0
    assert zs == pytest.approx(zclip_reference(xs), rel=1e-4, abs=1e-4)
    assert zs[50] > 10


def test_loss_cusum_and_unrest_follow_their_recurrences_on_zclips_z_scores():
    """Sₜ = max(0, Sₜ₋₁ + zₜ − 0.5) and Uₜ = 0.98 Uₜ₋₁ + 0.02 max(zₜ, 0)² (U₁ = max(z₁, 0)²), z ZClip's: a loss that
    creeps up by a third of its noise each step builds a CUSUM that the noise alone does not."""
    rng = np.random.default_rng(2)
    losses = list(2 + 0.1 * rng.standard_normal(60)) + [2 + 0.03 * k for k in range(1, 21)]
    signals, cusum, unrest = Signals(["loss_cusum", "loss_unrest"]), [], []
    for x in losses:
        out = signals.update(torch.tensor(x))
        cusum.append(float(out["loss_cusum"]))
        unrest.append(float(out["loss_unrest"]))
    s, u, expected_s, expected_u = 0.0, None, [], []
    for z in zclip_reference(losses):
        s = max(0.0, s + z - 0.5)
        jump = max(z, 0.0) ** 2
        u = jump if u is None else 0.98 * u + 0.02 * jump
        expected_s.append(s)
        expected_u.append(u)
    assert cusum == pytest.approx(expected_s, rel=1e-3, abs=1e-3)
    assert unrest == pytest.approx(expected_u, rel=1e-3, abs=1e-4)
    assert max(cusum[:60]) < cusum[-1]


def test_secant_curvature_of_gradient_descent_on_a_quadratic_is_its_curvature():
    """On L = ½hθ² every gradient difference along the update is h·u exactly: the secant score tends to hη/c."""
    h, lr, c = 3.0, 0.1, 2.0
    signals, theta = Signals(["secant"]), torch.tensor([1.0])
    for _ in range(60):
        g = h * theta
        u = -lr * g
        previous = getattr(signals, "_u", torch.zeros(1))
        scores = signals.update(
            torch.tensor(0.5 * h * float(theta) ** 2),
            gu=g * u,
            gu_prev=g * previous,
            upu=u * u,
            lr_over_threshold=torch.tensor(lr / c),
        )
        signals._u, theta = u, theta + u
    assert float(scores["secant"]) == pytest.approx(h * lr / c, rel=1e-3)


def test_lag_scores_a_gradient_that_adams_decayed_second_moment_has_not_seen():
    """Molybog's mechanism: the gradient vanishes, v decays, then a gradient of the old size returns. ρ of that step
    is far above any before it, on the step whose update will be too large, before the loss has moved."""
    param = torch.nn.Parameter(torch.zeros(10))
    opt = torch.optim.Adam([param], lr=1e-3, betas=(0.9, 0.99))
    signals, lags = Signals(["lag", "lag_growth"]), []
    for step in range(1, 700):  # v falls by 0.99⁵⁰⁰ ≈ 1/150 while the gradient vanishes
        scale = 1.0 if step < 200 else 1e-3 if step < 699 else 1.0
        param.grad = scale * torch.ones(10)
        state = opt.state.get(param)
        if state:
            bc2 = 1 - 0.99 ** float(state["step"])
            lag = adam_lag([param.grad], [state["exp_avg_sq"]], [bc2], 1e-8)
            lags.append(signals.update(torch.tensor(1.0), lag=lag))
        opt.step()
    before = max(float(s["lag"]) for s in lags[:-1])
    assert float(lags[-1]["lag"]) > before + math.log(100)
    assert float(lags[-1]["lag_growth"]) > math.log(100)


def test_signals_take_several_runs_at_once_as_one_would_alone():
    rng = np.random.default_rng(1)
    losses, u2 = rng.random((40, 3)) + 1, rng.random((40, 3, 4)) + 0.1
    together, alone = Signals(), [Signals() for _ in range(3)]
    for t in range(40):
        out = together.update(torch.tensor(losses[t]), u2=torch.tensor(u2[t]), w2=torch.ones(3, 4))
        for i, s in enumerate(alone):
            one = s.update(torch.tensor(losses[t, i]), u2=torch.tensor(u2[t, i]), w2=torch.ones(4))
            for name in ("loss_z", "update_ratio_growth"):
                assert float(out[name][i]) == pytest.approx(float(one[name]), nan_ok=True)


def test_an_unknown_signal_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown score 'lagg'; valid: loss_z"):
        Signals(["lagg"])
