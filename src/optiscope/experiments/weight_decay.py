r"""AdamW against Adam+L2 on a regularised regression whose parameter groups see different gradient scales.

The weights θ ∈ ℝᴾ come in groups; group j's features are scaled by s_j: x = s ⊙ z with z ~ N(0, I),
targets y = xᵀw* + σξ, true weights w* ~ N(0, I). Every step draws a fresh batch of B examples, takes
L = 1/(2B) Σ (xᵀθ − y)², and applies weight decay λ in one of two places:

    Adam+L2   g ← ∇L + λθ, then Adam        the decay is divided by √v̂ like the gradient, so each step
                                              it removes a fraction ηλ/(√v̂ + ε) of θ, per parameter
    AdamW     θ ← (1 − ηλ)θ, then Adam on ∇L  the same fraction ηλ of every weight, every step

Adam+L2 is still a descent method on L + ½λ‖θ‖², so on average it settles at the L2 optimum
θ_j = s_j²/(s_j² + λ) · w*_j (the population covariance is diag(s²)). AdamW settles where its normalised
step m̂/(√v̂ + ε) balances λθ, which depends on each group's gradient noise rather than on s_j² alone.

The experiment records both final weight sets, their shape (skewness, excess kurtosis, max |w|) — the
seed says AdamW's come out "symmetric, bounded" and Adam+L2's "skewed, longer tail" — and every
parameter's effective decay per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..optim import build_optimizer

RUNS = ("adamw", "adaml2")


def shape_stats(w: np.ndarray) -> dict[str, float]:
    """Mean, standard deviation, skewness m₃/m₂^{3/2}, excess kurtosis m₄/m₂² − 3 (central moments mₖ of
    the sample, no small-sample correction) and the largest |w|."""
    w = np.asarray(w, dtype=np.float64)
    centred = w - w.mean()
    m2, m3, m4 = (np.mean(centred**k) for k in (2, 3, 4))
    return {
        "mean": float(w.mean()),
        "std": float(np.sqrt(m2)),
        "skewness": float(m3 / m2**1.5),
        "excess_kurtosis": float(m4 / m2**2 - 3),
        "max_abs": float(np.abs(w).max()),
    }


def seed_claims(adamw: dict[str, float], adaml2: dict[str, float], n: int) -> dict[str, bool] | None:
    """The seed's words as tests on the two runs' ``shape_stats`` (n weights each). A sample counts as
    skewed when |skewness| > 2 SE, SE ≈ √(6/n) for a normal sample; one tail counts as heavier when the
    excess kurtosis is larger by more than 2 SE of a difference, √2 · √(24/n). None when a run diverged
    (statistics that are not finite test nothing)."""
    if not all(np.isfinite(value) for stats in (adamw, adaml2) for value in stats.values()):
        return None
    skew_se, kurtosis_difference_se = np.sqrt(6 / n), np.sqrt(2) * np.sqrt(24 / n)
    return {
        "adamw_symmetric": bool(abs(adamw["skewness"]) <= 2 * skew_se),
        "adaml2_skewed": bool(abs(adaml2["skewness"]) > 2 * skew_se),
        "adaml2_heavier_tails": bool(adaml2["excess_kurtosis"] - adamw["excess_kurtosis"] > 2 * kurtosis_difference_se),
        "adaml2_larger_max_abs": bool(adaml2["max_abs"] > adamw["max_abs"]),
    }


def l2_optimum(true_weights: np.ndarray, scales: np.ndarray, weight_decay: float) -> np.ndarray:
    """argmin of E[L] + ½λ‖θ‖² when the features have covariance diag(s²): s²/(s² + λ) · w*."""
    return scales**2 / (scales**2 + weight_decay) * true_weights


def weight_decay_story(
    group_scales: tuple[float, ...],
    weights_per_group: int,
    lr: float,
    weight_decay: float,
    steps: int,
    seed: int,
    batch_size: int = 64,
    label_noise: float = 0.5,
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    group = np.repeat(np.arange(len(group_scales)), weights_per_group)
    scales = torch.tensor(np.asarray(group_scales)[group], dtype=torch.float64)
    true_weights = torch.randn(len(group), generator=generator, dtype=torch.float64)
    weights = {name: torch.zeros(len(group), dtype=torch.float64, requires_grad=True) for name in RUNS}
    # fused=False: on a CPU torch's fused Adam kernel spreads even a few hundred elements over threads,
    # which on a busy machine costs milliseconds a step; the for-loop path is the same update.
    optimizers = {
        name: build_optimizer(name, [{"params": [w], "fused": False}], lr, weight_decay) for name, w in weights.items()
    }
    for _ in range(steps):
        features = torch.randn(batch_size, len(group), generator=generator, dtype=torch.float64) * scales
        noise = torch.randn(batch_size, generator=generator, dtype=torch.float64)
        targets = features @ true_weights + label_noise * noise
        for name, w in weights.items():
            w.grad = features.T @ (features @ w.detach() - targets) / batch_size
            optimizers[name].step()

    decay = {
        # decoupled: θ ← (1 − ηλ)θ, the same for every parameter
        "adamw": np.full(len(group), lr * weight_decay),
        # coupled: λθ enters g and is scaled by the effective learning rate η/(√v̂ + ε)
        "adaml2": weight_decay * optimizers["adaml2"].effective_lr(weights["adaml2"]).numpy(),
    }
    optimum = l2_optimum(true_weights.numpy(), scales.numpy(), weight_decay)
    runs = {}
    for name, w in weights.items():
        final = w.detach().numpy()
        runs[name] = {
            "final_weights": final.tolist(),
            "stats": shape_stats(final),
            "group_stats": [shape_stats(final[group == j]) for j in range(len(group_scales))],
            "effective_decay": decay[name].tolist(),
            "effective_decay_median": [float(np.median(decay[name][group == j])) for j in range(len(group_scales))],
            "rms_distance_to_l2_optimum": float(np.sqrt(np.mean((final - optimum) ** 2))),
        }
    return {
        "group_scales": list(group_scales),
        "group": group.tolist(),
        "lr": lr,
        "weight_decay": weight_decay,
        "steps": steps,
        "batch_size": batch_size,
        "label_noise": label_noise,
        "true_weights": true_weights.tolist(),
        "l2_optimum": optimum.tolist(),
        "runs": runs,
        "skewness_standard_error": float(np.sqrt(6 / len(group))),
        "seed_claims": seed_claims(runs["adamw"]["stats"], runs["adaml2"]["stats"], len(group)),
    }
