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
from .hvp import dense


def gradient_noise_scale(small: Sequence[Sequence[Tensor]], batch_size: int) -> dict[str, Any]:
    """B_simple from ``small``: n ≥ 2 gradients (each a list of per-parameter tensors, in the same
    order) of batches of ``batch_size`` examples each. A ``None`` (a ``p.grad`` that a batch did not reach: an
    unused head) is a gradient of zeros there.

    Returns ``noise_scale`` (NaN when |G|² ≤ 0), ``grad_sq`` (|G|²), ``trace_sigma`` (tr Σ),
    ``b_small``, ``b_big`` and ``snr`` (one value per parameter tensor, in the given order).
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
    """Every rank's local gradients (before DDP averages them), gathered onto every rank: the small
    batches of ``gradient_noise_scale`` at no extra backward pass. Without a process group, ``[grads]``."""
    if not (dist.is_available() and dist.is_initialized()):
        return [list(grads)]
    grads = [dense(g) for g in grads]
    flat = torch.cat([g.reshape(-1) for g in grads])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    sizes = [g.numel() for g in grads]
    return [[part.view_as(g) for part, g in zip(torch.split(flat_r, sizes), grads, strict=True)] for flat_r in gathered]


def noise_scale_from_norms(
    small_sq: Sequence[float], big_sq: Sequence[float], batch_size: int, count: int
) -> dict[str, Any]:
    """McCandlish et al.'s estimators from squared norms alone (all that a DDP job's ranks need to share).

    Per parameter tensor p, ``small_sq[p]`` = ⟨|G_small,p|²⟩ (the mean over ``count`` ≥ 2 small batches of
    ``batch_size`` examples each) and ``big_sq[p]`` = |G_big,p|² (their mean, over B = count·batch_size):

        |G_p|² ≈ (B |G_big,p|² − b ⟨|G_small,p|²⟩) / (B − b),   tr(Σ_p) ≈ (⟨|G_small,p|²⟩ − |G_big,p|²) / (1/b − 1/B),

    summed over p for B_simple = tr(Σ)/|G|² (NaN when |G|² ≤ 0), and snr_p = |G_p|² / (tr(Σ_p)/b) (inf when
    tr(Σ_p) ≤ 0; NaN where a norm is NaN, and for a gradient that is 0 in every small batch, which has neither
    signal nor noise). Returns the keys of ``gradient_noise_scale``.
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
