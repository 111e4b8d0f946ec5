"""Global-norm clipping against torch.nn.utils.clip_grad_norm_, and its non-finite behaviour."""

import math

import pytest
import torch

from optiscope.optim import NonFiniteGradientError, clip_grad_norm


def _params(scale, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    ps = [torch.zeros(s, dtype=dtype, requires_grad=True) for s in [(3, 4), (5,), (2, 2, 2)]]
    for p in ps:
        p.grad = scale * torch.randn(p.shape, generator=g, dtype=dtype)
    return ps


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch(scale, norm_type, dtype):
    ours, theirs = _params(scale, dtype), _params(scale, dtype)
    n_ours = clip_grad_norm(ours, 1.0, norm_type=norm_type)
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type=norm_type)
    torch.testing.assert_close(n_ours, n_theirs.to(n_ours.dtype))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_returns_pre_clip_norm_and_caps_it():
    ps = _params(10.0)
    expected = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ps))
    total = clip_grad_norm(ps, 0.5)
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    after = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ps))
    assert after.item() == pytest.approx(0.5, rel=1e-5)


def test_non_finite_raises_naming_the_parameter_or_skips():
    ps = _params(1.0)
    ps[1].grad[2] = math.inf
    with pytest.raises(NonFiniteGradientError, match=r"#1 shape \(5,\)"):
        clip_grad_norm(ps, 1.0)
    before = [p.grad.clone() for p in ps]
    total = clip_grad_norm(ps, 1.0, nonfinite="skip")
    assert not math.isfinite(total.item())
    assert all(torch.equal(a, b.grad) for a, b in zip(before, ps, strict=True))


def test_named_parameters_are_named_in_the_error():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    model[1].bias.grad.fill_(math.nan)
    with pytest.raises(NonFiniteGradientError, match=r"in 1 parameter\(s\): 1\.bias; the global norm is nan"):
        clip_grad_norm(model.named_parameters(), 1.0)


def test_finite_gradients_whose_float32_norm_overflows_are_clipped():
    """The issue's case: 1000 entries of 1e19 are finite, but their sum of squares overflows float32."""
    p = torch.zeros(1000, requires_grad=True)
    p.grad = torch.full((1000,), 1e19)
    total = clip_grad_norm([p], 1.0)
    assert total.item() == pytest.approx(1e19 * math.sqrt(1000), rel=1e-6)  # the float64 norm, a closed form
    assert torch.linalg.vector_norm(p.grad.double()).item() == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_norm=0.0), "max_norm=0.0 must be a finite number > 0"),
        (dict(max_norm=1.0, nonfinite="ignore"), "nonfinite='ignore'"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        clip_grad_norm(_params(1.0), **kwargs)


def test_a_numpy_max_norm_clips_like_torch():
    np = pytest.importorskip("numpy")
    ours, theirs = _params(1.0), _params(1.0)
    n_ours = clip_grad_norm(ours, np.float32(0.5), norm_type=np.float64(2.0))
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(n_ours, n_theirs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("as_", ["tensor", "numpy array"])
def test_a_0d_max_norm_and_norm_type_clip_like_torch(as_):
    """torch.nn.utils.clip_grad_norm_ takes max_norm and norm_type as 0-d tensors (and NumPy 0-d arrays)."""
    np = pytest.importorskip("numpy")
    wrap = torch.tensor if as_ == "tensor" else np.array
    ours, theirs = _params(1.0), _params(1.0)
    n_ours = clip_grad_norm(ours, wrap(0.5), norm_type=wrap(1.0))
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, wrap(0.5), norm_type=wrap(1.0))
    torch.testing.assert_close(n_ours, n_theirs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_a_max_norm_of_many_entries_is_refused_in_one_line():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match=r"^clip_grad_norm: max_norm is a tensor of shape \(100,\); give a number"):
        clip_grad_norm(_params(1.0), torch.ones(100))
    with pytest.raises(ValueError, match=r"^clip_grad_norm: norm_type is an array of shape \(2, 2\); give a number"):
        clip_grad_norm(_params(1.0), 1.0, norm_type=np.ones((2, 2)))
