r"""The trace of the loss Hessian by Hutchinson's estimator.

For Rademacher vectors z (entries ±1 with equal probability), E[zᵀ H z] = tr H (Hutchinson, 1990).
With m probes the estimate is the mean of zᵢᵀ H zᵢ, and its standard error is the sample standard
deviation over √m; one Hessian-vector product per probe.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..checks import SEEDS, is_count, is_seed
from .hvp import HessianOperator, LossFn


def hessian_trace(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    probes: int = 10,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """tr H of ``loss_fn(model, batch)``: ``{"trace", "std_error", "probes"}`` (``std_error`` is NaN for one probe)."""
    if not is_count(probes):
        raise ValueError(f"hessian_trace: probes={probes!r} must be an integer >= 1")
    if not is_seed(seed):
        raise ValueError(f"hessian_trace: seed={seed!r} must be {SEEDS} (a random seed)")
    op = HessianOperator(model, loss_fn, batch, dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(probes):
        z = op.random(generator, rademacher=True)
        # in float64: a float16 model's zᵀHz, a sum over every parameter, passes float16's 65504 long before H does
        samples.append(float(torch.dot(z.double(), op(z).double())))
    values = torch.tensor(samples, dtype=torch.float64)
    std_error = float(values.std() / math.sqrt(probes)) if probes > 1 else math.nan
    return {"trace": float(values.mean()), "std_error": std_error, "probes": probes}
