"""optiscope.optim on a CUDA device (skipped without one): each path against torch.optim's on the same device,
the path the default picks there, and every recipe on CUDA against the same recipe on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from test_torch_parity import IMPL, PAIRS
from torch import nn

from optiscope.optim import RECIPES, Muon, build_optimizer
from support import needs_cuda

pytestmark = needs_cuda

# The paths torch.optim 2.x has on CUDA, per pair (RMSprop has no fused kernel; Muon one path).
TORCH_PATHS = {
    "sgd": ["forloop", "foreach", "fused"],
    "sgd-momentum": ["forloop", "foreach", "fused"],
    "sgd-nesterov": ["forloop", "foreach", "fused"],
    "rmsprop": ["forloop", "foreach"],
    "adam": ["forloop", "foreach", "fused"],
    "adamw": ["forloop", "foreach", "fused"],
    "muon": ["default"],
}
# What ours picks by default on CUDA: torch's fused kernel where torch has one, else foreach.
DEFAULT_ON_CUDA = {
    "sgd": "fused",
    "rmsprop": "foreach",
    "adam": "fused",
    "adamw": "fused",
    "lion": "foreach",
    "muon": "foreach",
}


def mlp(bias: bool, device: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32, bias=bias), nn.Tanh(), nn.Linear(32, 4, bias=bias)).to(device)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, device: str) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        opt.step()


def max_relative_gap(a: nn.Module, b: nn.Module) -> float:
    """max over parameters of |a − b| / |b| (Frobenius), b moved to a's device."""
    return max(
        float((p.detach() - q.detach().to(p.device)).norm() / q.detach().norm())
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


@pytest.mark.parametrize("name, path", [(n, p) for n, paths in TORCH_PATHS.items() for p in paths])
def test_each_path_steps_like_torch_on_cuda(name, path):
    ours_cls, torch_cls, kw = PAIRS[name]
    bias = name != "muon"
    mine, theirs = mlp(bias, "cuda"), mlp(bias, "cuda")
    train(mine, ours_cls(mine.parameters(), **kw, **IMPL[path]), 20, "cuda")
    train(theirs, torch_cls(theirs.parameters(), **kw, **IMPL[path]), 20, "cuda")
    assert max_relative_gap(mine, theirs) < 1e-5


@pytest.mark.parametrize("name", DEFAULT_ON_CUDA)
def test_the_default_path_on_cuda(name):
    model = mlp(name != "muon", "cuda")
    opt = build_optimizer(name, model, 1e-3)
    train(model, opt, 1, "cuda")  # grads exist: fused needs them to choose
    group = opt.param_groups[0]
    assert opt.implementation(group, group["params"]) == DEFAULT_ON_CUDA[name]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_on_cuda_steps_as_on_the_cpu(name):
    """Float32 on both devices, 20 steps: different kernels, the same arithmetic up to rounding. Muon
    orthogonalises in bfloat16 on a GPU and in float32 on the CPU (see ``optim.recipes``), so its gap is that
    of bfloat16's 8-bit mantissa over five Newton–Schulz iterations: bounded at 5 % of the weights' norm."""
    bias = name != "muon"
    cpu = mlp(bias, "cpu")
    gpu = copy.deepcopy(cpu).to("cuda")
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        train(model, build_optimizer(name, model, 1e-2, weight_decay=0.1), 20, device)
    bound = 5e-2 if name.startswith("muon") else 1e-4
    assert max_relative_gap(gpu, cpu) < bound
    assert max_relative_gap(gpu, mlp(bias, "cpu")) > min(10 * bound, 0.1)  # it did move


def test_muon_in_float32_on_cuda_steps_as_on_the_cpu():
    cpu = mlp(False, "cpu")
    gpu = copy.deepcopy(cpu).to("cuda")
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        train(model, Muon(model.parameters(), lr=2e-2, ns_dtype=torch.float32), 20, device)
    assert max_relative_gap(gpu, cpu) < 1e-4
