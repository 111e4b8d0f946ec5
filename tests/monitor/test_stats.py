"""Statistics the experiments report, against closed forms."""

import math
import warnings

import numpy as np
import pytest
import torch

from optiscope.monitor import stats
from optiscope.monitor.stats import loglog_fit, spearman, update_ratio_by


def test_loglog_fit_recovers_a_power_law_exactly():
    x = np.array([1e-3, 1e-2, 0.1, 1.0, 10.0])
    fit = loglog_fit(x, 3.0 * x**-0.5)
    assert fit["slope"] == pytest.approx(-0.5, abs=1e-12)
    assert fit["intercept"] == pytest.approx(math.log(3.0), abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)


def test_loglog_fit_r2_of_noisy_points_matches_its_definition():
    x, y = np.array([1.0, 2.0, 4.0, 8.0]), np.array([1.0, 3.0, 3.5, 9.0])
    lx, ly = np.log(x), np.log(y)
    slope = np.sum((lx - lx.mean()) * (ly - ly.mean())) / np.sum((lx - lx.mean()) ** 2)
    residual = ly - (ly.mean() + slope * (lx - lx.mean()))
    fit = loglog_fit(x, y)
    assert fit["slope"] == pytest.approx(slope, rel=1e-12)
    assert fit["r2"] == pytest.approx(1 - np.sum(residual**2) / np.sum((ly - ly.mean()) ** 2), rel=1e-12)
    assert math.isnan(loglog_fit([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])["r2"])


def test_loglog_fit_through_points_at_one_x_determines_no_line():
    """Equal frequencies (x all alike): any slope fits as well as any other, so none is stated."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's RankWarning on a singular fit would be a failure here
        fit = loglog_fit([0.5, 0.5], [0.02, 0.03])
    assert all(math.isnan(fit[key]) for key in ("slope", "intercept", "r2")), fit


def test_spearman_of_monotone_and_tied_data():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    # ties take average ranks: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4) -> Pearson of the ranks
    tied = torch.tensor([1.0, 2.0, 2.0, 3.0])
    assert spearman(tied, x) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1])
    assert math.isnan(spearman(torch.ones(4), x))


def test_update_ratio_by_treats_each_group_as_one_vector():
    params = {
        "blocks.0.a": {"u": 3.0, "w": 1.0},
        "blocks.0.b": {"u": 4.0, "w": 7.0},
        "head": {"u": 1.0, "w": 0.0},
    }
    ratios = update_ratio_by(params, lambda name: name.rsplit(".", 1)[0])
    assert ratios["blocks.0"] == pytest.approx(5.0 / math.sqrt(50.0))
    assert math.isnan(ratios["head"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_update_norms_against_float64_sums(dtype):
    """‖θ′‖, ‖u‖ and ⟨−u, g⟩ per tensor, through NumPy (float32, float64, strided views) or torch (bfloat16), against
    the sums taken in float64; a float32 sum that overflows over finite entries is taken again, NaN stays NaN."""
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 48), (7,), (), (0,), (30, 20)]
    weights = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    weights[4] = weights[4].t()  # a strided view
    neg = [torch.randn(w.shape, generator=g).to(dtype) * 1e-3 for w in weights]
    grads = [torch.randn(w.shape, generator=g).to(dtype) for w in weights]
    w, u, dots = stats.update_norms([x.requires_grad_(x.is_floating_point()) for x in weights], neg, grads)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    for i in range(len(shapes)):
        assert w[i] == pytest.approx(float(weights[i].detach().double().norm()), rel=tolerance, abs=1e-12)
        assert u[i] == pytest.approx(float(neg[i].double().norm()), rel=tolerance, abs=1e-12)
        assert dots[i] == pytest.approx(float((neg[i].double() * grads[i].double()).sum()), rel=tolerance, abs=1e-6)
    if dtype == torch.float32:
        big, bad = torch.full((10,), 1e30), torch.tensor([math.nan, 1.0])
        w, u, dots = stats.update_norms([big, bad], [big, bad], [big, bad])
        assert w[0] == pytest.approx(math.sqrt(10) * 1e30) and dots[0] == pytest.approx(1e61, rel=1e-6)
        assert math.isnan(w[1]) and math.isnan(u[1]) and math.isnan(dots[1])
