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
    """Trace of the loss Hessian by Hutchinson's estimator, with its standard error.

    tr H ≈ (1/m) Σᵢ zᵢᵀ H zᵢ over m Rademacher vectors zᵢ (entries ±1 with equal probability), since
    E[zᵀHz] = tr H (Hutchinson, 1990); the standard error is the sample standard deviation over √m. One
    Hessian-vector product per probe.

    Args:
        model: the module whose parameters span H, every one that requires grad (DDP, DataParallel and
            ``torch.compile`` wrappers are unwrapped).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss (a mean over the batch).
        batch: what ``loss_fn`` takes, held fixed: a tensor, or tuples, named tuples, lists and mappings of
            tensors, on the model's device.
        probes: m, the number of Rademacher vectors; at least 1.
        seed: seed of the probes, an integer from ``-2**63`` to ``2**64 - 1``.
        dtype: a floating dtype to evaluate in (``torch.float64`` for double precision); None keeps the model's.

    Returns:
        A dict: ``trace`` (float), ``std_error`` (float; NaN for one probe) and ``probes`` (m).

    Raises:
        ValueError: ``probes`` or ``seed`` invalid, ``dtype`` not floating, an empty batch or one on another
            device than the model, a ``loss_fn`` that does not return a differentiable scalar, or a model with no
            parameter that requires grad.
        TypeError: ``model`` not an ``nn.Module`` or ``loss_fn`` not callable.

    Examples:
        On a diagonal H every probe gives the trace exactly:

        >>> import torch
        >>> from optiscope.curvature import hessian_trace
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> def loss_fn(m, a):  # ½ Σ aᵢwᵢ²: H = diag(a)
        ...     return 0.5 * (a * m.weight[0] ** 2).sum()
        >>> hessian_trace(model, loss_fn, torch.tensor([10.0, 1.0]), probes=4)
        {'trace': 11.0, 'std_error': 0.0, 'probes': 4}

    Notes:
        - The trace of the loss's own H, over every parameter that requires grad: no optimizer, no
          preconditioner, no weight decay. The model is left as it was, as in
          [`sharpness`][optiscope.curvature.sharpness] (eval mode, forked RNG, batch norms on batch
          statistics).
        - Each zᵀHz is summed in float64: a float16 model's, a sum over every parameter, passes float16's 65504
          long before H does.
        - Tested: within 3 standard errors of the exact trace on four seeds.
    """
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
