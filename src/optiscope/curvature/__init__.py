"""optiscope.curvature: why a step is stable or not — curvature against the optimizer's own threshold.

Pure functions of a model, a loss function ``loss_fn(model, batch)``, a fixed batch and (optionally) an
optimizer, built on Hessian-vector products (reverse-over-reverse on a gradient graph built once per call):

- ``sharpness``: top eigenvalues of H, or of P⁻¹H for Adam-family optimizers (Lanczos, warm-startable),
  with ``stability_threshold(optimizer)``: 2/η, (2 + 2β)/η, (2 + 2β₁)/((1 − β₁)η), or None with a reason;
- ``directional_curvature``: dᵀHd/dᵀd (dᵀHd/dᵀPd when preconditioned) along an update or the gradient;
- ``hessian_trace``: Hutchinson's estimate with its standard error;
- ``gradient_noise_scale``: McCandlish et al.'s B_simple and per-parameter gradient SNR from small batches.
"""

from .directional import directional_curvature
from .hvp import HessianOperator
from .lanczos import LanczosResult, lanczos
from .noise import gradient_noise_scale, noise_scale_from_norms, rank_gradients
from .sharpness import sharpness
from .thresholds import Stability, stability_threshold
from .trace import hessian_trace

__all__ = [
    "sharpness",
    "stability_threshold",
    "Stability",
    "directional_curvature",
    "hessian_trace",
    "gradient_noise_scale",
    "noise_scale_from_norms",
    "rank_gradients",
    "lanczos",
    "LanczosResult",
    "HessianOperator",
]
