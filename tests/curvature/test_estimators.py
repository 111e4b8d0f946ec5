"""Hutchinson's trace against the exact trace; the noise scale on linear regression with a known
gradient covariance; directional curvature against vᵀHv/vᵀv from the exact Hessian."""

import math

import pytest
import torch
from torch import nn

from curvature_support import adam_problem, adam_scaling, exact_hessian, mlp_problem, noise_scale_by_formula
from optiscope.curvature import directional_curvature, gradient_noise_scale, hessian_trace


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hutchinson_is_within_three_standard_errors_of_the_exact_trace(seed):
    model, loss_fn, batch = mlp_problem(0)
    exact = float(torch.trace(exact_hessian(model, loss_fn, batch)))
    out = hessian_trace(model, loss_fn, batch, probes=30, seed=seed)
    assert out["probes"] == 30 and out["std_error"] > 0
    assert abs(out["trace"] - exact) <= 3 * out["std_error"]


def float16_regression(c):
    """A float16 linear model with loss c·mean((w·x − y)²): H = (2c/n) Σ x xᵀ in closed form, and, with
    targets far from the fit, a gradient whose squared norm passes float16's 65504."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 64), 30 * torch.randn(256, 1)
    model = nn.Linear(64, 1, bias=False).half()

    def loss_fn(m, batch):
        return c * ((m(batch[0]) - batch[1]) ** 2).mean()

    H = 2 * c * x.double().T @ x.double() / len(x)
    w = model.weight.detach().double().reshape(-1)
    g = 2 * c * x.double().T @ (x.double() @ w - y.double().reshape(-1)) / len(x)
    return model, loss_fn, (x.half(), y.half()), H, g


def test_a_float16_models_trace_and_curvature_along_its_gradient_are_summed_past_float16s_range():
    """tr H and gᵀHg/gᵀg are far inside float16's range, the sums that make them are not (tr H ≈ 7.7e4,
    |g|² ≈ 1e5): against the closed forms in float64."""
    model, loss_fn, batch, H, g = float16_regression(c=600.0)
    exact_trace = float(torch.trace(H))
    assert exact_trace > 65504 and float(g @ g) > 65504  # the sums overflow float16: the test can fail
    out = hessian_trace(model, loss_fn, batch, probes=20)
    assert math.isfinite(out["std_error"]) and abs(out["trace"] - exact_trace) <= 4 * out["std_error"]
    along = directional_curvature(model, loss_fn, batch, "gradient")
    assert along["curvature"] == pytest.approx(float(g @ H @ g / (g @ g)), rel=1e-2)


def test_directional_curvature_along_a_vector_and_the_gradient():
    model, loss_fn, batch = mlp_problem(2)
    H = exact_hessian(model, loss_fn, batch)
    named = dict(model.named_parameters())
    d = {n: torch.randn_like(p) for n, p in named.items()}
    flat = torch.cat([d[n].reshape(-1) for n in named])
    out = directional_curvature(model, loss_fn, batch, d)
    assert out["curvature"] == pytest.approx(float(flat @ H @ flat / (flat @ flat)), rel=1e-9)
    model.zero_grad()
    loss_fn(model, batch).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    along_g = directional_curvature(model, loss_fn, batch, "gradient")
    assert along_g["curvature"] == pytest.approx(float(g @ H @ g / (g @ g)), rel=1e-9)


def test_preconditioned_directional_curvature_uses_the_adam_state():
    model, loss_fn, batch, opt = adam_problem()
    H = exact_hessian(model, loss_fn, batch)
    P = adam_scaling(model, opt) ** -2
    d = {id(p): torch.randn_like(p) for p in model.parameters()}
    flat = torch.cat([d[id(p)].reshape(-1) for p in model.parameters()])
    out = directional_curvature(model, loss_fn, batch, d, optimizer=opt)
    assert out["preconditioned"]
    assert out["curvature"] == pytest.approx(float(flat @ H @ flat / (flat @ (P * flat))), rel=1e-9)
    assert out["ratio"] == pytest.approx(out["curvature"] / (38 / 0.01))


def test_noise_scale_on_linear_regression_with_a_known_covariance():
    """y = w*·x + σξ with x ~ N(0, I_d): at w, with δ = w − w*, the per-example gradient of ½(w·x − y)² has
    mean G = δ and covariance Σ = (|δ|² + σ²) I + δδᵀ (Gaussian fourth moments), so
    B_simple = (d(|δ|² + σ²) + |δ|²)/|δ|², and per coordinate block p, tr Σ_p = d_p(|δ|² + σ²) + |δ_p|²."""
    d, sigma, b, n = 4, 1.0, 16, 512
    g = torch.Generator().manual_seed(0)
    w_star = torch.randn(d, generator=g, dtype=torch.float64)
    delta = torch.tensor([1.0, 0.0, 0.5, -0.5], dtype=torch.float64)
    w = nn.Parameter(w_star + delta)
    small = []
    for _ in range(n):
        x = torch.randn(b, d, generator=g, dtype=torch.float64)
        y = x @ w_star + sigma * torch.randn(b, generator=g, dtype=torch.float64)
        (grad,) = torch.autograd.grad(0.5 * ((x @ w - y) ** 2).mean(), w)
        small.append([grad[:2], grad[2:]])  # two "parameters"
    out = gradient_noise_scale(small, b)
    dd = float(delta @ delta)
    assert out["b_small"] == b and out["b_big"] == b * n
    assert out["grad_sq"] == pytest.approx(dd, rel=0.1)
    assert out["trace_sigma"] == pytest.approx(d * (dd + sigma**2) + dd, rel=0.1)
    assert out["noise_scale"] == pytest.approx((d * (dd + sigma**2) + dd) / dd, rel=0.15)
    for p, part in enumerate([delta[:2], delta[2:]]):
        signal = float(part @ part)
        assert out["snr"][p] == pytest.approx(signal / ((2 * (dd + sigma**2) + signal) / b), rel=0.25)


def test_noise_scale_needs_two_batches():
    with pytest.raises(ValueError, match="at least 2"):
        gradient_noise_scale([[torch.ones(2)]], 4)
    assert math.isnan(gradient_noise_scale([[torch.ones(2)], [torch.ones(2)]], 4)["noise_scale"]) is False
    with pytest.raises(ValueError, match=r"hold \[1, 2\] tensors; each must hold one per parameter"):
        gradient_noise_scale([[torch.ones(2)], [torch.ones(2), torch.ones(3)]], 4)
    with pytest.raises(ValueError, match="batch_size=True must be an integer >= 1"):
        gradient_noise_scale([[torch.ones(2)], [torch.ones(2)]], True)
    with pytest.raises(ValueError, match=r"tensor 1 has shapes \[\(2,\), \(3,\)\] in different small-batch gradients"):
        gradient_noise_scale([[torch.ones(2), torch.ones(3)], [torch.ones(2), torch.ones(2)]], 4)


def test_a_gradient_a_batch_did_not_reach_is_zero_not_a_crash():
    """``p.grad`` is None where a small batch did not reach a parameter (an unused head, an expert routed
    nothing): McCandlish et al.'s estimators then see zeros there, as written out on explicit zero tensors; a
    parameter no batch reached has neither signal nor noise (SNR NaN). Not a tensor at all is refused."""
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(3, generator=gen, dtype=torch.float64), None, None] for _ in range(4)]
    grads[1][1] = torch.randn(2, generator=gen, dtype=torch.float64)
    zeros = [
        [torch.zeros(2 if i == 1 else 1, dtype=torch.float64) if g is None else g for i, g in enumerate(row)]
        for row in grads
    ]
    want = noise_scale_by_formula(zeros, 8)
    got = gradient_noise_scale(grads, 8)
    assert got["noise_scale"] == pytest.approx(want["noise_scale"], rel=1e-9)
    assert got["grad_sq"] == pytest.approx(want["grad_sq"], rel=1e-9)
    assert got["snr"][:2] == pytest.approx(want["snr"][:2], rel=1e-9) and math.isnan(got["snr"][2])
    with pytest.raises(TypeError, match="tensor 1 of a small-batch gradient is a float; give tensors"):
        gradient_noise_scale([[torch.ones(2), 1.0], [torch.ones(2), None]], 4)


def test_directional_curvature_names_itself_for_something_that_is_not_an_optimizer():
    model, loss_fn, batch = mlp_problem(0)
    with pytest.raises(TypeError, match="^directional_curvature: optimizer='adam' is not an optimizer; give a torch"):
        directional_curvature(model, loss_fn, batch, "gradient", optimizer="adam")


def test_norms_of_unequal_lengths_are_refused_in_one_line():
    from optiscope.curvature import noise_scale_from_norms

    with pytest.raises(ValueError, match=r"^noise_scale_from_norms: 2 small-batch norms but 1 big-batch norms; give"):
        noise_scale_from_norms([1.0, 2.0], [0.5], 4, 2)
