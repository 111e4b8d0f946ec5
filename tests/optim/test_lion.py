"""Lion against its NumPy twin (torch.optim has no Lion) and the paper's defining properties."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiscope import reference
from optiscope.optim import Lion
from support import HYPOTHESIS_SETTINGS, Quadratic, assert_matches_twin, assert_same_run, shapes_strategy


@st.composite
def lion_options(draw):
    return dict(
        lr=draw(st.floats(1e-5, 1e-2)),
        betas=(draw(st.floats(0.0, 0.99)), draw(st.floats(0.5, 0.999))),
        weight_decay=draw(st.sampled_from([0.0]) | st.floats(0.0, 1.0)),
        maximize=draw(st.booleans()),
    )


@settings(**HYPOTHESIS_SETTINGS)
@given(options=lion_options(), shapes=shapes_strategy(), seed=st.integers(0, 2**16))
def test_matches_numpy_twin_and_paths_agree(options, shapes, seed):
    problem = Quadratic(shapes, seed, concave=options["maximize"])
    forloop = problem.run_torch(lambda ps: Lion(ps, foreach=False, **options))
    twin = problem.run_numpy(lambda ps: reference.Lion(ps, **options))
    assert_matches_twin(forloop, twin, {"exp_avg": "m"})
    foreach = problem.run_torch(lambda ps: Lion(ps, foreach=True, **options))
    assert_same_run(foreach, forloop, exact=True)


def test_every_coordinate_moves_by_lr():
    """sign(c) makes the step size independent of the gradient's scale: |Δθ| = η where c ≠ 0."""
    p = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = Lion([p], lr=1e-3)
    p.grad = torch.tensor([1e-9, -3.0, 1e6, 0.0], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([-1e-3, 1e-3, -1e-3, 0.0], dtype=torch.float64))
