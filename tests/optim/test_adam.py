"""Adam, AdamW and AdamL2 against the NumPy twins and torch.optim; the seed's worked example and pitfalls."""

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiscope import reference
from optiscope.optim import Adam, AdamL2, AdamW
from support import HYPOTHESIS_SETTINGS, Quadratic, assert_matches_twin, assert_same_run, shapes_strategy

ADAM_STATE = {"exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "v_max"}


@st.composite
def adam_options(draw):
    return dict(
        lr=draw(st.floats(1e-4, 0.1)),
        betas=(draw(st.floats(0.0, 0.99)), draw(st.floats(0.5, 0.9999))),
        eps=draw(st.floats(1e-10, 1e-3)),
        weight_decay=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.1)),
        amsgrad=draw(st.booleans()),
        bias_correction=draw(st.booleans()),
        maximize=draw(st.booleans()),
    )


FAMILY = [(Adam, reference.Adam, torch.optim.Adam), (AdamW, reference.AdamW, torch.optim.AdamW)]


@pytest.mark.parametrize("ours_cls, twin_cls, _", FAMILY + [(AdamL2, reference.AdamL2, None)])
@settings(**HYPOTHESIS_SETTINGS)
@given(options=adam_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_numpy_twin(ours_cls, twin_cls, _, options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    ours = problem.run_torch(lambda ps: ours_cls(ps, foreach=False, **options))
    twin = problem.run_numpy(lambda ps: twin_cls(ps, **options))
    assert_matches_twin(ours, twin, ADAM_STATE)


@pytest.mark.parametrize("ours_cls, _, torch_cls", FAMILY)
@settings(**HYPOTHESIS_SETTINGS)
@given(options=adam_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_torch_and_paths_agree(ours_cls, _, torch_cls, options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    forloop = problem.run_torch(lambda ps: ours_cls(ps, foreach=False, **options))
    foreach = problem.run_torch(lambda ps: ours_cls(ps, foreach=True, **options))
    assert_same_run(foreach, forloop, exact=True)
    if not options["bias_correction"]:
        return  # neither torch.optim nor the fused kernels can switch bias correction off
    fused = problem.run_torch(lambda ps: ours_cls(ps, fused=True, **options))
    assert_same_run(fused, forloop)
    torch_options = {k: v for k, v in options.items() if k != "bias_correction"}
    theirs = problem.run_torch(lambda ps: torch_cls(ps, foreach=False, **torch_options))
    assert_same_run(forloop, theirs)


def test_seed_worked_example():
    """Adam on f(x) = x², x0 = 3, lr = 1e-3: the seed traces 2.999, 2.998, 2.997."""
    x = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    opt = Adam([x], lr=1e-3)
    seen = []
    for _ in range(3):
        opt.zero_grad()
        (x**2).backward()
        opt.step()
        seen.append(x.item())
    assert seen == pytest.approx([2.999, 2.998, 2.997], abs=1e-5)

    params = [{"params": np.array(3.0), "grad": np.array(0.0)}]
    twin = reference.Adam(params, lr=1e-3)
    twin_seen = []
    for _ in range(3):
        params[0]["grad"][...] = 2 * params[0]["params"]
        twin.step()
        twin_seen.append(float(params[0]["params"]))
    assert twin_seen == pytest.approx(seen, rel=1e-12)


def _step_once(opt, p, grad):
    p.grad = torch.as_tensor(grad, dtype=p.dtype).clone()
    before = p.detach().clone()
    opt.step()
    return p.detach() - before


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True), dict(fused=True)])
def test_pitfall_state_updated_in_place(impl):
    """Pitfall 1: a stale moment (m = … instead of m[:] = …) makes every step look like step 1.

    With g = +1 then g = −1 a correct Adam nearly cancels on step 2 (m̂₂ = −0.01/0.19), while a
    stale-state Adam would step by the full lr again.
    """
    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = Adam([p], lr=1e-3, **impl)
    first = _step_once(opt, p, [1.0])
    buffer = opt.state[p]["exp_avg"]
    second = _step_once(opt, p, [-1.0])
    assert opt.state[p]["exp_avg"] is buffer
    m2 = 0.9 * 0.1 + 0.1 * -1.0
    v2 = 0.999 * 0.001 + 0.001
    expected = -1e-3 * (m2 / (1 - 0.9**2)) / (math.sqrt(v2 / (1 - 0.999**2)) + 1e-8)
    assert first.item() == pytest.approx(-1e-3, rel=1e-7)
    assert second.item() == pytest.approx(expected, rel=1e-9)
    assert abs(second.item()) < 0.1 * abs(first.item())


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_pitfall_step_counter_starts_at_one_and_both_moments_corrected(scale):
    """Pitfalls 2 and 4: t = 1 on the first step (no 0/0) and the first step is lr·g/(|g| + ε) ≈ lr·sign(g).

    Without correcting v the first step would be lr·0.1/√0.001 ≈ 3.16·lr; without correcting m, 0.1·lr.
    """
    p = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = Adam([p], lr=1e-3)
    g = torch.tensor([scale, -scale, 2 * scale], dtype=torch.float64)
    step = _step_once(opt, p, g)
    assert opt.state[p]["step"].item() == 1
    torch.testing.assert_close(step, -1e-3 * g / (g.abs() + 1e-8), rtol=1e-12, atol=0)

    raw = Adam([q := torch.zeros(1, dtype=torch.float64, requires_grad=True)], lr=1e-3, bias_correction=False)
    uncorrected = _step_once(raw, q, [scale])
    assert uncorrected.item() == pytest.approx(-1e-3 * 0.1 / (math.sqrt(0.001 * scale**2) / scale + 1e-8 / scale))


def test_pitfall_adamw_is_not_adam_l2():
    """Pitfall 3: with weight decay AdamW and Adam+L2 differ; with λ = 0 they are the same optimizer."""
    problem = Quadratic([(6, 4), (5,)], seed=3, steps=50)
    for wd, differ in [(0.1, True), (0.0, False)]:
        w = problem.run_torch(lambda ps, wd=wd: AdamW(ps, lr=1e-2, weight_decay=wd))
        l2 = problem.run_torch(lambda ps, wd=wd: AdamL2(ps, lr=1e-2, weight_decay=wd))
        gap = max((a - b).abs().max().item() for a, b in zip(w[0], l2[0], strict=True))
        assert (gap > 1e-4) if differ else (gap == 0.0), f"wd={wd}: gap {gap}"


@pytest.mark.parametrize("options", [dict(), dict(amsgrad=True), dict(bias_correction=False)])
def test_effective_lr_is_lr_over_root_v_hat(options):
    """effective_lr(p) == lr / (√(v/(1 − β2ᵗ)) + ε) computed by hand from the state (and the twin's)."""
    problem = Quadratic([(3, 4)], seed=5, steps=7)
    (params, opt) = problem.run_torch(lambda ps: Adam(ps, lr=3e-3, betas=(0.8, 0.95), eps=1e-6, **options))
    s = opt.state[params_of(opt)[0]]
    v = s["max_exp_avg_sq"] if options.get("amsgrad") else s["exp_avg_sq"]
    bc2 = 1 - 0.95**7 if options.get("bias_correction", True) else 1.0
    by_hand = 3e-3 / (torch.sqrt(v / bc2) + 1e-6)
    torch.testing.assert_close(opt.effective_lr(params_of(opt)[0]), by_hand, rtol=1e-12, atol=0)
    _, twin = problem.run_numpy(lambda ps: reference.Adam(ps, lr=3e-3, betas=(0.8, 0.95), eps=1e-6, **options))
    np.testing.assert_allclose(opt.effective_lr(params_of(opt)[0]).numpy(), twin.effective_lr(0), rtol=1e-10)


def params_of(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def test_effective_lr_needs_state():
    p = torch.zeros(2, requires_grad=True)
    opt = AdamW([p])
    with pytest.raises(KeyError, match="no Adam state"):
        opt.effective_lr(p)


def test_torch_adam_state_dict_loads_into_ours():
    """State names are torch.optim's, so a torch.optim.Adam checkpoint resumes in optiscope's Adam."""
    problem = Quadratic([(4, 2)], seed=9, steps=10)
    params, theirs = problem.run_torch(lambda ps: torch.optim.Adam(ps, lr=1e-2))
    p_ours = params[0].clone().requires_grad_()
    p_theirs = params[0].clone().requires_grad_()
    ours = Adam([p_ours], lr=1e-2)
    ours.load_state_dict(theirs.state_dict())  # a copy: torch aliases tensors on load
    theirs2 = torch.optim.Adam([p_theirs], lr=1e-2)
    theirs2.load_state_dict(copy.deepcopy(theirs.state_dict()))
    for t in range(5):
        g = torch.full_like(p_ours, 0.1 * (t - 2))
        p_ours.grad, p_theirs.grad = g.clone(), g.clone()
        ours.step()
        theirs2.step()
    torch.testing.assert_close(p_ours, p_theirs, rtol=1e-12, atol=0)
