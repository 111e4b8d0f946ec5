r"""Curvature along one direction: the optimizer's update, or the gradient.

For a direction d, the curvature of the loss along it is the Rayleigh quotient

    c(d) = dᵀ H d / dᵀ d,

and, for a preconditioned optimizer with P = diag(√v̂ + ε), the generalised quotient

    c_P(d) = dᵀ H d / dᵀ P d = wᵀ (P^{-1/2} H P^{-1/2}) w / wᵀ w,   w = P^{1/2} d,

which lies between the extreme eigenvalues of P⁻¹H and so is directly comparable with the same
stability threshold as the preconditioned sharpness. The loss-spike analyses of Adam watch exactly this
along the gradient and the update. The direction comes from the caller (``Monitor`` passes the update it
measured, ``probe.update_direction`` gives the next one), so curvature needs nothing from the layers above.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..checks import require_optimizer
from .hvp import LossFn
from .sharpness import against, direction_vector, in_operator_space, operator


def directional_curvature(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    direction: dict[str, Tensor] | dict[int, Tensor] | str = "gradient",
    optimizer: torch.optim.Optimizer | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """Curvature of the loss along one direction: the update, the gradient, or any other.

    c(d) = dᵀHd/dᵀd for SGD or without an optimizer; for Adam-family optimizers c_P(d) = dᵀHd/dᵀPd,
    P = diag(√v̂ + ε), a Rayleigh quotient of P⁻¹H that lies between its extreme eigenvalues and so compares
    with the same threshold as [`sharpness`][optiscope.curvature.sharpness]. One Hessian-vector product.

    Args:
        model: the module whose parameters span H (DDP, DataParallel and ``torch.compile`` wrappers are
            unwrapped).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss (a mean over the batch).
        batch: what ``loss_fn`` takes, held fixed: a tensor, or tuples, named tuples, lists and mappings of
            tensors, on the model's device.
        direction: ``"gradient"`` (the gradient the step sees on ``batch``: ∇L, or ∇L + λθ with coupled weight
            decay), or a dict of tensors keyed by parameter name or by ``id(param)``, each of its parameter's
            shape; parameters without an entry count as 0.
        optimizer: the optimizer whose preconditioner, weight decay and threshold apply; None for plain H and
            no threshold.
        dtype: a floating dtype to evaluate in (``torch.float64`` for double precision); None keeps the model's.

    Returns:
        A dict: ``curvature`` (float; NaN for a zero or non-finite direction), ``ratio`` (curvature/threshold,
            or None), ``preconditioned`` (whether it is c_P), ``threshold`` (float or None), ``label`` (e.g.
            "38/η"; "" without a threshold) and ``reason`` (why there is no threshold; None with one).

    Raises:
        ValueError: a ``direction`` that is neither ``"gradient"`` nor a dict of tensors, a tensor of the wrong
            shape, a name that is not the model's, keys none of which is a parameter H is taken over; the
            batch, ``loss_fn``, ``dtype`` or optimizer faults that
            [`sharpness`][optiscope.curvature.sharpness] refuses.
        TypeError: ``optimizer`` not an optimizer, ``loss_fn`` not callable, or ``model`` not an ``nn.Module``
            (with an optimizer given, the last is an AttributeError today).

    Examples:
        On L = ½ Σ aᵢwᵢ² with a = (10, 1), H = diag(10, 1):

        >>> import torch
        >>> from optiscope.curvature import directional_curvature
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> def loss_fn(m, a):
        ...     return 0.5 * (a * m.weight[0] ** 2).sum()
        >>> a = torch.tensor([10.0, 1.0])
        >>> out = directional_curvature(model, loss_fn, a, {"weight": torch.tensor([[1.0, 0.0]])})
        >>> round(out["curvature"], 4), out["reason"]
        (10.0, 'no optimizer given')
        >>> with torch.no_grad():
        ...     _ = model.weight.fill_(1.0)
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> out = directional_curvature(model, loss_fn, a, "gradient", sgd)  # g = (10, 1): (1000 + 1)/101
        >>> round(out["curvature"], 4), out["label"], round(out["ratio"], 4)
        (9.9109, '2/η', 0.4955)

    Notes:
        - H is taken over the same parameters and objective as in [`sharpness`][optiscope.curvature.sharpness]
          (those the optimizer moves; −H with ``maximize=True``; H + λI with coupled decay, plus cλ for
          decoupled decay), with the model left as it was. Entries of parameters H is not taken over (frozen,
          not moved by the optimizer, or another module's ids) are left out.
        - Names may be the model's own or its DDP or ``torch.compile`` wrapper's ("module.", "_orig_mod.").
        - The quotient is taken in float64 over a unit vector: a float16 model's dᵀHd and dᵀd over an
          unnormalised direction (a gradient) would pass float16's 65504 where their ratio does not.
        - Curvature sits below ``probe`` in the layers, so the direction is an argument: the monitor passes the
          update it measured, ``probe.update_direction`` gives the next one. The loss-spike analyses of Adam
          watch this quotient along the gradient and the update.
    """
    if optimizer is not None:
        require_optimizer(optimizer, "directional_curvature")
    objective = operator(model, loss_fn, batch, optimizer, dtype)
    stability = objective.stability
    w = in_operator_space(direction_vector(objective, direction), objective.scale).double()
    length = w.norm()
    value = math.nan
    if length > 0 and torch.isfinite(length):
        # a unit vector into the product, and the quotient in float64: a float16 model's dᵀHd and dᵀd over an
        # unnormalised direction (a gradient) pass float16's 65504 where their ratio does not
        u = (w / length).to(objective.op.dtype)
        u64 = u.double()
        value = float(torch.dot(u64, objective.matvec(u).double()) / torch.dot(u64, u64))
    return {
        **against(value, stability.threshold),
        "preconditioned": objective.scale is not None,
        "threshold": stability.threshold,
        "label": stability.label,
        "reason": stability.reason,
    }
