"""RMSprop against its NumPy twin and torch.optim.RMSprop; foreach against the for-loop."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiscope import reference
from optiscope.optim import RMSprop
from support import HYPOTHESIS_SETTINGS, Quadratic, assert_matches_twin, assert_same_run, shapes_strategy


@st.composite
def rmsprop_options(draw):
    return dict(
        lr=draw(st.floats(1e-4, 0.05)),
        alpha=draw(st.floats(0.5, 0.999)),
        eps=draw(st.floats(1e-10, 1e-3)),
        weight_decay=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.1)),
        momentum=draw(st.sampled_from([0.0]) | st.floats(0.0, 0.9)),
        centered=draw(st.booleans()),
        maximize=draw(st.booleans()),
    )


@settings(**HYPOTHESIS_SETTINGS)
@given(options=rmsprop_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_numpy_twin(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    ours = problem.run_torch(lambda ps: RMSprop(ps, foreach=False, **options))
    twin = problem.run_numpy(lambda ps: reference.RMSProp(ps, **options))
    assert_matches_twin(ours, twin, {"square_avg": "v", "grad_avg": "g_avg", "momentum_buffer": "b"})


@settings(**HYPOTHESIS_SETTINGS)
@given(options=rmsprop_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_torch_and_paths_agree(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    forloop = problem.run_torch(lambda ps: RMSprop(ps, foreach=False, **options))
    foreach = problem.run_torch(lambda ps: RMSprop(ps, foreach=True, **options))
    assert_same_run(foreach, forloop, exact=True)
    theirs = problem.run_torch(lambda ps: torch.optim.RMSprop(ps, foreach=False, **options))
    assert_same_run(forloop, theirs)


def test_effective_lr_is_lr_over_root_v():
    problem = Quadratic([(2, 3)], seed=2, steps=6)
    (params, opt) = problem.run_torch(lambda ps: RMSprop(ps, lr=1e-2, alpha=0.9, eps=1e-6))
    v = opt.state[opt.param_groups[0]["params"][0]]["square_avg"]
    torch.testing.assert_close(opt.effective_lr(opt.param_groups[0]["params"][0]), 1e-2 / (v.sqrt() + 1e-6))
