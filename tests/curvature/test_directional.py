"""Directional curvature along a direction the caller holds, against dᵀHd/dᵀd from the exact Hessian."""

import pytest
import torch
from torch import nn

from curvature_support import exact_hessian
from optiscope.curvature import directional_curvature


def _embedding_model(sparse):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 1)).double()


def test_a_sparse_gradient_is_a_direction_like_its_dense_twin():
    """The gradients of a model with ``nn.Embedding(sparse=True)`` (``p.grad`` sparse there) as the direction: the
    exact dᵀHd/dᵀd of the model with a dense embedding (the oracle), where reshaping the sparse tensor had failed."""
    ids, y = torch.randint(0, 10, (16, 3), generator=torch.Generator().manual_seed(1)), torch.randn(16, 1).double()

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    model = _embedding_model(True)
    loss_fn(model, (ids, y)).backward()
    assert model[0].weight.grad.is_sparse
    direction = {n: p.grad for n, p in model.named_parameters()}
    d = torch.cat([p.grad.to_dense().reshape(-1) for p in model.parameters()])
    H = exact_hessian(_embedding_model(False), loss_fn, (ids, y))
    out = directional_curvature(model, loss_fn, (ids, y), direction)
    assert out["curvature"] == pytest.approx(float(d @ H @ d / (d @ d)), rel=1e-8)
