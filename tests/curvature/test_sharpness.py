"""Sharpness against exact Hessians: torch.func.hessian + eigvalsh on small float64 models, the
preconditioned spectrum built by hand from a torch.optim.Adam state, and quadratics with a known spectrum."""

import copy
import math

import pytest
import torch
from torch import nn

from curvature_support import adam_problem, adam_scaling, exact_hessian, mlp_problem
from optiscope import optim
from optiscope.curvature import HessianOperator, directional_curvature, lanczos, sharpness


@pytest.mark.parametrize("seed", [0, 1])
def test_top3_match_the_exact_hessian(seed):
    model, loss_fn, batch = mlp_problem(seed)
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch)).flip(0)[:3]
    out = sharpness(model, loss_fn, batch, k=3, tol=1e-10, dtype=torch.float64)
    assert out["converged"] and out["threshold"] is None and not out["preconditioned"]
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert out["hvps"] <= sum(p.numel() for p in model.parameters())


def test_float32_model_in_float64_and_frozen_parameters_are_left_out():
    model, loss_fn, batch = mlp_problem(3)
    model[0].weight.requires_grad_(False)  # H over the rest only
    x32 = tuple(t.float() for t in batch)
    model32 = model.float()
    full = exact_hessian(model32.double(), loss_fn, batch)
    n0 = model[0].weight.numel()
    exact = torch.linalg.eigvalsh(full[n0:, n0:]).flip(0)[:2]
    model32.float()
    out = sharpness(model32, loss_fn, x32, k=2, tol=1e-10, dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert model32[0].weight.dtype == torch.float32  # the model itself is untouched


def test_a_group_frozen_at_lr_0_is_left_out_of_h():
    """A group the optimizer holds at lr 0 is not moved: H is taken over the other group's parameters (the
    exact Hessian's block over them is the oracle), and the other group's threshold holds."""
    model, loss_fn, batch = mlp_problem(3)
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    opt = torch.optim.SGD([{"params": first, "lr": 0.0}, {"params": rest}], lr=0.1)
    n0 = sum(p.numel() for p in first)
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch)[n0:, n0:]).flip(0)[:2]
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert out["threshold"] == pytest.approx(2 / 0.1)


def batch_norm_problem(norm):
    """An MLP with a batch norm whose running statistics (from other inputs) are far from the batch's, and
    its loss written out with either set of statistics: (model, loss_fn, batch, oracle_loss(flat, batch_stats))."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 5), norm(5), nn.Tanh(), nn.Linear(5, 2)).double()
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(3):
            model(3 * torch.randn(16, 3, dtype=torch.float64) + 2)  # moves the running statistics

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    bn = model[1]

    def oracle_loss(flat, batch_stats):
        w1, b1, gamma, beta, w2, b2 = (t.view(s) for t, s in zip(torch.split(flat, sizes), shapes, strict=True))
        h = x @ w1.T + b1
        mean, var = (h.mean(0), h.var(0, unbiased=False)) if batch_stats else (bn.running_mean, bn.running_var)
        h = torch.tanh((h - mean) / torch.sqrt(var + bn.eps) * gamma + beta)
        return ((h @ w2.T + b2 - y) ** 2).mean()

    return model, loss_fn, (x, y), oracle_loss


@pytest.mark.parametrize("norm", [nn.BatchNorm1d, nn.SyncBatchNorm])  # SyncBatchNorm outside DDP: a batch norm
@pytest.mark.parametrize("training", [True, False])
def test_a_batch_norm_is_measured_as_it_normalises_and_keeps_its_running_statistics(training, norm):
    """Training: the batch's own statistics (the loss the optimizer descends); frozen in eval mode by the user:
    the running ones. Either way the running statistics and the counter are not touched."""
    model, loss_fn, batch, oracle_loss = batch_norm_problem(norm)
    model.train(training)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    exact = {
        stats: torch.linalg.eigvalsh(torch.func.hessian(lambda f, s=stats: oracle_loss(f, s))(flat)).flip(0)[:2]
        for stats in (True, False)
    }
    assert not torch.allclose(exact[True], exact[False], rtol=1e-2)  # the two functions differ: the test can fail
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = sharpness(model, loss_fn, batch, k=2, tol=1e-10)
    torch.testing.assert_close(
        torch.tensor(out["eigenvalues"], dtype=torch.float64), exact[training], rtol=1e-6, atol=0
    )
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model[1].training == training and model[1].track_running_stats


def test_preconditioned_by_a_torch_adam_state_built_by_hand():
    model, loss_fn, batch = mlp_problem(1)
    beta1, beta2, eps, lr = 0.8, 0.95, 1e-3, 0.01
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(beta1, beta2), eps=eps)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    H = exact_hessian(model, loss_fn, batch)
    d = adam_scaling(model, opt)
    exact = torch.linalg.eigvalsh(d[:, None] * H * d[None, :]).flip(0)[:3]
    out = sharpness(model, loss_fn, batch, optimizer=opt, k=3, tol=1e-10, dtype=torch.float64)
    assert out["preconditioned"]
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert out["threshold"] == pytest.approx((2 + 2 * beta1) / ((1 - beta1) * lr))
    assert out["ratio"] == pytest.approx(out["eigenvalues"][0] / out["threshold"])


class _Ascent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.ones(2, dtype=torch.float64))


def test_an_optimizer_that_maximizes_is_measured_on_the_objective_it_descends():
    """``maximize=True`` ascends L = −½ xᵀ diag(10, 1) x, i.e. descends −L with Hessian diag(10, 1): torch's SGD
    (the oracle) diverges at η = 1.05·2/10 and converges at 0.95·2/10, and the instrument says 10 against 2/η
    before the first step; Adam's preconditioned spectrum is that of D(−H)D, built by hand; param groups
    that mix maximize give no threshold."""
    A = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))

    def reward(m, batch):
        return -0.5 * m.x @ A @ m.x

    for factor in (1.05, 0.95):
        model = _Ascent()
        opt = torch.optim.SGD(model.parameters(), lr=factor * 2 / 10, maximize=True)
        out = sharpness(model, reward, None, opt)
        assert out["eigenvalues"][0] == pytest.approx(10.0, rel=1e-9) and out["ratio"] == pytest.approx(factor)
        for _ in range(60):
            opt.zero_grad()
            reward(model, None).backward()
            opt.step()
        assert (float(model.x.detach().abs().max()) > 10) == (factor > 1)
    model, loss_fn, batch, opt = adam_problem()
    for group in opt.param_groups:
        group["maximize"] = True
    d = adam_scaling(model, opt)
    H = exact_hessian(model, loss_fn, batch)
    exact = torch.linalg.eigvalsh(d[:, None] * -H * d[None, :]).flip(0)[:2]
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    mixed = torch.optim.SGD([{"params": [model[0].weight], "maximize": True}, {"params": [model[2].weight]}], lr=0.1)
    out = sharpness(model, loss_fn, batch, mixed)
    assert out["threshold"] is None and "mix maximize=True and False" in out["reason"]


def test_coupled_weight_decay_is_in_the_hessian_the_step_sees():
    """SGD's weight decay λ adds λθ to the gradient, so the step sees H + λI: on L = ½ xᵀ diag(10, 1) x with
    λ = 2, torch's SGD (the oracle) diverges at 2/η = 11 (10 < 11 < 12) and converges at 2/η = 13, and the
    instrument says 12 against 2/η before the first step (the loss's own 10 would call both stable)."""
    A = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))

    def loss_fn(m, batch):
        return 0.5 * m.x @ A @ m.x

    for edge, diverges in ((11.0, True), (13.0, False)):
        model = _Ascent()
        opt = torch.optim.SGD(model.parameters(), lr=2 / edge, weight_decay=2.0)
        out = sharpness(model, loss_fn, None, opt)
        assert out["eigenvalues"][0] == pytest.approx(12.0, rel=1e-9) and out["ratio"] == pytest.approx(12 / edge)
        for _ in range(100):
            opt.zero_grad()
            loss_fn(model, None).backward()
            opt.step()
        assert (float(model.x.detach().abs().max()) > 10) == diverges


@pytest.mark.parametrize("torch_class", [torch.optim.Adam, torch.optim.AdamW])
def test_adam_coupled_decay_per_group_against_a_state_built_by_hand(torch_class):
    """torch.optim.Adam with weight decay on the first layer only: eig(D (H + Λ) D), Λ = λ on that layer's
    entries, from the exact Hessian and a hand-built D; AdamW decays outside the gradient: eig(D H D + 19Λ)
    (its shift, tested against the update's own linear map below). The curvature along the gradient is that
    of the gradient the step sees, g + Λθ for Adam (the oracle by autograd)."""
    model, loss_fn, batch = mlp_problem(2)
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    opt = torch_class([{"params": first, "weight_decay": 0.5}, {"params": rest, "weight_decay": 0.0}], lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    coupled = torch_class is torch.optim.Adam
    on_first = torch.cat([torch.full((p.numel(),), 0.5 if i < 2 else 0.0) for i, p in enumerate(model.parameters())])
    lam = torch.diag(on_first.double()) if coupled else 0  # in the gradient: H + Λ
    shift = 0 if coupled else torch.diag(19 * on_first.double())  # decoupled: DHD + 19Λ
    H = exact_hessian(model, loss_fn, batch) + lam
    d = adam_scaling(model, opt)
    A = d[:, None] * H * d[None, :] + shift
    exact = torch.linalg.eigvalsh(A).flip(0)[:2]
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10, along={"gradient": "gradient"})
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    grads = torch.autograd.grad(loss_fn(model, batch), list(model.parameters()))
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    g = torch.cat([t.reshape(-1) for t in grads]) + (on_first.double() * theta if coupled else 0)
    w = g / d  # the gradient in A's coordinates: wᵀAw / wᵀw = gᵀ(H + Λ)g / gᵀPg when coupled
    expected = float(w @ A @ w / (w @ w))
    assert out["along"]["gradient"]["curvature"] == pytest.approx(expected, rel=1e-8)
    along = directional_curvature(model, loss_fn, batch, "gradient", opt)
    assert along["curvature"] == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize(
    ("momentum", "dampening", "nesterov"), [(0.0, 0.0, False), (0.5, 0.0, False), (0.5, 0.3, False), (0.5, 0.0, True)]
)
def test_decoupled_sgd_decay_against_the_optimizer_diverging_and_converging(momentum, dampening, nesterov):
    """optiscope's SGD with decoupled decay λ = 2 on L = ½ xᵀ diag(10, 1) x: the sharpness is 10 + cλ,
    c = 1 without momentum (the same steps as coupled decay), (1 + β)/(1 − τ) heavy ball with dampening τ,
    (1 + β)/(1 + 2β) Nesterov. The optimizer itself is the oracle: at η with the threshold 0.95× the
    sharpness it diverges, at 1.05× it converges (10 alone would call both stable: the threshold is above it)."""
    A = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))
    if momentum == 0:
        c, coef = 1.0, 2.0
    elif nesterov:
        c, coef = (1 + momentum) / (1 + 2 * momentum), (2 + 2 * momentum) / (1 + 2 * momentum)
    else:
        c, coef = (1 + momentum) / (1 - dampening), (2 + 2 * momentum) / (1 - dampening)
    top = 10 + 2 * c

    def loss_fn(m, batch):
        return 0.5 * m.x @ A @ m.x

    for factor in (0.95, 1.05):
        model = _Ascent()
        opt = optim.SGD(
            model.parameters(),
            lr=coef / (factor * top),
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=2.0,
            decoupled_weight_decay=True,
        )
        out = sharpness(model, loss_fn, None, opt)
        assert out["eigenvalues"][0] == pytest.approx(top, rel=1e-9) and out["ratio"] == pytest.approx(1 / factor)
        assert out["threshold"] > 10
        for _ in range(300):
            opt.zero_grad()
            loss_fn(model, None).backward()
            opt.step()
        assert (float(model.x.detach().abs().max()) > 10) == (factor < 1)


def test_adamw_shift_puts_the_threshold_where_its_linear_map_meets_minus_1():
    """torch's AdamW with decay λ on the first layer only, P frozen from its state: the map of (θ, m) written
    out from the update rule, M = [[I − ηΛ − η(1 − β)P⁻¹H, −ηβP⁻¹], [(1 − β)H, βI]], has an eigenvalue −1 at
    the η where the sharpness meets (2 + 2β)/((1 − β)η), and not where λ₁(DHD) alone would put it."""
    model, loss_fn, batch = mlp_problem(2)
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    beta = 0.9
    opt = torch.optim.AdamW([{"params": first, "weight_decay": 5.0}, {"params": rest, "weight_decay": 0.0}], lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    H = exact_hessian(model, loss_fn, batch)
    p_inv = torch.diag(adam_scaling(model, opt) ** 2)
    lam = torch.diag(
        torch.cat([torch.full((p.numel(),), 5.0 if i < 2 else 0.0) for i, p in enumerate(model.parameters())]).double()
    )
    n = H.shape[0]

    def distance_to_minus_1(eta):
        M = torch.cat(
            [
                torch.cat(
                    [torch.eye(n, dtype=H.dtype) - eta * lam - eta * (1 - beta) * p_inv @ H, -eta * beta * p_inv], 1
                ),
                torch.cat([(1 - beta) * H, beta * torch.eye(n, dtype=H.dtype)], 1),
            ]
        )
        return float((torch.linalg.eigvals(M) + 1).abs().min())

    out = sharpness(model, loss_fn, batch, opt, tol=1e-12, max_hvps=200)
    edge = (2 + 2 * beta) / ((1 - beta) * out["eigenvalues"][0])
    d = adam_scaling(model, opt)
    without = (2 + 2 * beta) / ((1 - beta) * float(torch.linalg.eigvalsh(d[:, None] * H * d[None, :])[-1]))
    assert distance_to_minus_1(edge) < 1e-8 < 1e-4 < distance_to_minus_1(without)


def test_adamw_groups_at_different_lrs_against_a_state_and_a_linear_map_built_by_hand():
    """torch's AdamW with its layers at lrs 0.01 and 0.003 and decays 5 and 2: the eigenvalues are those of
    D H D + 19·S·Λ, D² = S P⁻¹ with S = diag(η_g/η_max) and P from the state (by hand), against 38/η_max; and
    the update's own linear map with P frozen, M = [[I − EΛ − (1 − β)EP⁻¹H, −βEP⁻¹], [(1 − β)H, βI]],
    E = diag(η_g), has an eigenvalue −1 when both lrs are scaled by 1/ratio, where the ratio says the edge is."""
    model, loss_fn, batch = mlp_problem(2)
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    lrs, decays, beta = (0.01, 0.003), (5.0, 2.0), 0.9
    opt = torch.optim.AdamW(
        [
            {"params": first, "lr": lrs[0], "weight_decay": decays[0]},
            {"params": rest, "lr": lrs[1], "weight_decay": decays[1]},
        ]
    )
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()

    def per_entry(values):
        return torch.cat(
            [torch.full((p.numel(),), values[0] if i < 2 else values[1]) for i, p in enumerate(model.parameters())]
        ).double()

    H = exact_hessian(model, loss_fn, batch)
    p_inv, eta, lam = adam_scaling(model, opt) ** 2, per_entry(lrs), per_entry(decays)
    s = eta / max(lrs)
    d = (s * p_inv).sqrt()
    exact = torch.linalg.eigvalsh(d[:, None] * H * d[None, :] + torch.diag(19 * s * lam)).flip(0)[:2]
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-12, max_hvps=200)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert out["threshold"] == pytest.approx(38 / max(lrs), rel=1e-12) and out["label"] == "38/η_max"
    n = H.shape[0]

    def distance_to_minus_1(factor):
        E, P = torch.diag(factor * eta), torch.diag(p_inv)
        identity = torch.eye(n, dtype=H.dtype)
        M = torch.cat(
            [
                torch.cat([identity - E @ torch.diag(lam) - (1 - beta) * E @ P @ H, -beta * E @ P], 1),
                torch.cat([(1 - beta) * H, beta * identity], 1),
            ]
        )
        return float((torch.linalg.eigvals(M) + 1).abs().min())

    assert distance_to_minus_1(1 / out["ratio"]) < 1e-6 < 1e-3 < distance_to_minus_1(1.05 / out["ratio"])


def _embedding_model(sparse):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 1)).double()


def test_a_sparse_embedding_is_measured_as_its_dense_twin():
    """``nn.Embedding(sparse=True)`` gets sparse gradients and products: the same top-2 as the exact Hessian of
    the model with a dense embedding (the oracle), where flattening a sparse product had failed."""
    ids, y = torch.randint(0, 10, (16, 3), generator=torch.Generator().manual_seed(1)), torch.randn(16, 1).double()

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    exact = torch.linalg.eigvalsh(exact_hessian(_embedding_model(False), loss_fn, (ids, y))).flip(0)[:2]
    out = sharpness(_embedding_model(True), loss_fn, (ids, y), k=2, tol=1e-10)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)


def test_adam_before_its_first_step_has_no_preconditioner_and_says_so():
    model, loss_fn, batch = mlp_problem(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    out = sharpness(model, loss_fn, batch, optimizer=opt, dtype=torch.float64)
    assert out["threshold"] is None and not out["preconditioned"] and "before its first step" in out["reason"]
    exact = torch.linalg.eigvalsh(-exact_hessian(model, loss_fn, batch))[-1]  # maximizing: −H, not H
    opt = torch.optim.Adam(model.parameters(), lr=0.01, maximize=True)
    out = sharpness(model, loss_fn, batch, optimizer=opt, tol=1e-10)
    assert out["eigenvalues"][0] == pytest.approx(float(exact), rel=1e-6)


def test_a_fused_adam_state_left_at_t_0_by_a_skipped_step_has_no_preconditioner():
    """torch's fused AdamW called by a GradScaler on non-finite gradients creates its state and leaves t = 0,
    v = 0: no v̂ yet, so H (the exact Hessian's top) and the reason, not a division by 1 − β2⁰ = 0."""
    model, loss_fn, batch = mlp_problem(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    scaler.scale(loss_fn(model, batch) * math.inf).backward()
    scaler.step(opt)
    assert all(float(opt.state[p]["step"]) == 0 for p in model.parameters())  # the premise
    out = sharpness(model, loss_fn, batch, optimizer=opt, tol=1e-10)
    assert not out["preconditioned"] and "before its first step" in out["reason"]
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch))[-1]
    assert out["eigenvalues"][0] == pytest.approx(float(exact), rel=1e-6)


class Quadratic(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.theta = nn.Parameter(torch.randn(n, dtype=torch.float64))


def quadratic(spectrum, seed=0):
    """L(θ) = ½ θᵀ Q diag(spectrum) Qᵀ θ with a random orthogonal Q: H's eigenvalues are ``spectrum``."""
    g = torch.Generator().manual_seed(seed)
    n = len(spectrum)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    A = q @ torch.diag(torch.tensor(spectrum, dtype=torch.float64)) @ q.T
    torch.manual_seed(seed)
    return Quadratic(n), (lambda m, batch: 0.5 * m.theta @ batch @ m.theta), A


def test_quadratic_with_a_known_spectrum_and_a_warm_start_that_pays():
    spectrum = [10.0, 7.0, 5.0] + torch.linspace(-3, 2, 197).tolist()
    model, loss_fn, A = quadratic(spectrum)
    cold = sharpness(model, loss_fn, A, k=3, tol=1e-8)
    assert cold["eigenvalues"] == pytest.approx([10.0, 7.0, 5.0], rel=1e-6)
    assert cold["residuals"][0] <= 1e-8
    warm = sharpness(model, loss_fn, A, k=1, tol=1e-8, init=cold["vector"])
    assert warm["eigenvalues"][0] == pytest.approx(10.0, rel=1e-9)
    assert warm["hvps"] <= 2 < cold["hvps"]


def test_hvp_matches_the_exact_hessian_times_a_vector():
    model, loss_fn, batch = mlp_problem(2)
    op = HessianOperator(model, loss_fn, batch)
    v = torch.randn(op.size, dtype=torch.float64)
    torch.testing.assert_close(op(v), exact_hessian(model, loss_fn, batch) @ v, rtol=1e-9, atol=1e-12)
    assert op.hvps == 1


def test_directions_in_the_start_block_give_their_exact_curvature_and_do_not_disturb_the_eigenvalues():
    """``along``: dᵀHd/dᵀPd for each direction from the exact Hessian and a hand-built Adam P, the same
    top eigenvalues as without, and a direction parallel to another (SGD's update ∥ its gradient) or zero
    costs nothing extra and breaks nothing."""
    model, loss_fn, batch, opt = adam_problem()
    H = exact_hessian(model, loss_fn, batch)
    P = adam_scaling(model, opt) ** -2
    gen = torch.Generator().manual_seed(5)
    d = {id(p): torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in model.parameters()}
    flat = torch.cat([d[id(p)].reshape(-1) for p in model.parameters()])
    model.zero_grad()
    loss_fn(model, batch).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    twice = {key: 2 * t for key, t in d.items()}
    zero = {key: torch.zeros_like(t) for key, t in d.items()}
    along = {"update": d, "gradient": "gradient", "parallel": twice, "zero": zero}
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10, along=along)
    plain = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10)
    assert out["eigenvalues"] == pytest.approx(plain["eigenvalues"], rel=1e-8)
    for name, v in (("update", flat), ("gradient", g), ("parallel", 2 * flat)):
        exact = float(v @ H @ v / (v @ (P * v)))
        assert out["along"][name]["curvature"] == pytest.approx(exact, rel=1e-9), name
        assert out["along"][name]["ratio"] == pytest.approx(exact / (38 / 0.01), rel=1e-9)
    assert math.isnan(out["along"]["zero"]["curvature"])


def test_in_float32_a_direction_parallel_to_another_is_dropped_from_the_search_not_added_as_noise():
    """SGD's update is −η times its gradient: in float32 the second leaves only rounding outside the span of
    the first, which added to the search space filled it with magnified rounding (no convergence in 100
    products, eigenvalues 0.06 % off; passing the gradient twice, 3 %). Both now meet the exact float64
    Hessian's top-2 (the oracle) as the search without directions does, with their curvature still given."""
    model64, loss_fn, batch64 = mlp_problem(3)
    model = copy.deepcopy(model64).float()
    batch = tuple(t.float() for t in batch64)
    exact = torch.linalg.eigvalsh(exact_hessian(model64, loss_fn, batch64)).flip(0)[:2].tolist()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.zero_grad()
    loss_fn(model, batch).backward()
    update = {id(p): -0.1 * p.grad for p in model.parameters()}
    plain = sharpness(model, loss_fn, batch, opt, k=2)
    for along in ({"update": update, "gradient": "gradient"}, {"gradient": "gradient", "again": "gradient"}):
        out = sharpness(model, loss_fn, batch, opt, k=2, along=along)
        assert out["converged"] and out["hvps"] <= plain["hvps"] + 2
        assert out["eigenvalues"] == pytest.approx(exact, rel=1e-4)
        first, second = out["along"].values()
        assert second["curvature"] == pytest.approx(first["curvature"], rel=1e-4)


def test_a_parameter_the_loss_ignores_or_enters_linearly_has_zero_curvature():
    """H has a zero row and column for a parameter the loss does not use and for one it adds linearly."""

    class Partly(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
            self.shift = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))  # enters linearly
            self.unused = nn.Parameter(torch.ones(3, dtype=torch.float64))

    def loss_fn(m, x):
        return ((x @ m.w) ** 2).mean() + m.shift

    model = Partly()
    x = torch.randn(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    op = HessianOperator(model, loss_fn, x)
    v = torch.randn(op.size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = torch.zeros(6, 6, dtype=torch.float64)
    exact[:2, :2] = 2 * x.T @ x / len(x)  # ∇²_w of mean((x·w)²)
    torch.testing.assert_close(op(v), exact @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.gradient()[2:], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))


def test_a_product_that_is_not_finite_ends_lanczos_with_nan_instead_of_an_error():
    """A model that diverged: the second product is NaN, so there is no spectrum to report."""
    A = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    products = []

    def matvec(v):
        products.append(v)
        return A @ v if len(products) < 2 else torch.full_like(v, math.nan)

    out = lanczos(matvec, torch.ones(3, dtype=torch.float64), tol=1e-12)
    assert len(products) == 2 and not out.converged
    assert math.isnan(out.eigenvalues[0]) and math.isnan(out.residuals[0])


def test_a_zero_start_vector_costs_no_product_and_steps_counts_the_products():
    A = torch.diag(torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=torch.float64))
    products = []

    def matvec(v):
        products.append(v)
        return A @ v

    start = torch.stack([torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)])
    out = lanczos(matvec, start, tol=1e-12)
    assert out.converged and out.eigenvalues[0] == pytest.approx(3.0, rel=1e-12)
    assert out.steps == len(products) and math.isnan(out.start_quotients[1])
    assert out.start_quotients[0] == pytest.approx(6.5 / 4, rel=1e-12)  # 1ᵀA1 / 1ᵀ1


def test_a_tolerance_below_the_rounding_floor_stops_at_the_floor_not_at_max_steps():
    """Products that carry an error of 1e-5 relative (a float32 model's rounding, ~√n·ε) cannot take the
    residual to 1e-10: Lanczos stops, unconverged, soon after its residual stalls there, with λ₁ as good as
    the products allow; the same operator without the error converges in float64 as asked."""
    n = 400
    spectrum = torch.cat([torch.tensor([10.0, 9.0, 8.0]), torch.linspace(-3.0, 6.0, n - 3)]).double()
    basis, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    A = basis @ torch.diag(spectrum) @ basis.T
    noise = torch.Generator().manual_seed(1)

    def rounded(v):
        exact = (A @ v.double()).float()
        return exact + 1e-5 * exact.norm() * torch.randn(n, generator=noise) / n**0.5

    start = torch.ones(n)
    out = lanczos(rounded, start, tol=1e-10, max_steps=300)
    assert not out.converged and out.residuals[0] > 1e-10
    assert out.steps < 100  # not max_steps (300), nor n
    assert out.eigenvalues[0] == pytest.approx(10.0, rel=1e-4)
    exact = lanczos(lambda v: A @ v, start.double(), tol=1e-10, max_steps=300)
    assert exact.converged and exact.eigenvalues[0] == pytest.approx(10.0, rel=1e-12)


def test_adam_at_learning_rate_zero_is_preconditioned_as_at_any_other():
    """P = diag(√v̂ + ε) does not depend on η: a warm-up from η = 0 measures λ(P⁻¹H) against the hand-built
    P, with no threshold (every curvature is stable at η = 0) instead of NaN."""
    model, loss_fn, batch, opt = adam_problem()
    d = adam_scaling(model, opt)
    exact = float(torch.linalg.eigvalsh(d[:, None] * exact_hessian(model, loss_fn, batch) * d[None, :])[-1])
    for group in opt.param_groups:
        group["lr"] = 0.0
    out = sharpness(model, loss_fn, batch, opt, tol=1e-10)
    assert out["preconditioned"] and out["eigenvalues"][0] == pytest.approx(exact, rel=1e-8)
    assert out["threshold"] is None and "lr=0.0" in out["reason"]


class WithUnusedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2))
        self.unused_head = nn.Linear(6, 4)

    def forward(self, x):
        return self.body(x)


def unused_head_problem():
    """A float64 MLP body beside a head its loss never uses, after 3 steps of torch.optim.Adam (at 0.01) over
    both: (model, loss_fn, batch, opt). Adam never stepped the head: no state for it."""
    _, loss_fn, batch = mlp_problem(4)
    torch.manual_seed(4)
    model = WithUnusedHead().double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    return model, loss_fn, batch, opt


def test_the_hessian_is_over_the_parameters_the_optimizer_moves():
    """A head the loss never uses gets no gradient, so Adam never steps it and has no state for it: the
    preconditioned sharpness is taken over the rest (the exact D H D of their block), not dropped for H.
    Parameters outside an SGD's groups are likewise left out of its H."""

    model, loss_fn, batch, opt = unused_head_problem()
    n = sum(p.numel() for p in model.body.parameters())
    H = exact_hessian(model, loss_fn, batch)[:n, :n]  # the body's parameters come first
    d = adam_scaling(model.body, opt)
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10)
    assert out["preconditioned"] and out["threshold"] == pytest.approx(38 / 0.01)
    expected = torch.linalg.eigvalsh(d[:, None] * H * d[None, :]).flip(0)[:2]
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), expected, rtol=1e-8, atol=0)
    sgd = torch.optim.SGD(model.body[2].parameters(), lr=0.1)  # the last layer only
    last = exact_hessian(model, loss_fn, batch)[n - 14 : n, n - 14 : n]
    out = sharpness(model, loss_fn, batch, sgd, tol=1e-10)
    assert out["eigenvalues"][0] == pytest.approx(float(torch.linalg.eigvalsh(last)[-1]), rel=1e-8)
    with pytest.raises(ValueError, match="none of the SGD's parameters that require grad is a parameter of the model"):
        sharpness(model, loss_fn, batch, torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.1)])
def test_an_optimizer_of_a_frozen_model_is_said_to_move_nothing_not_to_be_another_models(make):
    """The model's own optimizer with every parameter frozen (``requires_grad_(False)``): the error says they are
    frozen; it said the optimizer was another model's ("give the optimizer that trains this model")."""
    model, loss_fn, batch = mlp_problem(0)
    opt = make(model.parameters())
    model.requires_grad_(False)
    name = type(opt).__name__
    for measure in (
        lambda: sharpness(model, loss_fn, batch, opt),
        lambda: directional_curvature(model, loss_fn, batch, optimizer=opt),
    ):
        with pytest.raises(
            ValueError, match=rf"^curvature: every parameter of the {name} is frozen \(requires_grad False\)"
        ):
            measure()


def test_a_direction_over_every_named_parameter_counts_those_h_is_not_taken_over_as_0():
    """A direction keyed by every name of ``model.named_parameters()``, where Adam never stepped an unused head
    (no state: H is over the body) or a bias is frozen: those entries count as 0, as they do keyed by id(param),
    against the exact dᵀHd/dᵀPd of the body (the oracle). It said "'unused_head.weight' is not a trainable
    parameter". A name that is no parameter of the model is still refused."""

    model, loss_fn, batch, opt = unused_head_problem()
    gen = torch.Generator().manual_seed(0)
    direction = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in model.named_parameters()}
    n = sum(p.numel() for p in model.body.parameters())
    H = exact_hessian(model, loss_fn, batch)[:n, :n]  # the body's parameters come first
    d = torch.cat([direction[name].reshape(-1) for name, _ in model.named_parameters()])[:n]
    p_diag = adam_scaling(model.body, opt) ** -2
    expected = float(d @ H @ d / (d @ (p_diag * d)))
    out = directional_curvature(model, loss_fn, batch, direction, opt)
    assert out["preconditioned"] and out["curvature"] == pytest.approx(expected, rel=1e-8)
    along = sharpness(model, loss_fn, batch, opt, along={"d": direction})["along"]["d"]["curvature"]
    assert along == pytest.approx(expected, rel=1e-8)
    frozen, loss_fn, batch = mlp_problem(0)
    frozen[0].bias.requires_grad_(False)
    direction = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in frozen.named_parameters()}
    H = exact_hessian(frozen, loss_fn, batch)
    d = torch.cat([direction[name].reshape(-1) for name, _ in frozen.named_parameters()])
    keep = torch.ones_like(d, dtype=torch.bool)
    keep[18:24] = False  # 0.bias: 3·6 weights come first
    d, H = d[keep], H[keep][:, keep]
    out = directional_curvature(frozen, loss_fn, batch, direction)
    assert out["curvature"] == pytest.approx(float(d @ H @ d / (d @ d)), rel=1e-8)
    with pytest.raises(ValueError, match=r"^curvature: 'body.9.weight' is not a parameter of the model; names:"):
        directional_curvature(model, loss_fn, batch, {"body.9.weight": torch.ones(2)}, opt)


def test_the_search_settings_are_checked_against_the_problem():
    model, loss_fn, batch = mlp_problem(0)
    n = sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match=rf"k={n + 1} exceeds the {n} parameters H is taken over"):
        sharpness(model, loss_fn, batch, k=n + 1)
    with pytest.raises(ValueError, match="max_hvps=0 must be an integer >= k=1"):
        sharpness(model, loss_fn, batch, max_hvps=0)
    with pytest.raises(ValueError, match=r"tol=5 must be a number in \(0, 1\)"):
        sharpness(model, loss_fn, batch, tol=5)
    # k beyond the parameters is said as such, not blamed on max_hvps (which k=n+1 also exceeds)
    with pytest.raises(ValueError, match=rf"k={n + 1} exceeds the {n} parameters"):
        sharpness(model, loss_fn, batch, k=n + 1, max_hvps=3)
    for bad in ("a", True, 1.5, 2**64):
        with pytest.raises(
            ValueError, match=rf"seed={bad!r} must be an integer from -2\*\*63 to 2\*\*64 - 1 \(a random seed\)"
        ):
            sharpness(model, loss_fn, batch, seed=bad)
    with pytest.raises(TypeError, match="init is a str; give the previous call's vector"):
        sharpness(model, loss_fn, batch, init="x")
    with pytest.raises(ValueError, match="along='gradient'; give a dict naming directions"):
        sharpness(model, loss_fn, batch, along="gradient")
    with pytest.raises(ValueError, match="the direction's '0.weight' is a float; give a tensor per parameter"):
        sharpness(model, loss_fn, batch, along={"update": {"0.weight": 1.0}})
    with pytest.raises(TypeError, match="model=None is not a torch.nn.Module"):
        sharpness(None, loss_fn, batch)
    with pytest.raises(TypeError, match="model=None is not a torch.nn.Module"):  # an optimizer's check comes first
        sharpness(None, loss_fn, batch, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="loss_fn=None is not a function"):
        sharpness(model, None, batch)


def test_a_warm_start_of_another_size_is_said_and_a_random_start_taken():
    """A vector of another problem (or of parameters the optimizer no longer moves alone) cannot warm-start this
    one: a warning says so, and the result is a cold start's (the exact Hessian's top eigenvalue)."""
    model, loss_fn, batch = mlp_problem(0)
    exact = float(torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch))[-1])
    with pytest.warns(UserWarning, match=r"init has 5 entries, but H is taken over 38 parameters"):
        out = sharpness(model, loss_fn, batch, init=torch.ones(5), tol=1e-8)
    assert out["eigenvalues"][0] == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize(
    ("spectrum", "k", "expected"),
    [
        ([5.0, 5.0, 3.0] + [1.0 - i / 20 for i in range(17)], 2, [5.0, 5.0]),  # a repeated top eigenvalue
        ([5.0, 5.0, 5.0] + [1.0 - i / 20 for i in range(17)], 3, [5.0, 5.0, 5.0]),
        ([0.0] * 20, 2, [0.0, 0.0]),  # H = 0
        ([4.0] + [0.0] * 19, 3, [4.0, 0.0, 0.0]),  # rank one
    ],
    ids=["double", "triple", "zero", "rank-one"],
)
def test_repeated_and_zero_eigenvalues_are_found_k_times(spectrum, k, expected):
    """A single start vector sees one vector of each eigenspace, and a Krylov space of a rank-deficient H
    closes early: the k − 1 random start vectors and the restart in the complement give all k, converged,
    with residuals judged against the spectrum's scale where an eigenvalue is zero."""
    model, loss_fn, A = quadratic(spectrum, seed=3)
    out = sharpness(model, loss_fn, A, k=k, tol=1e-8)
    assert out["converged"] and len(out["eigenvalues"]) == k
    assert out["eigenvalues"] == pytest.approx(expected, abs=1e-9)
    assert max(out["residuals"]) < 1e-5  # a zero eigenvalue's residual is rounding over the spectrum's ε^(2/3)


def test_a_learnable_weight_of_the_loss_that_the_optimizer_moves_is_in_h():
    """The loss scales the model's output by a learnable ``scale`` the model does not hold; the optimizer moves
    both. H is over both (it was over the model's alone, a principal block whose top eigenvalue is at most the
    whole's): against the exact Hessian over the joined flat vector, preconditioned by torch.optim.Adam's
    state built by hand, and gᵀHg/gᵀg along the joined gradient."""
    model, _, batch = mlp_problem(4)
    scale = nn.Parameter(torch.tensor([1.5, 0.5], dtype=torch.float64))

    def loss_fn(m, b):
        return nn.functional.mse_loss(m(b[0]) * scale, b[1])

    opt = torch.optim.Adam([*model.parameters(), scale], lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    params = dict(model.named_parameters())
    sizes = [p.numel() for p in params.values()]

    def joined(flat):
        *parts, s = torch.split(flat, [*sizes, scale.numel()])
        theta = {n: t.view(p.shape) for (n, p), t in zip(params.items(), parts, strict=True)}
        return nn.functional.mse_loss(torch.func.functional_call(model, theta, (batch[0],)) * s, batch[1])

    flat = torch.cat([p.detach().reshape(-1) for p in [*params.values(), scale]])
    H, g = torch.func.hessian(joined)(flat), torch.func.grad(joined)(flat)
    d = torch.cat([adam_scaling(model, opt), adam_scaling(_Holding(scale), opt)])
    exact = torch.linalg.eigvalsh(d[:, None] * H * d[None, :]).flip(0)[:3]
    out = sharpness(model, loss_fn, batch, optimizer=opt, k=3, tol=1e-10)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    plain = torch.optim.SGD([*model.parameters(), scale], lr=0.01)
    along = directional_curvature(model, loss_fn, batch, "gradient", optimizer=plain)
    assert along["curvature"] == pytest.approx(float(g @ H @ g / (g @ g)), rel=1e-9)


class _Holding(nn.Module):
    """A module whose one parameter is ``tensor`` (for ``adam_scaling``)."""

    def __init__(self, tensor):
        super().__init__()
        self.tensor = tensor


def test_a_float64_measurement_says_that_a_float32_weight_outside_the_model_stays_float32():
    model, _, batch = mlp_problem(4)
    model, batch = model.float(), tuple(t.float() for t in batch)
    scale = nn.Parameter(torch.tensor([1.5, 0.5]))

    def loss_fn(m, b):
        return nn.functional.mse_loss(m(b[0]) * scale, b[1])

    opt = torch.optim.SGD([*model.parameters(), scale], lr=0.01)
    with pytest.warns(UserWarning, match=r"moves 1 tensor\(s\) outside it \(torch.float32\).*as precise as their"):
        sharpness(model, loss_fn, batch, optimizer=opt, dtype=torch.float64)


@pytest.mark.parametrize("wrap", [nn.DataParallel, torch.compile])
def test_a_direction_keyed_by_the_wrapped_models_own_names_is_taken(wrap):
    """A direction read from the wrapper's own named_parameters() ("module.0.weight" under DataParallel,
    "_orig_mod.0.weight" under torch.compile) names the parameters the wrapper holds: its curvature is dᵀHd/dᵀd
    of the exact Hessian, as keyed by the inner model's names."""
    model, loss_fn, batch = mlp_problem(3)
    wrapped = wrap(model)
    gen = torch.Generator().manual_seed(7)
    d = {n: torch.randn(p.shape, generator=gen, dtype=p.dtype) for n, p in wrapped.named_parameters()}
    assert all(not n.startswith("0.") for n in d)  # the wrapper's prefixed names
    flat = torch.cat([t.reshape(-1) for t in d.values()])
    exact = float(flat @ exact_hessian(model, loss_fn, batch) @ flat / (flat @ flat))
    assert directional_curvature(wrapped, loss_fn, batch, d)["curvature"] == pytest.approx(exact, rel=1e-9)
    out = sharpness(wrapped, loss_fn, batch, along={"update": d}, tol=1e-8)
    assert out["along"]["update"]["curvature"] == pytest.approx(exact, rel=1e-9)


def test_an_adam_inside_accelerates_wrapper_is_measured_as_the_adam_it_wraps():
    """🤗 Accelerate's ``AcceleratedOptimizer`` forwards param_groups and state but is no Adam by type: the
    sharpness is still λ(P⁻¹H) with P from the wrapped torch.optim.Adam's state (eig(D H D), D and H by hand)
    against its 38/η, not λ(H) with no threshold."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    model, loss_fn, batch, opt = adam_problem()
    try:
        wrapped = accelerate.Accelerator(cpu=True).prepare_optimizer(opt)
        assert type(wrapped).__name__ == "AcceleratedOptimizer" and not isinstance(wrapped, torch.optim.Adam)
        D = adam_scaling(model, opt)
        exact = torch.linalg.eigvalsh(D[:, None] * exact_hessian(model, loss_fn, batch) * D[None, :]).flip(0)
        out = sharpness(model, loss_fn, batch, wrapped, k=2, tol=1e-10)
        assert out["preconditioned"] and out["threshold"] == pytest.approx(38 / 0.01, rel=1e-9)
        assert out["eigenvalues"] == pytest.approx(exact[:2].tolist(), rel=1e-8)
        d = {id(p): torch.randn_like(p) for p in model.parameters()}
        flat = torch.cat([d[id(p)].reshape(-1) for p in model.parameters()])
        want = float(flat @ exact_hessian(model, loss_fn, batch) @ flat / (flat @ (D**-2 * flat)))
        assert directional_curvature(model, loss_fn, batch, d, wrapped)["curvature"] == pytest.approx(want, rel=1e-9)
    finally:  # the accelerator's state is global: leave none for other tests
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def test_bad_seeds_and_search_settings_are_refused_naming_what_is_valid():
    """A seed torch's generators cannot take is an integer all the same: the error says which are valid; the
    exported ``lanczos`` refuses a bool k, a tolerance that is not a number and a fractional max_steps in one
    line each (they used to pass as k = 1, or fail deep inside with a TypeError of the comparison)."""
    from optiscope.curvature import hessian_trace

    model, loss_fn, batch = mlp_problem(0)
    valid = r"must be an integer from -2\*\*63 to 2\*\*64 - 1 \(a random seed\)"
    with pytest.raises(ValueError, match=rf"^sharpness: seed=18446744073709551616 {valid}$"):
        sharpness(model, loss_fn, batch, seed=2**64)
    with pytest.raises(ValueError, match=rf"^hessian_trace: seed=-9223372036854775809 {valid}$"):
        hessian_trace(model, loss_fn, batch, seed=-(2**63) - 1)

    def matvec(v):
        return 2 * v

    start = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^lanczos: k=True must be an integer >= 1$"):
        lanczos(matvec, start, k=True)
    with pytest.raises(ValueError, match=r"^lanczos: tol='1e-3' must be a number > 0$"):
        lanczos(matvec, start, tol="1e-3")
    with pytest.raises(ValueError, match=r"^lanczos: max_steps=2.5 must be an integer >= 1$"):
        lanczos(matvec, start, max_steps=2.5)
    assert lanczos(matvec, start).eigenvalues == pytest.approx([2.0], rel=1e-12)
