r"""The gradient noise scale (McCandlish et al., 2018, "An Empirical Model of Large-Batch Training").

Per-example gradients have mean G and covariance Σ; a batch of B examples has E|G_B|² = |G|² + tr(Σ)/B.
Given n gradients G_small of batches of b examples each (the micro-batches of one step, or the ranks of a
DDP job) and their mean G_big over B = n·b examples, the unbiased estimators of their Appendix A are

    |G|²   ≈ (B |G_big|² − b ⟨|G_small|²⟩) / (B − b)
    tr(Σ)  ≈ (⟨|G_small|²⟩ − |G_big|²) / (1/b − 1/B)

and the simple noise scale is B_simple = tr(Σ)/|G|²: the batch size at which noise and signal in a
gradient are equal. Both estimates are noisy (|G|² can come out negative); McCandlish et al. average
them over steps before dividing, which a caller can do with the returned parts.

Per parameter tensor p the same estimators give a gradient signal-to-noise ratio

    snr_p = |G_p|² / (tr(Σ_p)/b),

the squared signal over the noise of one small batch's gradient of p (cf. the GSNR of Liu et al., 2020).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import is_count
from ..collectives import all_gather
from .hvp import dense


def gradient_noise_scale(small: Sequence[Sequence[Tensor]], batch_size: int) -> dict[str, Any]:
    """McCandlish et al.'s gradient noise scale B_simple and per-parameter gradient SNR from small batches.

    From n ≥ 2 gradients G_small of batches of b examples each and their mean G_big over B = n·b examples, the
    unbiased estimators |G|² ≈ (B|G_big|² − b⟨|G_small|²⟩)/(B − b) and
    tr(Σ) ≈ (⟨|G_small|²⟩ − |G_big|²)/(1/b − 1/B) give B_simple = tr(Σ)/|G|², the batch size at which noise
    and signal in a gradient are equal (McCandlish et al., 2018, Appendix A). Per parameter tensor p,
    snr_p = |G_p|²/(tr(Σ_p)/b).

    Args:
        small: n ≥ 2 gradients, each a list of per-parameter tensors in the same order (``[p.grad for p in
            params]`` after each micro-batch, or the ranks' gradients from
            [`rank_gradients`][optiscope.curvature.rank_gradients]); a None is a gradient of zeros there.
        batch_size: b, the examples in each small batch; at least 1.

    Returns:
        A dict: ``noise_scale`` (B_simple; NaN when |G|² ≤ 0), ``grad_sq`` (|G|²), ``trace_sigma`` (tr Σ),
            ``b_small`` (b), ``b_big`` (B) and ``snr`` (one float per parameter tensor, in the given order).

    Raises:
        ValueError: fewer than 2 gradients, ``batch_size`` not an integer ≥ 1, gradients holding different
            numbers of tensors, or one tensor with different shapes in different gradients.
        TypeError: an entry that is neither a tensor nor None.

    Examples:
        >>> import torch
        >>> from optiscope.curvature import gradient_noise_scale
        >>> small = [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 2.0])]]  # one parameter, two batches
        >>> out = gradient_noise_scale(small, batch_size=4)
        >>> out["grad_sq"], out["trace_sigma"], round(out["noise_scale"], 4), out["snr"]
        (7.0, 8.0, 1.1429, [3.5])

    Notes:
        - Both estimators are noisy: near a minimum, where the mean gradient is small against its noise, |G|²
          can come out negative; B_simple is then NaN (the console prints ``B_simple nan``) and that tensor's
          SNR negative. McCandlish et al. average |G|² and tr(Σ) over many steps before dividing, which the
          returned parts allow (the monitor records them as ``curvature.grad_sq`` and
          ``curvature.trace_sigma``).
        - A None (a ``p.grad`` that a batch did not reach: an unused head) counts as zeros; a tensor no batch
          reached has neither signal nor noise (SNR NaN). Sparse gradients (``nn.Embedding(sparse=True)``) are
          read as their dense values; sums are in float64.
        - Tested on linear regression, whose gradient covariance is known in closed form.
    """
    n = len(small)
    if n < 2:
        raise ValueError(f"gradient_noise_scale: needs at least 2 small-batch gradients, got {n}")
    if not is_count(batch_size):
        raise ValueError(f"gradient_noise_scale: batch_size={batch_size!r} must be an integer >= 1")
    lengths = sorted({len(grads) for grads in small})
    if len(lengths) > 1:
        raise ValueError(
            f"gradient_noise_scale: the small-batch gradients hold {lengths} tensors; each must hold one per "
            "parameter, in the same order"
        )
    small_sq, big_sq = [], []
    for i, grads in enumerate(zip(*small, strict=True)):  # per parameter tensor
        wrong = next((g for g in grads if g is not None and not isinstance(g, Tensor)), None)
        if wrong is not None:
            raise TypeError(
                f"gradient_noise_scale: tensor {i} of a small-batch gradient is a {type(wrong).__name__}; give "
                "tensors (or None for a parameter the batch did not reach)"
            )
        grads = [None if g is None else dense(g) for g in grads]  # an nn.Embedding(sparse=True)'s are sparse
        present = [g for g in grads if g is not None]
        if not present:  # no batch reached it: no signal, no noise
            small_sq.append(0.0)
            big_sq.append(0.0)
            continue
        grads = [torch.zeros_like(present[0]) if g is None else g for g in grads]
        shapes = sorted({tuple(g.shape) for g in grads})
        if len(shapes) > 1:
            raise ValueError(
                f"gradient_noise_scale: tensor {i} has shapes {shapes} in different small-batch gradients; each "
                "must hold one tensor per parameter, in the same order"
            )
        stacked = torch.stack([g.detach().double().reshape(-1) for g in grads])
        small_sq.append(float((stacked**2).sum(1).mean()))
        big_sq.append(float((stacked.mean(0) ** 2).sum()))
    return noise_scale_from_norms(small_sq, big_sq, batch_size, n)


def rank_gradients(grads: Sequence[Tensor]) -> list[list[Tensor]]:
    """Every rank's local gradients, gathered onto every rank: the small batches of a DDP step.

    Call it on each rank with that rank's gradients before DDP averages them; the result feeds
    [`gradient_noise_scale`][optiscope.curvature.gradient_noise_scale] with no extra backward pass
    (``batch_size`` = the examples per rank). A collective: every rank must call it.

    Args:
        grads: this rank's gradients, one tensor per parameter in the same order on every rank (sparse ones are
            read as their dense values).

    Returns:
        One list of tensors per rank, in rank order, each shaped like ``grads``; ``[list(grads)]`` without an
            initialised process group.

    Examples:
        >>> import torch
        >>> from optiscope.curvature import rank_gradients
        >>> rank_gradients([torch.ones(2)])  # no process group: this process's own
        [[tensor([1., 1.])]]

    Notes:
        The gradients travel as one flat buffer in one ``all_gather``, on their device (a CUDA one for NCCL).
        The monitor gets the same numbers at no cost from its DDP communication hook
        (``Curvature(..., rank_batch_size=B)``), which keeps each rank's local squared norms before averaging.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [list(grads)]
    grads = [dense(g) for g in grads]
    flat = torch.cat([g.reshape(-1) for g in grads])
    gathered = all_gather(flat)
    sizes = [g.numel() for g in grads]
    return [[part.view_as(g) for part, g in zip(torch.split(flat_r, sizes), grads, strict=True)] for flat_r in gathered]


def noise_scale_from_norms(
    small_sq: Sequence[float], big_sq: Sequence[float], batch_size: int, count: int
) -> dict[str, Any]:
    """McCandlish et al.'s estimators from squared gradient norms alone, all a DDP job's ranks need to share.

    Per parameter tensor p, with b = ``batch_size`` and B = ``count``·b:
    |G_p|² ≈ (B|G_big,p|² − b⟨|G_small,p|²⟩)/(B − b) and tr(Σ_p) ≈ (⟨|G_small,p|²⟩ − |G_big,p|²)/(1/b − 1/B),
    summed over p for B_simple = tr(Σ)/|G|², and snr_p = |G_p|²/(tr(Σ_p)/b).

    Args:
        small_sq: per parameter tensor, ⟨|G_small,p|²⟩, the mean over the small batches of their squared norms.
        big_sq: per parameter tensor, |G_big,p|², the squared norm of the small batches' mean gradient; as
            long as ``small_sq``.
        batch_size: b, the examples in each small batch; at least 1.
        count: n, the number of small batches; at least 2.

    Returns:
        The dict of [`gradient_noise_scale`][optiscope.curvature.gradient_noise_scale]: ``noise_scale`` (NaN
            when |G|² ≤ 0), ``grad_sq``, ``trace_sigma``, ``b_small``, ``b_big`` and ``snr`` (inf where
            tr(Σ_p) ≤ 0; NaN where a norm is NaN, and for a gradient 0 in every small batch, which has neither
            signal nor noise).

    Raises:
        ValueError: ``count`` not an integer ≥ 2, ``batch_size`` not an integer ≥ 1, or ``small_sq`` and
            ``big_sq`` of different lengths.

    Examples:
        Two batches of 4 with gradients (1, 2) and (3, 2): ⟨|G_small|²⟩ = (5 + 13)/2 = 9, |G_big|² = |(2, 2)|² = 8.

        >>> from optiscope.curvature import noise_scale_from_norms
        >>> out = noise_scale_from_norms([9.0], [8.0], batch_size=4, count=2)
        >>> out["grad_sq"], out["trace_sigma"], round(out["noise_scale"], 4), out["b_big"]
        (7.0, 8.0, 1.1429, 8)
    """
    if not is_count(count, 2):
        raise ValueError(f"noise_scale_from_norms: count={count!r} must be an integer >= 2 (small batches)")
    if not is_count(batch_size):
        raise ValueError(f"noise_scale_from_norms: batch_size={batch_size!r} must be an integer >= 1")
    if len(small_sq) != len(big_sq):
        raise ValueError(
            f"noise_scale_from_norms: {len(small_sq)} small-batch norms but {len(big_sq)} big-batch norms; give one "
            "of each per parameter tensor"
        )
    b, big = batch_size, count * batch_size
    grad_sq, trace_sigma, snr = 0.0, 0.0, []
    for small, whole in zip(small_sq, big_sq, strict=True):
        g2 = (big * whole - b * small) / (big - b)
        s = (small - whole) / (1 / b - 1 / big)
        grad_sq, trace_sigma = grad_sq + g2, trace_sigma + s
        undefined = math.isnan(s) or math.isnan(g2) or small == whole == 0
        snr.append(math.nan if undefined else g2 / (s / b) if s > 0 else math.inf)
    return {
        "noise_scale": trace_sigma / grad_sq if grad_sq > 0 else math.nan,
        "grad_sq": grad_sq,
        "trace_sigma": trace_sigma,
        "b_small": b,
        "b_big": big,
        "snr": snr,
    }
