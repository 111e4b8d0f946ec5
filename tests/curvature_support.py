"""Shared by the curvature tests: a small float64 MLP problem, its exact Hessian, an Adam scaling built by
hand and the noise-scale estimators written out (the oracles, independent of optiscope.curvature)."""

import math

import pytest
import torch
from torch import nn


def mlp_problem(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, 2, dtype=torch.float64)

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    return model, loss_fn, (x, y)


def adam_problem(seed=1, lr=0.01, steps=3):
    """``mlp_problem(seed)`` after ``steps`` full-batch steps of torch.optim.Adam: (model, loss_fn, batch, opt)."""
    model, loss_fn, batch = mlp_problem(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    return model, loss_fn, batch, opt


def exact_hessian(model, loss_fn, batch):
    """The full Hessian by torch.func.hessian over one flat parameter vector (independent of our HVPs)."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(flat):
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes, strict=True)}
        return loss_fn(lambda x: torch.func.functional_call(model, params, (x,)), batch)

    return torch.func.hessian(f)(flat0)


def adam_scaling(model, opt):
    """P^{-1/2} = (√v̂ + ε)^{-1/2} as one flat vector over ``model``'s parameters, from a torch.optim.Adam(W)
    state by hand."""
    parts = []
    for p in model.parameters():
        group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
        beta2, eps, s = group["betas"][1], group["eps"], opt.state[p]
        parts.append((s["exp_avg_sq"] / (1 - beta2 ** float(s["step"]))).sqrt().reshape(-1) + eps)
    return torch.cat(parts).rsqrt()


def noise_scale_by_formula(passes, batch_size):
    """The oracle for B_simple: McCandlish et al.'s Appendix A estimators written out, from ``passes``, the n
    small-batch gradients of one step (each a list of tensors) of ``batch_size`` examples each. Returns
    ``noise_scale``, ``grad_sq`` (|G|²) and ``trace_sigma`` (tr Σ) on whole-model norms, and ``snr``, the
    per-tensor |G_p|² / (tr Σ_p / b)."""
    b, big = batch_size, len(passes) * batch_size

    def estimates(flat):  # (n, size): |G|² and tr Σ of these coordinates
        small_sq, big_sq = float((flat**2).sum(1).mean()), float((flat.mean(0) ** 2).sum())
        return (big * big_sq - b * small_sq) / (big - b), (small_sq - big_sq) / (1 / b - 1 / big)

    def flat(tensors):
        return torch.cat([t.detach().double().reshape(-1) for t in tensors])

    per_tensor = [estimates(torch.stack([flat([g]) for g in grads])) for grads in zip(*passes, strict=True)]
    grad_sq, trace_sigma = estimates(torch.stack([flat(grads) for grads in passes]))
    return {
        "noise_scale": trace_sigma / grad_sq,
        "grad_sq": grad_sq,
        "trace_sigma": trace_sigma,
        "snr": [g2 / (s / b) if s else math.nan for g2, s in per_tensor],  # NaN: a tensor without gradient
    }


def assert_accumulated_noise_scale(records, passes, steps, batch_size, rel=1e-4):
    """The records at ``steps`` (and only those) carry the noise scale of the accumulated micro-batches, equal
    to ``noise_scale_by_formula`` on ``passes[step]``, the micro-batches' own gradients."""
    assert sorted(step for step, r in records.items() if "noise_scale" in r) == list(steps)
    for step in steps:
        want = noise_scale_by_formula(passes[step], batch_size)
        got = records[step]
        assert got["curvature"]["noise_source"] == "accumulated micro-batches"
        assert got["noise_scale"] > 0 and got["noise_scale"] == pytest.approx(want["noise_scale"], rel=rel), step
        assert got["curvature"]["grad_sq"] == pytest.approx(want["grad_sq"], rel=rel), step
        assert got["curvature"]["trace_sigma"] == pytest.approx(want["trace_sigma"], rel=rel), step
