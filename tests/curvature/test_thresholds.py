"""Stability thresholds against their formulas, and against the dynamics themselves: on a quadratic,
the optimizer slightly above its threshold diverges and slightly below converges, and the instrument
flags ratio > 1 before the loss has moved."""

import pytest
import torch
from torch import nn

from optiscope import optim
from optiscope.curvature import sharpness, stability_threshold

LR = 0.05


def params():
    return [nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize(
    ("make", "expected", "preconditioned"),
    [
        (lambda: torch.optim.SGD(params(), lr=LR), 2 / LR, False),
        (lambda: optim.SGD(params(), lr=LR), 2 / LR, False),
        (lambda: torch.optim.SGD(params(), lr=LR, momentum=0.9), 3.8 / LR, False),
        (lambda: optim.SGD(params(), lr=LR, momentum=0.5, dampening=0.5), 3 / (0.5 * LR), False),
        (lambda: torch.optim.SGD(params(), lr=LR, momentum=0.9, nesterov=True), 3.8 / (2.8 * LR), False),
        (lambda: torch.optim.Adam(params(), lr=LR), 38 / LR, True),
        (lambda: torch.optim.AdamW(params(), lr=LR, betas=(0.8, 0.99)), 3.6 / (0.2 * LR), True),
        (lambda: optim.Adam(params(), lr=LR), 38 / LR, True),
        (lambda: optim.AdamW(params(), lr=LR, betas=(0.95, 0.999)), 3.9 / (0.05 * LR), True),
        (lambda: optim.AdamL2(params(), lr=LR, weight_decay=0.1), 38 / LR, True),
    ],
)
def test_thresholds_follow_the_formulas(make, expected, preconditioned):
    s = stability_threshold(make())
    assert s.threshold == pytest.approx(expected, rel=1e-12)
    assert s.preconditioned is preconditioned and s.reason is None


def test_the_threshold_follows_the_current_learning_rate():
    opt = torch.optim.Adam(params(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    assert stability_threshold(opt).threshold == pytest.approx(38 / (LR / 2))
    assert stability_threshold(opt).label == "38/η"


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.Lion(params(), lr=LR),
        lambda: optim.Muon([nn.Parameter(torch.zeros(3, 3))], lr=LR),
        lambda: optim.RMSprop(params(), lr=LR),
        lambda: torch.optim.RMSprop(params(), lr=LR),
    ],
)
def test_unknown_thresholds_are_none_with_a_reason(make):
    s = stability_threshold(make())
    assert s.threshold is None and "no known stability threshold" in s.reason


@pytest.mark.parametrize(
    ("make", "coef"),
    [
        (lambda groups: torch.optim.SGD(groups, lr=LR), 2.0),
        (lambda groups: optim.SGD(groups, lr=LR, momentum=0.9), 3.8),
        (lambda groups: torch.optim.AdamW(groups, lr=LR), 38.0),
    ],
)
def test_groups_at_different_learning_rates_share_the_threshold_at_the_largest(make, coef):
    """Groups at η and 2η: the threshold is c/η_max, labelled so, and bounds the preconditioned sharpness (SGD's
    P⁻¹ = diag(η_g/η_max)); the dynamics that check it are in ``test_sgd_groups_at_different_lrs_*``."""
    s = stability_threshold(make([{"params": params()}, {"params": params(), "lr": 2 * LR}]))
    assert s.threshold == pytest.approx(coef / (2 * LR), rel=1e-12)
    assert s.label == f"{coef:.3g}/η_max" and s.preconditioned is True and s.reason is None


class CoupledBowl(nn.Module):
    """L = ½ zᵀAz over z = (x, y), two parameters of two entries each, with an A that couples them: the
    threshold of groups at different lrs must see the lrs' ratio inside the coupled eigenproblem."""

    A = torch.tensor(
        [[4.0, 1.0, 1.5, 0.0], [1.0, 2.0, 0.0, 0.7], [1.5, 0.0, 4.0, 1.0], [0.0, 0.7, 1.0, 2.0]], dtype=torch.float64
    )

    def __init__(self):
        super().__init__()
        self.x = nn.Parameter(torch.ones(2, dtype=torch.float64))
        self.y = nn.Parameter(torch.ones(2, dtype=torch.float64))

    def loss(self, batch=None):
        z = torch.cat([self.x, self.y])
        return 0.5 * z @ self.A @ z


@pytest.mark.parametrize(("momentum", "nesterov"), [(0.0, False), (0.9, False), (0.9, True)])
@pytest.mark.parametrize("ratio_of_lrs", [0.25, 3.0])
def test_sgd_groups_at_different_lrs_diverge_just_above_the_threshold_and_converge_just_below(
    momentum, nesterov, ratio_of_lrs
):
    """torch.optim.SGD itself is the oracle: with x at η and y at η·r, the measured ratio ρ (sharpness over
    threshold) scales with η, so both lrs times 1.03/ρ diverge and times 0.97/ρ converge. The plain λ₁(A)
    against 2/η_max would misplace the edge (checked: it lies over 20 % from the measured one)."""

    def train(lrs, steps=1500):
        model = CoupledBowl()
        opt = torch.optim.SGD(
            [{"params": [model.x], "lr": lrs[0]}, {"params": [model.y], "lr": lrs[1]}],
            lr=lrs[0],
            momentum=momentum,
            nesterov=nesterov,
        )
        measured = sharpness(model, lambda m, b: m.loss(), None, opt, tol=1e-12)
        for _ in range(steps):
            opt.zero_grad()
            model.loss().backward()
            opt.step()
        return measured, float(model.loss().detach())

    base = (0.1, 0.1 * ratio_of_lrs)
    measured, _ = train(base, steps=0)
    assert measured["preconditioned"] and measured["label"].endswith("/η_max")
    rho = measured["ratio"]
    plain = float(torch.linalg.eigvalsh(CoupledBowl.A)[-1]) / measured["threshold"]
    assert plain / rho > 1.2
    for factor in (0.97, 1.03):
        again, final = train(tuple(lr * factor / rho for lr in base))
        assert again["ratio"] == pytest.approx(factor, rel=1e-9)
        assert (final > 1e6) == (factor > 1) and (final < 1e-6) == (factor < 1)


class Bowl(nn.Module):
    """L(θ) = ½ Σ λ_i θ_i² with λ = (4, 1, 0.25): sharpness 4."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.register_buffer("curv", torch.tensor([4.0, 1.0, 0.25], dtype=torch.float64))

    def loss(self):
        return 0.5 * (self.curv * self.theta**2).sum()


def bowl_loss(model, batch):
    return model.loss()


def run_torch_sgd(factor, momentum=0.0, nesterov=False, steps=400):
    """torch.optim.SGD at ``factor`` × our threshold for λ = 4: (sharpness ratio, losses)."""
    model = Bowl()
    probe = torch.optim.SGD(model.parameters(), lr=1.0, momentum=momentum, nesterov=nesterov)
    lr = factor * stability_threshold(probe).threshold / 4.0  # threshold ∝ 1/η: scale η so it lands at 4/factor
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=nesterov)
    ratio = sharpness(model, bowl_loss, None, optimizer=opt, tol=1e-10)["ratio"]
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model.loss()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return ratio, losses


@pytest.mark.parametrize(("momentum", "nesterov"), [(0.0, False), (0.9, False), (0.9, True)])
def test_slightly_above_the_threshold_diverges_and_slightly_below_converges(momentum, nesterov):
    ratio_hi, hi = run_torch_sgd(1.03, momentum, nesterov)
    ratio_lo, lo = run_torch_sgd(0.97, momentum, nesterov)
    assert ratio_hi == pytest.approx(1.03, rel=1e-9) and ratio_lo == pytest.approx(0.97, rel=1e-9)
    assert hi[-1] > 100 * hi[0] and lo[-1] < 1e-3 * lo[0]
    if momentum == 0:  # GD: flagged before the first step, while the loss has barely moved
        assert max(hi[:5]) < 2 * hi[0]


def test_a_tensor_learning_rate_is_read_as_its_value_and_a_frozen_group_does_not_count():
    """torch.optim takes lr as a tensor (for capturable / compiled steps): the threshold is a float, and two
    groups with equal tensors agree; a group of frozen parameters (at lr 0 here) moves nothing a step could
    destabilise, so it does not stand in the way of the others' single threshold."""
    opt = torch.optim.Adam([{"params": params()}, {"params": params(), "lr": torch.tensor(LR)}], lr=torch.tensor(LR))
    s = stability_threshold(opt)
    assert type(s.threshold) is float and s.threshold == pytest.approx(38 / LR)
    frozen = [nn.Parameter(torch.zeros(2), requires_grad=False)]
    opt = torch.optim.SGD([{"params": params()}, {"params": frozen, "lr": 0.0}], lr=LR)
    assert stability_threshold(opt).threshold == pytest.approx(2 / LR)
    # frozen by lr 0 alone (a common way to freeze): the same; with every group at lr 0, no threshold
    opt = torch.optim.SGD([{"params": params()}, {"params": params(), "lr": 0.0}], lr=LR)
    assert stability_threshold(opt).threshold == pytest.approx(2 / LR)
    opt = torch.optim.SGD([{"params": params(), "lr": 0.0}, {"params": params(), "lr": 0.0}], lr=LR)
    assert stability_threshold(opt).threshold is None and "lr=0.0" in stability_threshold(opt).reason


def test_something_that_is_not_an_optimizer_is_named():
    with pytest.raises(TypeError, match="stability_threshold: optimizer='sgd' is not an optimizer; give a torch"):
        stability_threshold("sgd")


def test_an_unused_head_in_a_group_of_its_own_does_not_count_for_adam():
    """torch.optim.Adam never moves a parameter that never had a gradient (it has no state: torch's own), so
    the lr of a group holding only such a head is not the lr of any step: the threshold is the used group's
    38/η, as the sharpness already leaves the head out of H. Once the head is trained, its group counts and
    the two lrs leave no single threshold."""
    body, head = nn.Linear(3, 1), nn.Linear(3, 1)
    opt = torch.optim.Adam([{"params": body.parameters(), "lr": LR}, {"params": head.parameters(), "lr": LR / 10}])
    x = torch.randn(8, 3)
    for _ in range(3):
        opt.zero_grad()
        (body(x) ** 2).mean().backward()
        opt.step()
    assert all(len(opt.state[p]) == 0 for p in head.parameters())  # torch's own record: never moved
    assert stability_threshold(opt).threshold == pytest.approx(38 / LR, rel=1e-12)
    model = nn.ModuleDict({"body": body, "head": head})
    out = sharpness(model, lambda m, b: (m["body"](b) ** 2).mean(), x, opt)
    assert out["threshold"] == pytest.approx(38 / LR, rel=1e-12) and out["reason"] is None
    opt.zero_grad()
    (head(x) ** 2).mean().backward()
    opt.step()
    trained = stability_threshold(opt)  # both groups move now: the threshold at the larger lr
    assert trained.threshold == pytest.approx(38 / LR, rel=1e-12) and trained.label == "38/η_max"


def test_an_optimizer_without_a_fixed_lr_gets_no_threshold_and_the_hessian_of_its_parameters():
    """🤗 transformers' Adafactor keeps lr=None in its groups (it computes a relative step itself): no
    threshold, with the reason, and the sharpness is λ₁(H) of the exact Hessian, not a TypeError from
    reading None as a number."""
    transformers = pytest.importorskip("transformers")
    from curvature_support import exact_hessian, mlp_problem

    model, loss_fn, batch = mlp_problem(0)
    opt = transformers.optimization.Adafactor(model.parameters())
    assert opt.param_groups[0]["lr"] is None
    s = stability_threshold(opt)
    assert s.threshold is None and s.reason == "no known stability threshold for Adafactor"
    out = sharpness(model, loss_fn, batch, opt, k=2, tol=1e-10)
    exact = torch.linalg.eigvalsh(exact_hessian(model, loss_fn, batch)).flip(0)[:2]
    assert out["eigenvalues"] == pytest.approx(exact.tolist(), rel=1e-8) and out["ratio"] is None


@pytest.mark.parametrize("dampening", [0.5, 0.9])
def test_heavy_ball_with_dampening_diverges_just_above_its_threshold_and_converges_just_below(dampening):
    """(2 + 2β)/((1 − τ)η) against torch.optim.SGD itself on ½·4θ²: at 1.03× of the sharpness it diverges, at
    0.97× it converges (torch's first step takes the undampened gradient, a transient the dynamics forget)."""
    final = {}
    for factor in (0.97, 1.03):
        theta = nn.Parameter(torch.ones(1, dtype=torch.float64))
        probe = torch.optim.SGD([theta], lr=1.0, momentum=0.9, dampening=dampening)
        lr = factor * stability_threshold(probe).threshold / 4.0
        opt = torch.optim.SGD([theta], lr=lr, momentum=0.9, dampening=dampening)
        for _ in range(1500):
            opt.zero_grad()
            (2 * theta**2).sum().backward()
            opt.step()
        final[factor] = float(theta.detach().abs())
    assert final[0.97] < 1e-6 and not final[1.03] < 1e6


def test_a_large_coefficient_is_labelled_without_an_exponent():
    """Adam at β₁ = 0.999: (2 + 2·0.999)/(1 − 0.999) = 3998, labelled "3998/η" (it read "4e+03/η")."""
    p = torch.nn.Parameter(torch.zeros(2))
    stability = stability_threshold(torch.optim.Adam([p], lr=0.1, betas=(0.999, 0.999)))
    assert stability.label == "3998/η" and stability.threshold == pytest.approx(3998 / 0.1)


@pytest.mark.parametrize(
    "second, said",
    [
        ({"nesterov": True}, "nesterov ([False, True])"),
        ({"dampening": 0.5}, "dampening ([0.0, 0.5])"),
        ({"lr": 0.2, "momentum": 0.5, "dampening": 0.1}, "momentum ([0.5, 0.9]) and dampening ([0.0, 0.1])"),
    ],
)
def test_sgd_groups_that_differ_get_no_threshold_and_the_reason_names_what_differs(second, said):
    """Two SGD groups whose steps differ in momentum, dampening or Nesterov have no single threshold; the
    reason says which of those differ (it said 'lr/momentum' when only nesterov or dampening did), and not the
    lr, which groups may differ in (the threshold is then at the largest)."""
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), **second}], lr=0.1, momentum=0.9)
    stability = stability_threshold(opt)
    assert stability.threshold is None
    assert stability.reason == f"SGD's param groups have different {said}; no single threshold"


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.1)])
def test_an_optimizer_of_frozen_parameters_has_no_threshold_and_says_why(make):
    """Every parameter frozen (requires_grad False): no group moves anything, so no threshold, with the reason
    (it raised IndexError)."""
    model = nn.Linear(2, 2)
    opt = make(model.parameters())
    model.requires_grad_(False)
    stability = stability_threshold(opt)
    assert stability.threshold is None and "moves no parameter" in stability.reason


def test_full_dampening_with_decoupled_decay_is_measured_not_divided_by_zero():
    """SGD(momentum=0.9, dampening=1) takes no gradient into its buffer after the first step: its threshold is
    infinite (no curvature can destabilise it), and decoupled decay, whose shift λ(1 + β)/(1 − τ) divided by
    1 − τ = 0 (a ZeroDivisionError), adds nothing to H's top eigenvalue, the exact one (the oracle). The dynamics
    agree: on ½·h θ² with η h 200 times SGD's 2 (and η λ = 1 < 2, what decay alone needs) it stays bounded."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    x, y = torch.randn(12, 3, dtype=torch.float64), torch.randn(12, 1, dtype=torch.float64)

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    features = torch.cat([x, torch.ones(12, 1, dtype=torch.float64)], 1)
    exact = float(torch.linalg.eigvalsh(2 * features.T @ features / 12)[-1])
    opt = optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, dampening=1.0, weight_decay=0.1, decoupled_weight_decay=True
    )
    out = sharpness(model, loss_fn, (x, y), opt, tol=1e-10)
    assert out["eigenvalues"][0] == pytest.approx(exact, rel=1e-8)
    assert out["threshold"] == float("inf") and out["ratio"] == 0.0
    theta = nn.Parameter(torch.ones(1, dtype=torch.float64))
    dyn = optim.SGD([theta], lr=100.0, momentum=0.9, dampening=1.0, weight_decay=0.01, decoupled_weight_decay=True)
    for _ in range(200):
        dyn.zero_grad()
        (2 * theta**2).sum().backward()
        dyn.step()
    assert float(theta.detach().abs()) < 1e6
