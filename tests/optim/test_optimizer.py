"""torch.optim's contract, for every optiscope optimizer and implementation, and the bad-input messages."""

import copy
import io
import math

import pytest
import torch

from optiscope.optim import SGD, Adam, AdamL2, AdamW, Lion, Muon, MuonWithAdamW, RMSprop
from support import state_tensors_equal

# name -> (factory(params, **overrides), implementations it has)
FACTORIES = {
    "sgd": (lambda ps, **kw: SGD(ps, **{"lr": 0.05, **kw}), ["forloop", "foreach", "fused"]),
    "sgd-nesterov-wd": (
        lambda ps, **kw: SGD(ps, **{"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3, **kw}),
        ["forloop", "foreach", "fused"],
    ),
    "sgd-decoupled": (
        lambda ps, **kw: SGD(
            ps, **{"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3, "decoupled_weight_decay": True, **kw}
        ),
        ["forloop", "foreach"],
    ),
    "rmsprop": (
        lambda ps, **kw: RMSprop(ps, **{"lr": 1e-2, "momentum": 0.5, "centered": True, **kw}),
        ["forloop", "foreach"],
    ),
    "adam": (lambda ps, **kw: Adam(ps, **{"lr": 1e-2, "amsgrad": True, **kw}), ["forloop", "foreach", "fused"]),
    "adamw": (lambda ps, **kw: AdamW(ps, **{"lr": 1e-2, **kw}), ["forloop", "foreach", "fused"]),
    "adaml2": (lambda ps, **kw: AdamL2(ps, **{"lr": 1e-2, **kw}), ["forloop", "foreach", "fused"]),
    "lion": (lambda ps, **kw: Lion(ps, **{"lr": 2e-2, **kw}), ["forloop", "foreach"]),
    "muon": (lambda ps, **kw: Muon(ps, **{"lr": 2e-2, **kw}), ["forloop", "foreach"]),
}
IMPL_KWARGS = {"forloop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
CASES = [(name, impl) for name, (_, impls) in FACTORIES.items() for impl in impls]
IDS = [f"{n}-{i}" for n, i in CASES]


def make(name, impl, params, **kw):
    factory, _ = FACTORIES[name]
    return factory(params, **IMPL_KWARGS[impl], **kw)


def least_squares(dtype=torch.float32, seed=0):
    """min ‖XW − Y‖² for a 2-D W (Muon needs matrices) plus a bias b."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 6, generator=g, dtype=dtype)
    y = x @ torch.randn(6, 3, generator=g, dtype=dtype) + 0.1 * torch.randn(64, 3, generator=g, dtype=dtype)
    w = torch.zeros(6, 3, dtype=dtype, requires_grad=True)
    b = torch.zeros(3, dtype=dtype, requires_grad=True)

    def loss():
        return ((x @ w + b - y) ** 2).mean()

    return w, b, loss


def params_for(name, w, b):
    return [w] if name == "muon" else [w, b]


def train(opt, loss, steps):
    for _ in range(steps):
        opt.zero_grad()
        loss().backward()
        opt.step()
    return loss().item()


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
def test_loss_falls_and_rises_with_maximize(name, impl):
    w, b, loss = least_squares()
    start = loss().item()
    assert train(make(name, impl, params_for(name, w, b)), loss, 60) < 0.5 * start
    w, b, loss = least_squares()
    assert train(make(name, impl, params_for(name, w, b), maximize=True), loss, 30) > 1.5 * start


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
def test_tiny_lr_group_does_not_move_and_gradless_params_untouched(name, impl):
    w, b, loss = least_squares()
    frozen = torch.randn(6, 3, requires_grad=True)
    with torch.no_grad():
        w.copy_(torch.randn(6, 3))
    w0 = w.detach().clone()
    opt = make(name, impl, [{"params": [w], "lr": 1e-28}, {"params": [frozen]}])
    f0 = frozen.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert torch.equal(w.detach(), w0)
    assert torch.equal(frozen.detach(), f0) and frozen not in opt.state


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
def test_zero_gradient_without_decay_changes_nothing(name, impl):
    w = torch.randn(4, 3, requires_grad=True)
    w0 = w.detach().clone()
    no_decay = {"weight_decay": 0.0} if name not in ("rmsprop",) else {}
    opt = make(name, impl, [w], **no_decay)
    for _ in range(3):
        w.grad = torch.zeros_like(w)
        opt.step()
    assert torch.equal(w.detach(), w0)


def _grads(step, shapes):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for s in shapes]


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
@pytest.mark.parametrize("transport", ["state_dict", "torch.save", "deepcopy"])
def test_resume_is_bit_identical(name, impl, transport):
    """5 steps, then (state dict | torch.save + weights_only load | deepcopy), then 10 more: identical."""
    shapes = [(5, 4)] if name == "muon" else [(5, 4), (4,)]
    params = [
        torch.randn(*s, generator=torch.Generator().manual_seed(i)).requires_grad_() for i, s in enumerate(shapes)
    ]
    opt = make(name, impl, params)
    for t in range(5):
        for p, g in zip(params, _grads(t, shapes), strict=True):
            p.grad = g
        opt.step()
    clones = [p.detach().clone().requires_grad_() for p in params]
    if transport == "deepcopy":
        twin = copy.deepcopy(opt)
        clones = [p for g in twin.param_groups for p in g["params"]]
    else:
        twin = make(name, impl, clones)
        saved = opt.state_dict()
        if transport == "torch.save":
            buffer = io.BytesIO()
            torch.save(saved, buffer)
            buffer.seek(0)
            saved = torch.load(buffer, weights_only=True)
        twin.load_state_dict(saved)
    assert state_tensors_equal(opt, twin)
    for t in range(5, 15):
        for p, q, g in zip(params, clones, _grads(t, shapes), strict=True):
            p.grad, q.grad = g, g.clone()
        opt.step()
        twin.step()
    for p, q in zip(params, clones, strict=True):
        assert torch.equal(p.detach(), q.detach())
    assert state_tensors_equal(opt, twin)


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_preserved(name, impl, dtype):
    w, b, loss = least_squares(dtype)
    opt = make(name, impl, params_for(name, w, b))
    train(opt, loss, 3)
    for p in params_for(name, w, b):
        assert p.dtype == dtype and torch.isfinite(p).all()
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert value.dtype == dtype, key


@pytest.mark.parametrize("name, impl", CASES, ids=IDS)
def test_zero_size_and_non_contiguous_params(name, impl):
    """A zero-size param is harmless; a non-contiguous param steps exactly like its contiguous copy."""
    base = torch.randn(6, 8)
    strided = base[:, ::2].detach().requires_grad_()  # non-contiguous leaf, shape (6, 4)
    dense = strided.detach().contiguous().requires_grad_()
    empty = torch.zeros(0, 4, requires_grad=True)
    assert not strided.is_contiguous()
    opt_a = make(name, impl, [strided, empty])
    opt_b = make(name, impl, [dense])
    for t in range(4):
        g = _grads(t, [(6, 4)])[0]
        strided.grad, dense.grad, empty.grad = g.clone(), g.clone(), torch.zeros(0, 4)
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(strided.detach(), dense.detach(), rtol=1e-6, atol=1e-7)
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_works_with_torch_schedulers_and_hooks(name):
    w, b, loss = least_squares()
    opt = make(name, "forloop", params_for(name, w, b))
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    base = opt.param_groups[0]["lr"]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(4):
        opt.zero_grad()
        loss().backward()
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(base / 4)
    assert calls == ["pre", "post"] * 4


def test_closure_is_called_and_its_loss_returned():
    w, b, loss = least_squares()
    opt = Adam([w, b], lr=1e-2)

    def closure():
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    assert opt.step(closure).item() == pytest.approx(loss().item(), rel=0.05)


BAD_INPUTS = [
    (lambda p: SGD([p], lr=-0.1), ValueError, r"invalid lr=-0\.1; lr must be a finite number >= 0"),
    (lambda p: SGD([p], lr=math.nan), ValueError, r"invalid lr=nan"),
    (
        lambda p: Adam([p], betas=(0.9, 1.0)),
        ValueError,
        r"invalid betas=\(0\.9, 1\.0\); betas must be a pair .* \[0, 1\)",
    ),
    (lambda p: Adam([p], betas=(-0.1, 0.9)), ValueError, r"betas must be a pair"),
    (lambda p: Adam([p], eps=-1e-8), ValueError, r"invalid eps=-1e-08; eps must be a finite number >= 0"),
    (lambda p: AdamW([p], weight_decay=-0.01), ValueError, r"invalid weight_decay=-0\.01"),
    (lambda p: Lion([p], betas=(0.9, 1.5)), ValueError, r"invalid betas"),
    (lambda p: RMSprop([p], alpha=1.0), ValueError, r"invalid alpha=1\.0; alpha must be a number in \[0, 1\)"),
    (lambda p: SGD([p], momentum=0.0, nesterov=True), ValueError, r"nesterov=True needs momentum > 0"),
    (lambda p: SGD([p], momentum=1.2), ValueError, r"invalid momentum=1\.2"),
    (lambda p: Muon([p]), ValueError, r"has shape \(3,\), but Muon updates 2-D matrices only"),
    (
        lambda p: Muon([p.view(1, 3)], ns_steps=0),
        ValueError,
        r"invalid ns_steps=0; ns_steps must be an integer in \[1, 100\)",
    ),
    (lambda p: Muon([p.view(1, 3)], adjust_lr_fn="rms"), ValueError, r"invalid adjust_lr_fn='rms'"),
    (lambda p: Adam([p, 3.0]), TypeError, r"params\[1\] is a float; every param must be a torch\.Tensor"),
    (lambda p: Adam(p), TypeError, r"params must be an iterable of tensors .* got a single Tensor"),
    (lambda p: Adam([{"params": [p]}, {"params": [p]}]), ValueError, r"already in another param group"),
    (lambda p: Adam([p], fused=True, foreach=True), RuntimeError, r"fused=True and foreach=True are exclusive"),
    (lambda p: Adam([p], bias_correction=False, fused=True), ValueError, r"fused=True is not available"),
    (lambda p: Adam([p], amsgrad="yes"), ValueError, r"invalid amsgrad='yes'; amsgrad must be True or False"),
]


@pytest.mark.parametrize("build, error, message", BAD_INPUTS)
def test_bad_input_is_named(build, error, message):
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(error, match=message):
        build(p)


def test_group_added_later_is_checked():
    opt = SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match=r"invalid lr=-1"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": -1})


def test_sparse_gradients_are_refused_clearly():
    emb = torch.nn.Embedding(5, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients are not supported"):
        Adam(emb.parameters()).step()


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="torch before grad_dtype refuses such gradients")
def test_a_gradient_of_another_dtype_takes_the_for_loop_and_fused_refuses_it():
    """torch lets a tensor take a gradient of another dtype (``grad_dtype = None``); its fused kernels do not, so
    the default path falls back to the for-loop (as torch.optim.SGD's own for-loop, the oracle, steps it)."""
    params = [torch.ones(3, requires_grad=True) for _ in range(2)]
    for p in params:
        p.grad_dtype = None
        p.grad = torch.full((3,), 0.5, dtype=torch.float64)
    ours, theirs = [p.detach().clone().requires_grad_() for p in params], params
    for p in ours:
        p.grad_dtype = None
        p.grad = torch.full((3,), 0.5, dtype=torch.float64)
    SGD(ours, lr=0.1, momentum=0.9).step()
    torch.optim.SGD(theirs, lr=0.1, momentum=0.9, foreach=False).step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs, strict=True))
    with pytest.raises(RuntimeError, match=r"fused=True needs floating-point params and grads of the same dtype"):
        SGD(ours, lr=0.1, fused=True).step()


def test_hybrid_state_dict_round_trip():
    """MuonWithAdamW's two kinds of group survive a state-dict round trip."""
    w = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    opt = MuonWithAdamW([w], [b])
    for t in range(3):
        w.grad, b.grad = _grads(t, [(4, 3), (3,)])
        opt.step()
    w2, b2 = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    twin = MuonWithAdamW([w2], [b2])
    twin.load_state_dict(opt.state_dict())
    for t in range(3, 6):
        gw, gb = _grads(t, [(4, 3), (3,)])
        w.grad, b.grad, w2.grad, b2.grad = gw, gb, gw.clone(), gb.clone()
        opt.step()
        twin.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)
