"""optiscope.curvature on a CUDA device (skipped without one): the same oracles as on the CPU (the exact Hessian
by torch.func.hessian, computed on the CPU; an Adam scaling built by hand), with the model, batch and optimizer
state on the GPU."""

import copy

import pytest
import torch

from curvature_support import adam_problem, adam_scaling, exact_hessian, mlp_problem
from optiscope.curvature import directional_curvature, hessian_trace, sharpness
from support import needs_cuda

pytestmark = needs_cuda


def on_cuda(model, batch):
    return model.to("cuda"), tuple(t.to("cuda") for t in batch)


def test_top3_match_the_exact_hessian_on_cuda():
    model, loss_fn, batch = mlp_problem(0)
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch)).flip(0)[:3]
    model, batch = on_cuda(model, batch)
    out = sharpness(model, loss_fn, batch, k=3, tol=1e-10)
    assert out["converged"]
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert out["vector"].device.type == "cuda"
    warm = sharpness(model, loss_fn, batch, k=1, tol=1e-8, init=out["vector"])
    assert warm["eigenvalues"][0] == pytest.approx(float(exact[0]), rel=1e-6) and warm["hvps"] < out["hvps"]


def test_a_float32_model_in_float64_on_cuda():
    model, loss_fn, batch = mlp_problem(3)
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch)).flip(0)[:2]
    model, batch = on_cuda(model.float(), tuple(t.float() for t in batch))
    out = sharpness(model, loss_fn, batch, k=2, tol=1e-10, dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-5, atol=0)
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("adam", [torch.optim.Adam, torch.optim.AdamW])
def test_preconditioned_by_an_adam_state_on_cuda(adam):
    model, loss_fn, batch = mlp_problem(1)
    model, batch = on_cuda(model, batch)
    opt = adam(model.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    H = exact_hessian(copy.deepcopy(model).cpu(), loss_fn, tuple(t.cpu() for t in batch))
    d = adam_scaling(model, opt).cpu()
    # AdamW decays outside the gradient: its map's eigenvalues are those of D H D shifted by (1 + β₁)/(1 − β₁)·λ = 19λ
    shift = 19 * opt.param_groups[0]["weight_decay"] if adam is torch.optim.AdamW else 0.0
    exact = torch.linalg.eigvalsh(d[:, None] * H * d[None, :]).flip(0)[:2] + shift
    out = sharpness(model, loss_fn, batch, optimizer=opt, k=2, tol=1e-10)
    assert out["preconditioned"] and out["threshold"] == pytest.approx(38 / 0.01)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)


def test_trace_and_directional_curvature_on_cuda():
    model, loss_fn, batch = mlp_problem(0)
    H = exact_hessian(model, loss_fn, batch)
    model, batch = on_cuda(model, batch)
    out = hessian_trace(model, loss_fn, batch, probes=30, seed=0)
    assert abs(out["trace"] - float(torch.trace(H))) <= 3 * out["std_error"]
    model.zero_grad()
    loss_fn(model, batch).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()
    along = directional_curvature(model, loss_fn, batch, "gradient")
    assert along["curvature"] == pytest.approx(float(g @ H @ g / (g @ g)), rel=1e-9)


def test_directional_curvature_preconditioned_by_an_adam_state_on_cuda():
    model, loss_fn, batch, opt = adam_problem()
    H = exact_hessian(model, loss_fn, batch)
    P = (adam_scaling(model, opt) ** -2).clone()
    model.to("cuda")
    for state in opt.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to("cuda")
    batch = tuple(t.to("cuda") for t in batch)
    d = {id(p): torch.randn_like(p) for p in model.parameters()}
    flat = torch.cat([d[id(p)].reshape(-1) for p in model.parameters()]).cpu()
    out = directional_curvature(model, loss_fn, batch, d, optimizer=opt)
    assert out["curvature"] == pytest.approx(float(flat @ H @ flat / (flat @ (P * flat))), rel=1e-9)


def test_a_batch_on_another_device_is_named():
    model, loss_fn, batch = mlp_problem(0)
    with pytest.raises(ValueError, match="curvature: the batch is on cpu but the model is on cuda:0; move the batch"):
        sharpness(model.to("cuda"), loss_fn, batch)
