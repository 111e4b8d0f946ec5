"""optiscope.optim against torch.optim, side by side: every case runs torch's optimizer (the oracle) and ours.

What torch.optim 2.13 documents and does, ours must do too for the optimizers both have: named
parameters and named groups (``param_names`` in groups and state dicts), state dicts that load both
ways, a tensor ``lr`` (bit-for-bit the same steps where torch takes one), the warning for a parameter
listed twice, the same exception type for every argument torch rejects, and every scheduler of
``torch.optim.lr_scheduler``.
"""

from __future__ import annotations

import copy
import inspect
import io
import warnings

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as sched

from optiscope.optim import SGD, Adam, AdamW, Muon, RMSprop

# name -> (ours, torch's, hyperparameters). Muon updates matrices only, so its model has no biases.
PAIRS = {
    "sgd": (SGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd-momentum": (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "sgd-nesterov": (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "rmsprop": (RMSprop, torch.optim.RMSprop, dict(lr=1e-2, momentum=0.5, centered=True, weight_decay=1e-3)),
    "adam": (Adam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=1e-3)),
    "adamw": (AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "muon": (Muon, torch.optim.Muon, dict(lr=2e-2)),
}
# Where torch.optim takes a tensor lr on the CPU, by implementation (Adam refuses foreach=True with one).
TENSOR_LR_IMPLS = {
    "sgd": ["forloop", "foreach", "fused"],
    "sgd-momentum": ["forloop", "foreach", "fused"],
    "sgd-nesterov": ["forloop", "foreach", "fused"],
    "rmsprop": ["forloop", "foreach"],
    "adam": ["forloop", "fused"],
    "adamw": ["forloop", "fused"],
    "muon": ["default"],
}
IMPL = {"forloop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True), "default": {}}
RTOL = 1e-9  # float64 over 30 steps; ours and torch's may take different (equally exact) kernels


def model_for(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    bias = name != "muon"
    return nn.Sequential(nn.Linear(4, 6, bias=bias), nn.Tanh(), nn.Linear(6, 3, bias=bias)).double()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randn(16, 3, generator=g, dtype=torch.float64)


def named_groups(model: nn.Module) -> list[dict]:
    """Two named groups, the second with its own lr: the first layer, then the second."""
    return [
        {"params": list(model[0].named_parameters(prefix="0"))},
        {"params": list(model[2].named_parameters(prefix="2")), "lr": 3e-3},
    ]


def loss_of(model: nn.Module) -> torch.Tensor:
    x, y = batch()
    return nn.functional.mse_loss(model(x), y)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, scheduler=None, trace=None) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step(loss.item()) if isinstance(scheduler, sched.ReduceLROnPlateau) else scheduler.step()
        if trace is not None:
            trace.append([(float(g["lr"]), g.get("momentum"), g.get("betas")) for g in opt.param_groups])


def assert_same_params(a: nn.Module, b: nn.Module, rtol: float = RTOL) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=rtol, atol=rtol, msg=lambda m, name=name: f"{name}: {m}")


# ----------------------------------------------------------------------------- named parameters
@pytest.mark.parametrize("name", PAIRS)
def test_named_groups_step_and_save_names_like_torch(name):
    ours_cls, torch_cls, kw = PAIRS[name]
    mine, theirs = model_for(name), model_for(name)
    ours, ref = ours_cls(named_groups(mine), **kw), torch_cls(named_groups(theirs), **kw)
    train(mine, ours, 30)
    train(theirs, ref, 30)
    assert_same_params(mine, theirs)
    expected = [
        [n for n, _ in mine[0].named_parameters(prefix="0")],
        [n for n, _ in mine[2].named_parameters(prefix="2")],
    ]
    for i, (g, h) in enumerate(zip(ours.state_dict()["param_groups"], ref.state_dict()["param_groups"], strict=True)):
        assert g["param_names"] == h["param_names"] == expected[i]
        assert g["params"] == h["params"]
        assert ours.param_groups[i]["param_names"] == expected[i]


def test_named_parameters_of_a_whole_model_make_one_named_group():
    model = model_for("adam")
    ours, ref = Adam(model.named_parameters()), torch.optim.Adam(model.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert ours.param_groups[0]["param_names"] == ref.param_groups[0]["param_names"] == names
    assert all(p is q for p, q in zip(ours.param_groups[0]["params"], model.parameters(), strict=True))


@pytest.mark.parametrize("direction", ["torch->ours", "ours->torch"])
@pytest.mark.parametrize("name", PAIRS)
def test_state_dicts_load_both_ways(name, direction):
    """5 steps in one library, its state dict loaded into the other, 10 more steps in both."""
    ours_cls, torch_cls, kw = PAIRS[name]
    first_cls, second_cls = (torch_cls, ours_cls) if direction == "torch->ours" else (ours_cls, torch_cls)
    model = model_for(name)
    first = first_cls(named_groups(model), **kw)
    train(model, first, 5)
    twin = copy.deepcopy(model)
    second = second_cls(named_groups(twin), **kw)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)  # as a checkpoint would (torch's load would alias live tensors)
    saved.seek(0)
    second.load_state_dict(torch.load(saved))
    assert [g["param_names"] for g in second.param_groups] == [g["param_names"] for g in first.param_groups]
    assert [g["lr"] for g in second.param_groups] == [g["lr"] for g in first.param_groups]
    train(model, first, 10)
    train(twin, second, 10)
    assert_same_params(model, twin)


# ------------------------------------------------------------------------------------ tensor lr
@pytest.mark.parametrize(
    "name, impl", [(n, i) for n, impls in TENSOR_LR_IMPLS.items() for i in impls], ids=lambda x: str(x)
)
@pytest.mark.parametrize("lr_shape", [(), (1,)])
def test_tensor_lr_steps_bit_for_bit_like_torch(name, impl, lr_shape):
    """A float32 tensor lr (so η is not the double 0.01) through a scheduler that updates it in place."""
    ours_cls, torch_cls, kw = PAIRS[name]
    kw = {**kw, **IMPL[impl]}
    mine, theirs = model_for(name), model_for(name)
    lr = torch.full(lr_shape, 0.01)
    ours, ref = (
        ours_cls(mine.parameters(), **{**kw, "lr": lr.clone()}),
        torch_cls(theirs.parameters(), **{**kw, "lr": lr.clone()}),
    )
    trace_ours, trace_ref = [], []
    train(mine, ours, 12, sched.StepLR(ours, step_size=4, gamma=0.5), trace_ours)
    train(theirs, ref, 12, sched.StepLR(ref, step_size=4, gamma=0.5), trace_ref)
    assert trace_ours == trace_ref
    assert isinstance(ours.param_groups[0]["lr"], torch.Tensor) and ours.param_groups[0]["lr"].shape == lr_shape
    for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)


def test_tensor_lr_is_logged_as_a_number():
    from optiscope.monitor import Monitor

    model = model_for("sgd")
    opt = SGD(model.named_parameters(), lr=torch.tensor(0.05))
    with Monitor(model, opt, every=1) as monitor:
        loss = loss_of(model)
        loss.backward()
        opt.step()
        record = monitor.step(loss)
    assert record["lr"] == [pytest.approx(0.05)] and isinstance(record["lr"][0], float)


# ----------------------------------------------------------------------------- duplicates, errors
@pytest.mark.parametrize("name", PAIRS)
def test_a_parameter_listed_twice_warns_like_torch(name):
    ours_cls, torch_cls, kw = PAIRS[name]
    for cls in (torch_cls, ours_cls):
        p = torch.zeros(2, 3, requires_grad=True)
        with pytest.warns(UserWarning, match="optimizer contains a parameter group with duplicate parameters"):
            cls([p, p], **kw)


def _p():
    return torch.zeros(2, 3, requires_grad=True)


def _nonleaf():
    return _p() * 2


# (optimizers, hyperparameters or a builder taking the class) that torch.optim rejects.
ALL = ["sgd", "rmsprop", "adam", "adamw", "muon"]
INVALID = [
    (ALL, dict(lr=-0.1)),
    (ALL, dict(lr=None)),
    (ALL, dict(lr="0.1")),
    (ALL, dict(lr=torch.tensor([0.1, 0.2]))),
    (ALL, dict(lr=torch.tensor(-0.1))),
    (ALL, dict(weight_decay=-1.0)),
    (ALL, dict(weight_decay=None)),
    (["sgd", "rmsprop", "muon"], dict(momentum=-0.5)),
    (["sgd"], dict(nesterov=True)),
    (["sgd"], dict(momentum=0.9, dampening=0.1, nesterov=True)),
    (["sgd", "adam", "adamw"], dict(fused=True, foreach=True)),
    (["adam", "adamw", "rmsprop"], dict(eps=-1e-8)),
    (["adam", "adamw"], dict(eps=None)),
    (["adam", "adamw"], dict(betas=(1.0, 0.999))),
    (["adam", "adamw"], dict(betas=(0.9, 1.0))),
    (["adam", "adamw"], dict(betas=(-0.1, 0.999))),
    (["adam", "adamw"], dict(betas=(0, 0.999))),
    (["adam", "adamw"], dict(betas=(torch.tensor(0.9), 0.999))),
    (["adam", "adamw"], dict(betas=None)),
    (["adam", "adamw"], dict(betas=0.9)),
    (["adam", "adamw"], dict(betas=(0.9,))),
    (["adam", "adamw"], dict(betas=torch.tensor(0.9))),
    (["adam", "adamw"], dict(betas=(None, 0.999))),
    (["adam", "adamw", "rmsprop", "muon"], dict(weight_decay=torch.tensor(-1.0))),
    (["sgd", "rmsprop", "muon"], dict(momentum=torch.tensor([0.9, 0.8]))),
    (["sgd"], dict(nesterov=torch.tensor([1.0, 1.0]))),
    (["adam", "adamw"], dict(lr=torch.tensor(0.01), foreach=True)),
    (["rmsprop"], dict(alpha=-0.1)),
    (["muon"], dict(adjust_lr_fn="rms")),
    (ALL, lambda cls, kw: cls(_p(), **kw)),
    (ALL, lambda cls, kw: cls([], **kw)),
    (ALL, lambda cls, kw: cls([{"params": {_p()}}], **kw)),
    (ALL, lambda cls, kw: cls([_p(), 1.0], **kw)),
    (ALL, lambda cls, kw: cls([_nonleaf()], **kw)),
    (ALL, lambda cls, kw: cls([("a", _p()), _p()], **kw)),
    (ALL, lambda cls, kw: cls([{"params": [("a", _p())]}, {"params": [_p()]}], **kw)),
    (ALL, lambda cls, kw: cls([{"params": [_p()]}, {"params": [("b", _p())]}], **kw)),
    (ALL, lambda cls, kw: (lambda p: cls([{"params": [p]}, {"params": [p]}], **kw))(_p())),
    (ALL, lambda cls, kw: cls([{"params": [_p()]}, "not a group"], **kw)),
    (ALL, lambda cls, kw: cls([_p()], **kw).add_param_group([_p()])),
    (ALL, lambda cls, kw: cls([_p()], **kw).add_param_group({"params": [("b", _p())]})),
    (ALL, lambda cls, kw: cls([("a", _p())], **kw).add_param_group({"params": [_p()]})),
    (ALL, lambda cls, kw: (lambda p: cls([p], **kw).add_param_group({"params": [p]}))(_p())),
    (["muon"], lambda cls, kw: cls([torch.zeros(3, requires_grad=True)], **kw)),
]
INVALID_CASES = [(name, case) for names, case in INVALID for name in names]


def _raised(build) -> type[BaseException] | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            build()
        except Exception as e:  # noqa: BLE001 — the type is what we compare
            return type(e)
    return None


@pytest.mark.parametrize("name, case", INVALID_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INVALID_CASES)])
def test_invalid_arguments_raise_the_exception_type_torch_raises(name, case):
    ours_cls, torch_cls, kw = PAIRS[name]

    def build(cls):
        if callable(case):
            return lambda: case(cls, kw)
        return lambda: cls([_p()], **{**kw, **case})

    expected = _raised(build(torch_cls))
    assert expected is not None, "torch.optim accepts this case; it does not belong in this list"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(expected) as info:
            build(ours_cls)()
    assert type(info.value) is expected, f"ours raised {type(info.value).__name__}: {info.value}"


# ------------------------------------------------------------------------------------ schedulers
SCHEDULERS = {
    "LambdaLR": lambda o: sched.LambdaLR(o, lambda e: 0.95**e),
    "MultiplicativeLR": lambda o: sched.MultiplicativeLR(o, lambda e: 0.97),
    "StepLR": lambda o: sched.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda o: sched.MultiStepLR(o, milestones=[5, 12, 20], gamma=0.3),
    "ConstantLR": lambda o: sched.ConstantLR(o, factor=0.5, total_iters=8),
    "LinearLR": lambda o: sched.LinearLR(o, start_factor=0.2, total_iters=10),
    "ExponentialLR": lambda o: sched.ExponentialLR(o, gamma=0.93),
    "PolynomialLR": lambda o: sched.PolynomialLR(o, total_iters=25, power=2.0),
    "CosineAnnealingLR": lambda o: sched.CosineAnnealingLR(o, T_max=12, eta_min=1e-4),
    "ChainedScheduler": lambda o: sched.ChainedScheduler(
        [sched.ConstantLR(o, factor=0.5, total_iters=5), sched.ExponentialLR(o, gamma=0.95)]
    ),
    "SequentialLR": lambda o: sched.SequentialLR(
        o, [sched.LinearLR(o, start_factor=0.1, total_iters=5), sched.CosineAnnealingLR(o, T_max=20)], milestones=[5]
    ),
    "ReduceLROnPlateau": lambda o: sched.ReduceLROnPlateau(o, factor=0.5, patience=1, threshold=0.05),
    "CyclicLR": lambda o: sched.CyclicLR(
        o, base_lr=1e-3, max_lr=2e-2, step_size_up=4, mode="triangular2", base_momentum=0.8, max_momentum=0.95
    ),
    "OneCycleLR": lambda o: sched.OneCycleLR(o, max_lr=0.05, total_steps=30),
    "CosineAnnealingWarmRestarts": lambda o: sched.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=1e-4),
}
CYCLES_MOMENTUM = {"CyclicLR", "OneCycleLR"}


@pytest.mark.parametrize("opt_name", ["sgd-momentum", "adam"])
@pytest.mark.parametrize("sched_name", SCHEDULERS)
def test_every_torch_scheduler_drives_ours_like_torch(sched_name, opt_name):
    ours_cls, torch_cls, kw = PAIRS[opt_name]
    kw = {**kw, "foreach": False}
    mine, theirs = model_for(opt_name), model_for(opt_name)
    ours, ref = ours_cls(named_groups(mine), **kw), torch_cls(named_groups(theirs), **kw)
    trace_ours, trace_ref = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. SequentialLR's note on its sub-schedulers' first step
        train(mine, ours, 30, SCHEDULERS[sched_name](ours), trace_ours)
        train(theirs, ref, 30, SCHEDULERS[sched_name](ref), trace_ref)
    lrs, lrs_ref = ([lr for step in trace for lr, _, _ in step] for trace in (trace_ours, trace_ref))
    assert len(set(lrs)) > 1, "the schedule never changed the lr: the test would prove nothing"
    assert lrs == pytest.approx(lrs_ref, rel=1e-12)
    momenta, momenta_ref = (
        [m if b is None else b[0] for step in t for _, m, b in step] for t in (trace_ours, trace_ref)
    )
    assert momenta == pytest.approx(momenta_ref, rel=1e-12)
    if sched_name in CYCLES_MOMENTUM:
        assert len(set(momenta)) > 1, "momentum / beta1 should cycle"
    assert_same_params(mine, theirs)


@pytest.mark.parametrize("name", ["sgd", "rmsprop", "adam", "adamw"])
def test_what_torch_takes_and_ours_refuse_is_refused_in_one_line(name):
    """The README's two exceptions to the drop-in: torch steps complex parameters and takes tensor betas;
    ours refuse both in one line naming the value (no silent half-support)."""
    ours_cls, torch_cls, kw = PAIRS[name]
    complex_param = lambda: torch.zeros(3, dtype=torch.complex64, requires_grad=True)  # noqa: E731
    torch_cls([complex_param()], **kw)  # torch takes it
    with pytest.raises(TypeError, match=r"params\[0\] is complex \(torch.complex64\)"):
        ours_cls([complex_param()], **kw)
    if name.startswith("adam"):
        betas = (torch.tensor(0.9), torch.tensor(0.999))
        torch_cls([_p()], **kw, betas=betas)
        with pytest.raises(ValueError, match=r"invalid betas=\(tensor\(0.9000\), tensor\(0.9990\)\).*pair of floats"):
            ours_cls([_p()], **kw, betas=betas)


@pytest.mark.parametrize("name", ["adam", "rmsprop"])
def test_effective_lr_of_a_shaped_tensor_lr_has_the_params_shape(name):
    """lr=tensor([η]) acts as the scalar η in effective_lr too: η/(√v̂ + ε) from torch.optim's state, in the
    parameter's shape (a (1,)-tensor would broadcast a 0-d parameter's to (1,), and is a CPU tensor beside CUDA)."""
    ours_cls, torch_cls = {"adam": (Adam, torch.optim.Adam), "rmsprop": (RMSprop, torch.optim.RMSprop)}[name]
    mine = [torch.tensor(1.5, requires_grad=True), torch.ones(3, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in mine]
    ours, ref = ours_cls(mine, lr=torch.tensor([0.1])), torch_cls(theirs, lr=0.1)
    for t in range(3):
        for p, q in zip(mine, theirs, strict=True):
            p.grad = torch.full(p.shape, 0.5 * t - 1.0)
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
    for p, q in zip(mine, theirs, strict=True):
        s = ref.state[q]
        v = s["exp_avg_sq"] / (1 - 0.999 ** s["step"]) if name == "adam" else s["square_avg"]
        expected = 0.1 / (v.sqrt() + 1e-8)
        assert ours.effective_lr(p).shape == p.shape
        torch.testing.assert_close(ours.effective_lr(p), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", ["rmsprop", "adam", "adamw"])
@pytest.mark.parametrize("impl", ["forloop", "foreach", "fused"])
def test_a_state_dict_counting_steps_in_python_numbers_loads_like_torch(name, impl):
    """torch ≤ 1.11 saved ``step`` as an int; torch.optim 2.x still loads that and keeps stepping. So must ours."""
    if name == "rmsprop" and impl == "fused":
        pytest.skip("RMSprop has no fused path")
    ours_cls, torch_cls, kw = PAIRS[name]
    source, mine, theirs = model_for(name), model_for(name), model_for(name)
    old = torch_cls(source.parameters(), **kw)
    train(source, old, 3)
    saved = old.state_dict()
    for param_state in saved["state"].values():
        param_state["step"] = int(param_state["step"])
    ours, ref = ours_cls(mine.parameters(), **kw, **IMPL[impl]), torch_cls(theirs.parameters(), **kw)
    ours.load_state_dict(saved)
    ref.load_state_dict(saved)
    train(mine, ours, 3)
    train(theirs, ref, 3)
    for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=0)
        assert ours.state[p]["step"].item() == ref.state[q]["step"].item() == 6


@pytest.mark.parametrize("name", ["sgd-momentum", "rmsprop", "adam", "adamw"])
def test_capturable_and_differentiable_false_are_taken_and_true_refused_in_one_line(name):
    """Code written for torch.optim that passes these flags as False runs and steps like torch; True (CUDA-graph
    capture, autograd through the step) is refused in one line naming the flag, in the constructor and in a group."""
    ours_cls, torch_cls, kw = PAIRS[name]
    flags = ["differentiable"] if name.startswith("sgd") else ["capturable", "differentiable"]
    off = {flag: False for flag in flags}
    mine, theirs = model_for(name), model_for(name)
    ours, ref = ours_cls(mine.parameters(), **kw, **off), torch_cls(theirs.parameters(), **kw, **off)
    train(mine, ours, 3)
    train(theirs, ref, 3)
    assert_same_params(mine, theirs)
    for flag in flags:
        one_line = rf"^{ours_cls.__name__}: {flag}=True is not supported \([^\n]*\); pass False$"
        with pytest.raises(ValueError, match=one_line):
            ours_cls([_p()], **kw, **{flag: True})
        with pytest.raises(ValueError, match=rf"{flag}=True is not supported"):
            ours.add_param_group({"params": [_p()], flag: True})
        with pytest.raises(TypeError, match=rf"invalid {flag}=1 \(int\); {flag} must be False"):
            ours_cls([_p()], **kw, **{flag: 1})


# ------------------------------------------------------------------------------------ call forms
def _positional(cls: type) -> list[str]:
    params = inspect.signature(cls).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@pytest.mark.parametrize(
    "ours, theirs",
    sorted({(o, t) for o, t, _ in PAIRS.values()}, key=str),
    ids=lambda c: f"{c.__module__}.{c.__name__}",
)
def test_constructors_take_what_torch_takes_in_the_same_places(ours, theirs):
    """Every call torch.optim's constructor accepts, ours accepts with the same meaning: torch's positional
    parameters are, in order, the first of ours, and each of its keyword-only ones is a parameter of ours."""
    assert _positional(ours)[: len(_positional(theirs))] == _positional(theirs)
    assert set(inspect.signature(theirs).parameters) <= set(inspect.signature(ours).parameters)


def test_rmsprop_takes_torchs_positional_flags():
    """torch.optim.RMSprop(params, lr, alpha, eps, weight_decay, momentum, centered, capturable, foreach, maximize):
    the same positional call gives ours the same steps (maximize=True among them)."""
    args = (1e-2, 0.9, 1e-8, 1e-3, 0.5, True, False, False, True)
    mine, theirs = model_for("rmsprop"), model_for("rmsprop")
    ours, ref = RMSprop(mine.parameters(), *args), torch.optim.RMSprop(theirs.parameters(), *args)
    assert ours.param_groups[0]["maximize"] is ref.param_groups[0]["maximize"] is True
    train(mine, ours, 10)
    train(theirs, ref, 10)
    assert_same_params(mine, theirs)
