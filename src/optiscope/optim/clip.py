r"""Global-norm gradient clipping: ``clip_grad_norm`` (its docstring has the formula)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from ..checks import is_number, positive
from .optimizer import grouped_by_device_and_dtype


class NonFiniteGradientError(ValueError):
    """The gradients' global norm is inf or nan; the message names the offending parameters.

    Raised by ``clip_grad_norm`` (with ``nonfinite="raise"``, its default) when a gradient g holds inf or
    nan. A ``ValueError``, so code that catches that catches this too. The message names up to five of the
    parameters (by their names from ``model.named_parameters()``, else by position and shape) and gives
    the global norm.

    Examples:
        >>> import torch
        >>> from optiscope.optim import NonFiniteGradientError, clip_grad_norm
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> w.grad = torch.tensor([float("nan"), 1.0])
        >>> try:
        ...     clip_grad_norm([("w", w)], max_norm=1.0)
        ... except NonFiniteGradientError as error:
        ...     print(error)
        clip_grad_norm: non-finite gradients (inf or nan) in 1 parameter(s): w; the global norm is nan
    """


def clip_grad_norm(
    params: Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Tensor,
    max_norm: float | Tensor,
    *,
    norm_type: float | Tensor = 2.0,
    nonfinite: str = "raise",
) -> Tensor:
    """Scale the gradients of ``params`` in place so that their global norm is at most ``max_norm``.

    With gradients g_1 … g_n and a threshold c, the global norm is ‖g‖ = (Σᵢ ‖gᵢ‖²)^½ (for ``norm_type``
    p, the p-norm of all entries together; the largest |entry| for p = ∞) and every gradient is scaled by
    min(1, c / (‖g‖ + 10⁻⁶)): the direction of the full step is kept, only its length is capped.

    Args:
        params: tensors, one tensor, or ``(name, tensor)`` pairs (``model.named_parameters()``), so that
            errors can name them; tensors without a gradient are skipped.
        max_norm: c, a finite number > 0 (or a 0-d tensor or NumPy number holding one).
        norm_type: p > 0: 2.0 for L2, ``math.inf`` for the largest entry (a 0-d tensor or NumPy number too).
        nonfinite: what to do when a gradient holds inf or nan: ``"raise"`` raises
            ``NonFiniteGradientError`` naming those parameters; ``"skip"`` leaves the gradients untouched and
            returns the non-finite norm, so that the caller can skip the step.

    Returns:
        The global norm *before* clipping, a 0-d tensor: float32, or float64 where a gradient is float64 or
        the float32 sum overflowed; ``tensor(0.)`` when no tensor has a gradient.

    Raises:
        ValueError: ``max_norm`` not a finite number > 0, ``norm_type`` not > 0, ``nonfinite`` neither
            ``"raise"`` nor ``"skip"``, or either number given as a tensor or array that is not 0-d.
        NonFiniteGradientError: a gradient holds inf or nan and ``nonfinite="raise"``.

    Examples:
        >>> import torch
        >>> from optiscope.optim import clip_grad_norm
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> w.grad = torch.tensor([3.0, 4.0])
        >>> clip_grad_norm([w], max_norm=1.0)  # the norm before clipping
        tensor(5.)
        >>> w.grad  # the same direction, norm 1
        tensor([0.6000, 0.8000])

    Notes:
        Gradients whose norm overflows float32 although every entry is finite are measured again in float64
        and clipped. ``max_norm`` and ``norm_type`` may be 0-d tensors or NumPy numbers, as torch's
        ``clip_grad_norm_`` takes them.
    """
    max_norm, norm_type = _scalar("max_norm", max_norm), _scalar("norm_type", norm_type)
    if not positive(max_norm):
        raise ValueError(f"clip_grad_norm: max_norm={max_norm!r} must be a finite number > 0")
    if not (is_number(norm_type) and norm_type > 0):
        raise ValueError(f"clip_grad_norm: norm_type={norm_type!r} must be > 0 (2.0 for L2, math.inf for max)")
    max_norm, norm_type = float(max_norm), float(norm_type)  # NumPy scalars too: torch's kernels want Python numbers
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"clip_grad_norm: nonfinite={nonfinite!r} must be 'raise' or 'skip'")
    named = _named(params)
    with_grads = [(name, p.grad) for name, p in named if p.grad is not None]
    grads = [g for _, g in with_grads]
    if not grads:
        return torch.tensor(0.0)
    total = _global_norm(grads, norm_type, None)
    if not torch.isfinite(total):
        bad = [name for name, g in with_grads if not torch.isfinite(g).all()]
        if not bad:  # every entry finite: only the float32 sum of squares overflowed
            total = _global_norm(grads, norm_type, torch.float64)
        elif nonfinite == "skip":
            return total
        else:
            raise NonFiniteGradientError(
                f"clip_grad_norm: non-finite gradients (inf or nan) in {len(bad)} parameter(s): "
                f"{', '.join(bad[:5])}{' …' if len(bad) > 5 else ''}; the global norm is {total.item()}"
            )
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for idx in grouped_by_device_and_dtype(grads).values():
        group = [grads[i] for i in idx]
        torch._foreach_mul_(group, scale.to(device=group[0].device, dtype=group[0].dtype))
    return total


def _scalar(name: str, x: object) -> object:
    """A 0-d tensor or NumPy array as the Python number it holds (torch.nn.utils.clip_grad_norm_ reads them so);
    anything else unchanged, for the checks after it to judge. A tensor or array of another shape is refused
    here, in one line, rather than printed whole in the checks' message."""
    if not (isinstance(x, Tensor) or (hasattr(x, "ndim") and hasattr(x, "item"))):
        return x
    if x.ndim != 0:
        raise ValueError(
            f"clip_grad_norm: {name} is a{' tensor' if isinstance(x, Tensor) else 'n array'} of shape "
            f"{tuple(x.shape)}; give a number or a 0-d tensor"
        )
    return x.item()


def _named(params: Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Tensor) -> list[tuple[str, Tensor]]:
    """(name, tensor) pairs; unnamed tensors are called by their position and shape."""
    items = [params] if isinstance(params, Tensor) else list(params)
    return [
        item if isinstance(item, tuple) else (f"#{i} shape {tuple(item.shape)}", item) for i, item in enumerate(items)
    ]


def _global_norm(grads: list[Tensor], norm_type: float, dtype: torch.dtype | None) -> Tensor:
    """‖(‖g₁‖, …, ‖gₙ‖)‖ in the gradients' precision (float64 if any is), or in ``dtype`` throughout."""
    if dtype is None:
        norms = []
        for idx in grouped_by_device_and_dtype(grads).values():
            norms.extend(torch._foreach_norm([grads[i] for i in idx], norm_type))
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    else:
        norms = [torch.linalg.vector_norm(g, norm_type, dtype=dtype) for g in grads]
    stacked = torch.stack([n.to(device=grads[0].device, dtype=dtype) for n in norms])
    return stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
