"""The monitor is right for any torch.optim.Optimizer: its g, w, u, u/w and cos against the same figures measured
by hand around ``step()``, and its effective learning rate against the rate a real ``step()`` applied.

The optimizers of pytorch-optimizer and heavyball are tested where those libraries are installed (the ``zoo``
extra): heavyball's use up ``p.grad`` inside ``step()``, pytorch-optimizer's Schedule-Free AdamW divides it in
place there, so reading the gradient after the step recorded nothing (heavyball) or a gradient many times too large.
"""

import math
import warnings

import pytest
import torch
from torch import nn

from optiscope.monitor import Monitor
from support import needs_cuda


def problem(seed=0, bias=True):
    """A small regression in float64, whose gradients have no zero entries (without biases: matrices only)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 4, bias=bias), nn.Tanh(), nn.Linear(4, 2, bias=bias)).double()
    x, y = torch.randn(32, 5, dtype=torch.float64), torch.randn(32, 2, dtype=torch.float64)
    return model, (x, y)


def backward(model, data):
    x, y = data
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


def by_hand(before, grads, after):
    """g, w, u, u/w and cos(u, −g) of one tensor, from copies taken around ``step()``."""
    u = after - before
    g, w, un = float(grads.norm()), float(after.norm()), float(u.norm())
    return {"g": g, "w": w, "u": un, "u_over_w": un / w, "cos": float(-(u * grads).sum()) / (un * g)}


def optional(module, name):
    """``module.name`` of a library that may not be installed (the ``zoo`` extra): skipped without it."""

    def make(params):
        return getattr(pytest.importorskip(module), name)(params)

    return make


OPTIMIZERS = {
    "torch-sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "torch-adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "torch-adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "torch-nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2),
    "torch-radam": lambda ps: torch.optim.RAdam(ps, lr=1e-2),
    "torch-adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    "torch-rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
    "torch-adadelta": lambda ps: torch.optim.Adadelta(ps, lr=1.0),
    "torch-adamax": lambda ps: torch.optim.Adamax(ps, lr=1e-2),
    "torch-asgd": lambda ps: torch.optim.ASGD(ps, lr=1e-2),
    "torch-rprop": lambda ps: torch.optim.Rprop(ps, lr=1e-2),
    "torch-adafactor": lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
    "torch-muon": lambda ps: torch.optim.Muon(ps, lr=1e-2),  # matrices only: the model without biases
    "torch-lbfgs": lambda ps: torch.optim.LBFGS(ps, lr=0.1, max_iter=1),  # a closure, called once per step
    "pytorch_optimizer-schedulefree-adamw": optional("pytorch_optimizer", "ScheduleFreeAdamW"),
    "pytorch_optimizer-lion": optional("pytorch_optimizer", "Lion"),
    "heavyball-adamw": optional("heavyball", "AdamW"),
}


@pytest.mark.parametrize("closure", [False, True], ids=["backward-then-step", "step-with-closure"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizers_step_is_measured_as_by_hand_around_it(name, closure):
    """Every step measured (the first compares the gradients the step left with those it began with; the later
    ones rely on what it learnt), against copies of θ and g taken just before ``step()`` and θ just after."""
    if name == "torch-lbfgs" and not closure:
        pytest.skip("LBFGS steps only with a closure")
    model, data = problem(bias=name != "torch-muon")
    opt = OPTIMIZERS[name](model.parameters())
    monitor = Monitor(model, opt, every=1, sinks=[])
    params = dict(model.named_parameters())
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        if closure:
            # the gradients the closure computes inside step(), before the optimizer uses them: taken by hand
            grads = {}

            def compute(grads=grads):
                opt.zero_grad(set_to_none=True)
                loss = backward(model, data)
                grads.update({n: p.grad.detach().clone() for n, p in params.items()})
                return loss

            before = {n: p.detach().clone() for n, p in params.items()}
            loss = opt.step(compute)
        else:
            loss = backward(model, data)
            before = {n: p.detach().clone() for n, p in params.items()}
            grads = {n: p.grad.detach().clone() for n, p in params.items()}
            opt.step()
        record = monitor.step(loss)
        assert record is not None, f"{name}: step {monitor.step_count} was not measured"
        for n, p in params.items():
            expected = by_hand(before[n], grads[n], p.detach())
            got = record["params"][n]
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, monitor.step_count, n, key)
        total_g = math.sqrt(sum(float(g.norm()) ** 2 for g in grads.values()))
        assert record["grad_norm"] == pytest.approx(total_g, rel=1e-9)


def test_heavyballs_grad_consuming_step_is_recorded_at_every_measured_step_without_a_warning():
    """heavyball sets ``p.grad`` to None inside ``step()``: 40 steps at every=10 gave no record."""
    heavyball = pytest.importorskip("heavyball")
    model, data = problem()
    opt = heavyball.AdamW(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=10, sinks=[])
    records = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for _ in range(40):
            opt.zero_grad()
            loss = backward(model, data)
            opt.step()
            assert all(p.grad is None for p in model.parameters())  # what heavyball does: the oracle's premise
            records.append(monitor.step(loss))
    assert [r["step"] for r in records if r is not None] == [1, 10, 20, 30, 40]


def test_schedule_free_adamws_gradient_is_the_one_it_was_given_not_what_it_made_of_it():
    """Schedule-Free AdamW divides ``p.grad`` by √v̂ + ε in place: read after the step, g was many times too large."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    model, data = problem()
    opt = pytorch_optimizer.ScheduleFreeAdamW(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=[])
    for _ in range(3):
        opt.zero_grad()
        loss = backward(model, data)
        given = {n: float(p.grad.norm()) for n, p in model.named_parameters()}
        opt.step()
        left = {n: float(p.grad.norm()) for n, p in model.named_parameters()}
        record = monitor.step(loss)
        assert all(abs(left[n] / given[n] - 1) > 0.1 for n in given)  # the premise: it rewrote the gradient
        for n, g in given.items():
            assert record["params"][n]["g"] == pytest.approx(g, rel=1e-12)


class Consumer(torch.optim.Optimizer):
    """Plain gradient descent that rescales its gradient in place from its second step on, having left it alone
    at the first: what the monitor learnt at the first measured step no longer holds."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])
                if self.steps:
                    p.grad.mul_(3.0)
        self.steps += 1


def test_an_optimizer_that_starts_writing_into_its_gradients_loses_one_cosine_then_is_copied():
    """The version counter tells the monitor the gradient it kept was written into: that step's cosine is NaN
    (unknowable without a copy), not a wrong number, and every later measured step copies."""
    model, data = problem()
    opt = Consumer(model.parameters(), lr=0.05)
    monitor = Monitor(model, opt, every=1, sinks=[])
    coss = []
    for _ in range(3):
        opt.zero_grad()
        loss = backward(model, data)
        opt.step()
        coss.append(monitor.step(loss)["params"]["0.weight"]["cos"])
    assert coss[0] == pytest.approx(1.0) and math.isnan(coss[1]) and coss[2] == pytest.approx(1.0)


def test_a_step_with_no_gradient_warns_once_saying_why():
    model, data = problem()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=[])
    with pytest.warns(UserWarning, match=r"step 1 began with no parameter holding a gradient") as caught:
        for _ in range(3):
            opt.step()
            assert monitor.step(1.0) is None
    assert len([w for w in caught if "no parameter holding a gradient" in str(w.message)]) == 1
    backward(model, data)
    opt.step()
    assert monitor.step(1.0) is not None


# ---------------------------------------------------------------------------------------- effective lr
def nadam_direction(opt, p, g):
    """The direction torch's NAdam applied: its blend of g and m, from the step's μₜ, μₜ₊₁ and Πμ."""
    group, state = opt.param_groups[0], opt.state[p]
    t, beta1, psi = float(state["step"]), group["betas"][0], group["momentum_decay"]
    mu = beta1 * (1 - 0.5 * 0.96 ** (t * psi))
    mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
    product = float(state["mu_product"])
    return (1 - mu) / (1 - product) * g + mu_next / (1 - product * mu_next) * state["exp_avg"]


def corrected_momentum(opt, p, g):
    """m̂ = m/(1 − β₁ᵗ): the direction of Adam, AdamW, RAdam and Adamax."""
    state, beta1 = opt.state[p], opt.param_groups[0]["betas"][0]
    return state["exp_avg"] / (1 - beta1 ** float(state["step"]))


def gradient(opt, p, g):
    return g


#: optimizer, the direction its step applies (from its state after the step and the gradient before it), and
#: the weight decay applied apart from that direction (AdamW's θ ← (1 − ηλ)θ)
RATES = {
    "adam": (lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.95)), corrected_momentum, 0.0),
    "adam-amsgrad": (lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True), corrected_momentum, 0.0),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), corrected_momentum, 0.1),
    "nadam": (lambda ps: torch.optim.NAdam(ps, lr=1e-2), nadam_direction, 0.0),
    "radam": (lambda ps: torch.optim.RAdam(ps, lr=1e-2), corrected_momentum, 0.0),
    "adamax": (lambda ps: torch.optim.Adamax(ps, lr=1e-2), corrected_momentum, 0.0),
    "rmsprop": (lambda ps: torch.optim.RMSprop(ps, lr=1e-3), gradient, 0.0),
    "rmsprop-centered": (lambda ps: torch.optim.RMSprop(ps, lr=1e-3, centered=True), gradient, 0.0),
    "adagrad": (lambda ps: torch.optim.Adagrad(ps, lr=1e-2, lr_decay=0.1), gradient, 0.0),
    "adam-foreach": (lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True), corrected_momentum, 0.0),
    "radam-foreach": (lambda ps: torch.optim.RAdam(ps, lr=1e-2, foreach=True), corrected_momentum, 0.0),
}


@pytest.mark.parametrize("name", list(RATES))
def test_the_effective_learning_rate_is_the_rate_the_step_applied(name):
    """Δθ / (−direction), element by element, around each of 8 real steps (RAdam's first 5 unrectified, at η;
    its 6th on rectified): its min, median and max are the record's."""
    make, direction, decay = RATES[name]
    model, data = problem()
    opt = make(model.parameters())
    monitor = Monitor(model, opt, every=1, sinks=[])
    for _ in range(8):
        opt.zero_grad()
        loss = backward(model, data)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        record = monitor.step(loss)
        for n, p in model.named_parameters():
            lr = opt.param_groups[0]["lr"]
            applied = (p.detach() - before[n] * (1 - lr * decay)) / -direction(opt, p, grads[n])
            got = record["params"][n]["eff_lr"]
            step = monitor.step_count
            assert got["min"] == pytest.approx(float(applied.min()), rel=1e-7), (step, n)
            assert got["median"] == pytest.approx(float(applied.flatten().median()), rel=1e-7), (step, n)
            assert got["max"] == pytest.approx(float(applied.max()), rel=1e-7), (step, n)


def test_rmsprop_with_momentum_gives_the_rate_that_enters_its_buffer():
    """With momentum μ, torch's RMSprop takes b ← μb + g/(√v + ε), θ ← θ − ηb: the rate is η (b − μ b_before)/g."""
    model, data = problem()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.5)
    monitor = Monitor(model, opt, every=1, sinks=[])
    for _ in range(3):
        opt.zero_grad()
        loss = backward(model, data)
        p = model[0].weight
        buffer = opt.state[p]["momentum_buffer"].clone() if p in opt.state else torch.zeros_like(p)
        g = p.grad.detach().clone()
        opt.step()
        applied = 1e-3 * (opt.state[p]["momentum_buffer"] - 0.5 * buffer) / g
        got = monitor.step(loss)["params"]["0.weight"]["eff_lr"]
        assert got["min"] == pytest.approx(float(applied.min()), rel=1e-7)
        assert got["max"] == pytest.approx(float(applied.max()), rel=1e-7)


class AdamWithItsOwnStep(torch.optim.Adam):
    """A torch Adam with a ``step`` of its own (sign descent that keeps Adam's second moment): optiscope cannot
    know what an override does, so it does not guess from the state."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = state.get("step", 0) + 1
                state.setdefault("exp_avg_sq", torch.zeros_like(p)).mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.add_(p.grad.sign(), alpha=-group["lr"])


class NamedAdam(torch.optim.Adam):
    """A subclass that keeps torch's Adam step: the rule holds."""


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1), "torch.optim.SGD: step rule not known to optiscope"),
        (lambda ps: torch.optim.Rprop(ps, lr=1e-2), "torch.optim.Rprop: step rule not known to optiscope"),
        (lambda ps: AdamWithItsOwnStep(ps, lr=1e-2), "AdamWithItsOwnStep: step rule not known to optiscope"),
        (optional("pytorch_optimizer", "ScheduleFreeAdamW"), "ScheduleFreeAdamW: step rule not known"),
        (optional("heavyball", "AdamW"), "heavyball.AdamW: step rule not known to optiscope"),
    ],
    ids=["torch-sgd", "torch-rprop", "adam-subclass-own-step", "schedule-free-adamw", "heavyball-adamw"],
)
def test_an_optimizer_whose_rule_optiscope_does_not_know_gets_no_effective_lr_and_a_reason(make, reason):
    """torch's RAdam reported Adam's η/(√v̂ + ε), 0.6, where it applied η = 0.01 (its first steps are not
    rectified); any optimizer with Adam-like state got Adam's rate."""
    model, data = problem()
    opt = make(model.parameters())
    monitor = Monitor(model, opt, every=1, sinks=[])
    for _ in range(2):
        opt.zero_grad()
        loss = backward(model, data)
        opt.step()
        record = monitor.step(loss)
    for entry in record["params"].values():
        assert "eff_lr" not in entry and reason in entry["no_eff_lr"]


def test_a_subclass_that_keeps_torchs_step_keeps_its_rule():
    model, data = problem()
    opt = NamedAdam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=[])
    backward(model, data)
    opt.step()
    record = monitor.step(1.0)
    # Adam's first step: v̂ = g², so the rate is η/(|g| + ε)
    g = model[0].weight.grad
    assert record["params"]["0.weight"]["eff_lr"]["max"] == pytest.approx(float(1e-2 / (g.abs().min() + 1e-8)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-adamw", "adamw"])
def test_under_a_grad_scaler_g_is_the_unscaled_gradient(device, fused):
    """A GradScaler unscales the gradients before a plain step, but hands a fused one its scale, and the kernel
    unscales them in .grad as it steps: read as the step begins, they are still 2¹⁰ times too large."""
    torch.manual_seed(0)
    model = nn.Linear(5, 3).to(device)
    x, y = torch.randn(16, 5, device=device), torch.randn(16, 3, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
    monitor = Monitor(model, opt, every=1, sinks=[])
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() / scaler.get_scale() for n, p in model.named_parameters()}
        scaler.step(opt)
        scaler.update()
        record = monitor.step(loss)
        for n, p in model.named_parameters():
            expected = by_hand(before[n].double(), grads[n].double(), p.detach().double())
            for key, value in expected.items():
                assert record["params"][n][key] == pytest.approx(value, rel=1e-5, abs=1e-9), (n, key)


def test_a_subclass_whose_step_calls_its_parents_is_measured_once_per_step():
    """torch runs a class's step hooks in every patched ``step`` of the chain: a subclass's ``super().step()``
    ran the monitor's twice, which counted two steps and lost the record. Measured against the step by hand."""

    class Sub(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch patches SGD.step on its first instance
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = Sub(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1)
    for step in (1, 2):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        before = model.weight.detach().clone()
        opt.step()
        record = monitor.step(1.0)
        assert record is not None and record["step"] == step
        assert record["params"]["weight"]["u"] == pytest.approx(float((model.weight.detach() - before).norm()))


def test_a_step_that_raised_does_not_keep_the_next_ones_from_being_measured():
    class Flaky(torch.optim.SGD):
        raised = False

        def step(self, closure=None):
            if not Flaky.raised:
                Flaky.raised = True
                raise RuntimeError("once")
            return super().step(closure)

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    model = torch.nn.Linear(3, 1)
    opt = Flaky(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1)
    model(torch.randn(4, 3)).pow(2).mean().backward()
    with pytest.raises(RuntimeError, match="once"):
        opt.step()
    before = model.weight.detach().clone()
    opt.step()
    record = monitor.step(1.0)
    assert record is not None and record["params"]["weight"]["u"] == pytest.approx(
        float((model.weight.detach() - before).norm())
    )


def test_sparse_adams_sparse_gradients_are_measured_as_by_hand():
    """torch's SparseAdam on an embedding with sparse gradients (rows not looked up have none)."""
    torch.manual_seed(0)
    model = nn.Embedding(10, 3, sparse=True).double()
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=[])
    ids, target = torch.tensor([1, 3, 3, 7]), torch.randn(4, 3, dtype=torch.float64)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(ids), target)
        loss.backward()
        before, grad = model.weight.detach().clone(), model.weight.grad.to_dense()
        opt.step()
        record = monitor.step(loss)
        expected = by_hand(before, grad, model.weight.detach())
        for key, value in expected.items():
            assert record["params"]["weight"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
