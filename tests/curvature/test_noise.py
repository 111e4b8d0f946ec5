"""The gradient noise scale from small-batch gradients as a training loop holds them, against McCandlish et al.'s
estimators written out (``curvature_support.noise_scale_by_formula``)."""

import pytest
import torch
from torch import nn

from curvature_support import noise_scale_by_formula
from optiscope.curvature import gradient_noise_scale


def test_sparse_gradients_of_an_embedding_are_taken_as_their_dense_values():
    """``p.grad`` of ``nn.Embedding(sparse=True)`` is sparse (and uncoalesced: an id twice in a batch is two
    entries): the same estimates as from its dense values, where reshaping the sparse tensor had failed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(6, 3, sparse=True), nn.Flatten(), nn.Linear(6, 1)).double()
    ids, y = torch.randint(0, 6, (12, 2)), torch.randn(12, 1, dtype=torch.float64)
    passes = []
    for i in range(3):
        model.zero_grad()
        nn.functional.mse_loss(model(ids[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]).backward()
        passes.append([p.grad.clone() for p in model.parameters()])
    assert passes[0][0].is_sparse
    want = noise_scale_by_formula([[g.to_dense() for g in grads] for grads in passes], 4)
    got = gradient_noise_scale(passes, 4)
    assert got["noise_scale"] == pytest.approx(want["noise_scale"], rel=1e-9)
    assert got["grad_sq"] == pytest.approx(want["grad_sq"], rel=1e-9)
    assert got["snr"] == pytest.approx(want["snr"], rel=1e-9)
