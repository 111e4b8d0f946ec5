r"""Curvature on the monitor's schedule: sharpness against the optimizer's threshold, while training.

``Monitor(..., curvature=Curvature(batch, loss_fn, every=100))`` measures, every ``every`` optimizer steps
and right after the step (at the parameters and optimizer state that the *next* step will use), on the
fixed ``batch``:

    sharpness              λ₁(H), or λ₁(P⁻¹H) for Adam-family optimizers (Lanczos, warm-started from
                           the previous measurement's top eigenvector)
    threshold              the optimizer's stability threshold (2/η, (2 + 2β)/η, 38/η, …) or None
    sharpness/threshold    above 1: unstable along the top eigenvector
    curvature/update       dᵀHd/dᵀd (dᵀHd/dᵀPd preconditioned) along the update just taken
    curvature/gradient     the same along the gradient on ``batch``
    hessian_trace          Hutchinson's estimate (``trace_probes`` > 0)
    noise_scale            McCandlish et al.'s B_simple from ``micro_batches`` ≥ 2 slices of ``batch``

Every rank of a DDP job computes the same values when it is given the same ``batch`` (the parameters and
optimizer states are identical), so records agree across ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..curvature import HessianOperator, gradient_noise_scale, hessian_trace, sharpness
from ..curvature.directional import directional_curvature

KEYS = (
    "sharpness",
    "threshold",
    "sharpness/threshold",
    "curvature/update",
    "curvature/gradient",
    "hessian_trace",
    "noise_scale",
)


@dataclass(frozen=True)
class Curvature:
    """What the monitor measures every ``every`` steps on the fixed ``batch`` with ``loss_fn(model, batch)``.

    ``k`` eigenvalues to relative residual ``tol`` within ``max_hvps`` Hessian-vector products;
    ``directions``: curvature along the update and the gradient (2 products and a gradient);
    ``trace_probes``: Hutchinson probes (0: no trace); ``micro_batches``: slices of ``batch`` along its
    first dimension for the noise scale (0: none; it must divide the batch); ``dtype``: e.g. float64.
    """

    batch: Any
    loss_fn: Callable[[nn.Module, Any], Tensor]
    every: int = 100
    k: int = 1
    tol: float = 1e-3
    max_hvps: int = 50
    directions: bool = True
    trace_probes: int = 0
    micro_batches: int = 0
    dtype: torch.dtype | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("every", "k", "max_hvps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"Curvature: {name}={value!r} must be an integer >= 1")
        for name in ("trace_probes", "micro_batches"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"Curvature: {name}={value!r} must be an integer >= 0")
        if self.micro_batches == 1:
            raise ValueError("Curvature: micro_batches=1 cannot estimate a noise scale; give 0 (off) or >= 2")
        if self.micro_batches:
            split_batch(self.batch, self.micro_batches)  # fails now, not at step 100

    def due(self, step: int) -> bool:
        return step % self.every == 0


def split_batch(batch: Any, parts: int) -> list[Any]:
    """``batch`` (a tensor, or a tuple / list / dict of tensors) cut into ``parts`` equal slices along dim 0."""
    if isinstance(batch, Tensor):
        if batch.ndim == 0 or batch.shape[0] % parts:
            raise ValueError(
                f"Curvature: a batch of {tuple(batch.shape)} cannot be cut into {parts} equal micro-batches"
            )
        return list(batch.chunk(parts))
    if isinstance(batch, tuple | list):
        columns = [split_batch(x, parts) for x in batch]
        return [type(batch)(row) for row in zip(*columns, strict=True)]
    if isinstance(batch, dict):
        columns = {k: split_batch(v, parts) for k, v in batch.items()}
        return [{k: columns[k][i] for k in batch} for i in range(parts)]
    raise ValueError(f"Curvature: cannot cut a batch of type {type(batch).__name__} into micro-batches")


def measure(
    config: Curvature,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    update: dict[int, Tensor] | None,
    init: Tensor | None,
) -> tuple[dict[str, Any], Tensor]:
    """The record entries (``KEYS`` plus ``curvature``: details) and the top eigenvector (next warm start)."""
    top = sharpness(
        model,
        config.loss_fn,
        config.batch,
        optimizer,
        k=config.k,
        tol=config.tol,
        max_hvps=config.max_hvps,
        init=init,
        seed=config.seed,
        dtype=config.dtype,
    )
    out: dict[str, Any] = {
        "sharpness": top["eigenvalues"][0],
        "threshold": top["threshold"],
        "sharpness/threshold": top["ratio"],
    }
    details: dict[str, Any] = {
        "eigenvalues": top["eigenvalues"],
        "label": top["label"],
        "preconditioned": top["preconditioned"],
        "hvps": top["hvps"],
        "residual": top["residuals"][0],
        "converged": top["converged"],
        "reason": top["reason"],
    }
    if config.directions:
        for name, direction in (("update", update), ("gradient", "gradient")):
            if direction is not None:
                c = directional_curvature(model, config.loss_fn, config.batch, direction, optimizer, dtype=config.dtype)
                out[f"curvature/{name}"] = c["curvature"]
                details[f"{name}_ratio"] = c["ratio"]
    if config.trace_probes:
        trace = hessian_trace(
            model, config.loss_fn, config.batch, config.trace_probes, seed=config.seed, dtype=config.dtype
        )
        out["hessian_trace"] = trace["trace"]
        details["trace_std_error"] = trace["std_error"]
    if config.micro_batches:
        op = HessianOperator(model, config.loss_fn, config.batch, dtype=config.dtype)
        parts = split_batch(config.batch, config.micro_batches)
        grads = [op.split(op.gradient(part)).values() for part in parts]
        noise = gradient_noise_scale([list(g) for g in grads], _batch_size(parts[0]))
        out["noise_scale"] = noise["noise_scale"]
        details.update(grad_sq=noise["grad_sq"], trace_sigma=noise["trace_sigma"])
        details["snr"] = dict(zip(op.names, noise["snr"], strict=True))
    return {**out, "curvature": details}, top["vector"]


def _batch_size(part: Any) -> int:
    first = part if isinstance(part, Tensor) else next(iter(part.values() if isinstance(part, dict) else part))
    return int(first.shape[0])
