r"""Adam with and without bias correction over its first steps, on the seed's worked example f(x) = x².

Adam's moments start at m₀ = v₀ = 0, so early on m_t and v_t are shrunk towards zero by 1 − β1ᵗ and
1 − β2ᵗ. Bias correction divides those factors out: m̂ = m/(1 − β1ᵗ), v̂ = v/(1 − β2ᵗ). Without it, for
a gradient that keeps its sign and size, the step is η · (1 − β1ᵗ)/√(1 − β2ᵗ) instead of η: √0.001 ≈
0.032 makes the first step 0.1/0.032 ≈ 3.2 η, and the factor peaks near 6.6 η at t = 12 before it
decays to 1 over thousands of steps (β2 = 0.999 remembers for ~1000 steps). The experiment measures the
first step, the largest early step, and how far each run overshoots the minimum x = 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..optim import build_optimizer

RUNS = ("adam", "adam-no-bc")


def predicted_step_ratio(steps: int, beta1: float, beta2: float) -> np.ndarray:
    """(1 − β1ᵗ)/√(1 − β2ᵗ) for t = 1 … steps: the uncorrected step over η for a constant gradient."""
    t = np.arange(1, steps + 1, dtype=np.float64)
    return (1 - beta1**t) / np.sqrt(1 - beta2**t)


def descend_parabola(name: str, lr: float, start: float, steps: int) -> tuple[np.ndarray, tuple[float, float]]:
    """x_0 … x_steps of optimizer ``name`` on f(x) = x² (g = 2x) from x_0 = ``start``, and its betas."""
    x = torch.tensor([start], dtype=torch.float64, requires_grad=True)
    optimizer = build_optimizer(name, [x], lr)
    path = np.empty(steps + 1)
    path[0] = start
    for t in range(steps):
        x.grad = 2 * x.detach()
        optimizer.step()
        path[t + 1] = float(x.detach())
    return path, optimizer.defaults["betas"]


def first_not_finite(path: np.ndarray) -> int | None:
    """The first step whose x is inf or NaN (the run diverged there), None if every x is finite."""
    bad = np.flatnonzero(~np.isfinite(path))
    return int(bad[0]) if bad.size else None


def bias_correction_story(lr: float, start: float, steps: int) -> dict[str, Any]:
    runs = {}
    for name in RUNS:
        path, (beta1, beta2) = descend_parabola(name, lr, start, steps)
        diverged_at = first_not_finite(path)
        # the largest step and the overshoot are read where x is still finite: past that, argmax finds NaN
        reached = path[:diverged_at]
        step_sizes = np.abs(np.diff(reached))
        crossed = np.nonzero(np.sign(reached[1:]) != np.sign(start))[0]  # NaN's sign is no crossing
        runs[name] = {
            "x": path.tolist(),
            "diverged_at": diverged_at,
            "first_step": float(abs(path[1] - path[0])),
            "largest_step": float(step_sizes.max()) if step_sizes.size else None,
            "largest_step_at": int(step_sizes.argmax()) + 1 if step_sizes.size else None,
            "first_crossing": int(crossed[0]) + 1 if crossed.size else None,
            # the farthest point beyond the minimum on the far side (0 if it never crosses)
            "overshoot": float(np.max(-np.sign(start) * reached, initial=0.0)),
            "final_x": float(path[-1]),
        }
    t = np.arange(1, steps + 1, dtype=np.float64)
    return {
        "lr": lr,
        "start": start,
        "steps": steps,
        "beta1": beta1,
        "beta2": beta2,
        "runs": runs,
        "first_moment_correction": (1 - beta1**t).tolist(),
        "second_moment_correction": (1 - beta2**t).tolist(),
        "predicted_uncorrected_step_ratio": predicted_step_ratio(steps, beta1, beta2).tolist(),
    }
