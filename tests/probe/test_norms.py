"""Normalisations written out for the probe's nested forward mode: the same values as torch's kernels, and
second directional derivatives that match central differences (torch 2.13's fused kernels' do not)."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp

from optiscope.probe.norms import composed_norms

CASES = {
    "layer_norm": lambda x, g, b: F.layer_norm(x, (8,), g, b),
    "layer_norm without affine": lambda x, g, b: F.layer_norm(x, (8,)),
    "batch_norm on the batch's statistics": lambda x, g, b: F.batch_norm(x, None, None, g, b, training=True),
    "instance_norm": lambda x, g, b: F.instance_norm(x.reshape(2, 4, 4), weight=g[:4], bias=b[:4]).reshape(4, 8),
}


def second_derivative(f, x, v):
    """vᵀ∇²f(x)v by forward over forward mode."""
    return jvp(lambda t: jvp(f, (t,), (v,))[1], (x,), (v,))[1]


@pytest.mark.parametrize("name", list(CASES))
def test_composed_norms_agree_with_torch_and_differentiate_twice_forward(name):
    generator = torch.Generator().manual_seed(0)
    x, v, w = (torch.randn(4, 8, dtype=torch.float64, generator=generator) for _ in range(3))
    g, b = (torch.randn(8, dtype=torch.float64, generator=generator) for _ in range(2))

    def scalar(t):
        return (w * CASES[name](t, g, b)).sum()

    h = 1e-4
    central = (scalar(x + h * v) - 2 * scalar(x) + scalar(x - h * v)) / h**2
    original = F.layer_norm, F.batch_norm, F.instance_norm
    with composed_norms():
        composed_value, composed = scalar(x), second_derivative(scalar, x, v)
    assert (F.layer_norm, F.batch_norm, F.instance_norm) == original  # torch's own again after the block
    assert float(composed_value) == pytest.approx(float(scalar(x)), rel=1e-12, abs=1e-12)
    assert float(composed) == pytest.approx(float(central), rel=1e-6)
