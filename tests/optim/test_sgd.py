"""SGD against its NumPy twin and torch.optim.SGD, and its three implementations against each other."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiscope import reference
from optiscope.optim import SGD
from support import HYPOTHESIS_SETTINGS, Quadratic, assert_matches_twin, assert_same_run, shapes_strategy


@st.composite
def sgd_options(draw):
    o = dict(
        lr=draw(st.floats(1e-4, 0.1)),
        momentum=draw(st.sampled_from([0.0, 0.5, 0.9]) | st.floats(0.0, 0.99)),
        dampening=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.5)),
        nesterov=draw(st.booleans()),
        weight_decay=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.1)),
        decoupled_weight_decay=draw(st.booleans()),
        maximize=draw(st.booleans()),
    )
    if o["nesterov"]:
        o["momentum"], o["dampening"] = max(o["momentum"], 0.1), 0.0
    return o


@settings(**HYPOTHESIS_SETTINGS)
@given(options=sgd_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_numpy_twin(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    ours = problem.run_torch(lambda ps: SGD(ps, foreach=False, **options))
    twin = problem.run_numpy(lambda ps: reference.SGD(ps, **options))
    assert_matches_twin(ours, twin, {"momentum_buffer": "velocity"})


@settings(**HYPOTHESIS_SETTINGS)
@given(options=sgd_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_torch_and_paths_agree(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    forloop = problem.run_torch(lambda ps: SGD(ps, foreach=False, **options))
    foreach = problem.run_torch(lambda ps: SGD(ps, foreach=True, **options))
    assert_same_run(foreach, forloop, exact=True)
    if options["decoupled_weight_decay"] and options["weight_decay"] > 0:
        return  # torch.optim.SGD and the fused kernel only have coupled decay
    fused = problem.run_torch(lambda ps: SGD(ps, fused=True, **options))
    assert_same_run(fused, forloop)
    torch_options = {k: v for k, v in options.items() if k != "decoupled_weight_decay"}
    theirs = problem.run_torch(lambda ps: torch.optim.SGD(ps, foreach=False, **torch_options))
    assert_same_run(forloop, theirs)


def test_decoupled_equals_coupled_without_momentum():
    """For plain SGD, L2 and decoupled decay are the same update (the seed's derivation)."""
    problem = Quadratic([(4, 3)], seed=1, steps=30)
    coupled = problem.run_torch(lambda ps: SGD(ps, lr=0.05, weight_decay=0.1))
    decoupled = problem.run_torch(lambda ps: SGD(ps, lr=0.05, weight_decay=0.1, decoupled_weight_decay=True))
    assert_same_run(coupled, decoupled, rtol=1e-13)
    with_momentum = problem.run_torch(
        lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.1, decoupled_weight_decay=True)
    )
    coupled_momentum = problem.run_torch(lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.1))
    assert not torch.allclose(with_momentum[0][0], coupled_momentum[0][0], rtol=1e-6)


def test_fused_rejected_for_decoupled_decay():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="fused=True is not available"):
        SGD([p], lr=0.1, weight_decay=0.1, decoupled_weight_decay=True, fused=True)


def test_nesterov_needs_momentum():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"nesterov=True needs momentum > 0"):
        SGD([p], lr=0.1, nesterov=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fused", [None, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_half_precision_cpu_params_step_like_torchs_for_loop(dtype, fused, momentum):
    """torch 2.13's fused CPU SGD leaves the vectorised blocks of float16/bfloat16 tensors unmoved
    (pytorch/pytorch#191763); the default path, and fused=True, must still take the step: torch.optim.SGD's
    for-loop is the oracle."""
    torch.manual_seed(0)
    start, grads = torch.randn(1000).to(dtype), [torch.randn(1000).to(dtype) for _ in range(3)]
    ours, theirs = (torch.nn.Parameter(start.clone()) for _ in range(2))
    stepping = [(ours, SGD([ours], lr=0.1, momentum=momentum, fused=fused))]
    stepping.append((theirs, torch.optim.SGD([theirs], lr=0.1, momentum=momentum, foreach=False)))
    for g in grads:
        for p, optimizer in stepping:
            p.grad = g.clone()
            optimizer.step()
    assert (theirs != start).float().mean() > 0.9  # the oracle did move
    torch.testing.assert_close(ours, theirs)
