"""Shared by the curvature tests: a small float64 MLP problem, its exact Hessian and an Adam scaling built
by hand (the oracles, independent of optiscope.curvature)."""

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
    """P^{-1/2} = (√v̂ + ε)^{-1/2} as one flat vector, from a torch.optim.Adam(W) state by hand."""
    parts = []
    for group in opt.param_groups:
        beta2, eps = group["betas"][1], group["eps"]
        for p in group["params"]:
            s = opt.state[p]
            parts.append((s["exp_avg_sq"] / (1 - beta2 ** float(s["step"]))).sqrt().reshape(-1) + eps)
    return torch.cat(parts).rsqrt()
