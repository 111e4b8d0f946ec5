"""Gradient descent on a 2-D surface with one optimizer over a grid of learning rates, and the pick of
the best learning rate.

Each learning rate's point θ is its own param group of one optimizer: every rule used here is
element-wise, so the runs are independent, and one optimizer steps them all with less overhead.
A run stops at the first step where f(θ) − f* ≤ tolerance ("reached"), or where f(θ) − f* is not
finite or exceeds ``DIVERGED_FACTOR`` times its starting value ("diverged"), or after ``steps`` steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..optim import build_optimizer
from .surfaces import Surface

DIVERGED_FACTOR = 1e6
#: Stopping (tolerance reached, divergence) is checked every this many steps, for every step in between.
STOP_CHECK_EVERY = 64
#: Points of a path closer than this fraction of the plot's diagonal to the last kept one are dropped.
PATH_RESOLUTION = 1e-3
#: How many (log-spaced) steps of the f − f* curve results.json keeps.
GAP_POINTS = 200


def descend(
    surface: Surface, name: str, lrs: list[float], steps: int, tolerance: float, weight_decay: float = 0.0
) -> dict[str, Any]:
    """Run optimizer ``name`` (λ = ``weight_decay`` if it decays) from ``surface.start`` once per learning rate.

    Returns per run: ``reached_at`` and ``diverged_at`` (a step or None), ``final_gap`` (f − f* where
    it stopped), and the full ``path`` (n, 2) and ``gap`` (n,) arrays, n = the steps it ran + 1.
    """
    # The points are rows of one (runs, 2) tensor and their gradients rows of another: the optimizer
    # updates the rows in place, so θ and g of every run are read and written without a Python loop.
    theta = torch.tensor(surface.start, dtype=torch.float64).repeat(len(lrs), 1)
    gradients = torch.zeros_like(theta)
    points = list(theta.unbind(0))
    for point, gradient in zip(points, gradients.unbind(0), strict=True):
        point.grad = gradient
    groups = [{"params": [p], "lr": lr} for p, lr in zip(points, lrs, strict=True)]
    optimizer = build_optimizer(name, groups, lrs[0], weight_decay)
    path = torch.empty((steps + 1, len(lrs), 2), dtype=torch.float64)
    path[0] = theta
    gap0 = float(surface.f(theta[0]) - surface.f_star)
    limit = DIVERGED_FACTOR * max(gap0, tolerance)
    reached_at: list[int | None] = [None] * len(lrs)
    diverged_at: list[int | None] = [None] * len(lrs)
    stopped_at = [steps] * len(lrs)
    running = set(range(len(lrs)))
    # Stopping is checked once per chunk of steps, on the chunk's whole path at once: a run that stopped
    # inside a chunk takes a few steps more, which its results (cut at its stopping step) never show.
    for chunk_start in range(0, steps, STOP_CHECK_EVERY):
        chunk_end = min(chunk_start + STOP_CHECK_EVERY, steps)
        for t in range(chunk_start, chunk_end):
            gradients.copy_(surface.grad(theta))
            optimizer.step()
            path[t + 1] = theta
        gaps = surface.f(path[chunk_start + 1 : chunk_end + 1]) - surface.f_star
        done = (gaps <= tolerance) | ~(gaps <= limit)  # ~(x <= limit) also catches NaN
        for i in sorted(running):
            hits = done[:, i].nonzero()
            if len(hits):
                t = chunk_start + 1 + int(hits[0])
                (reached_at if bool(gaps[t - chunk_start - 1, i] <= tolerance) else diverged_at)[i] = t
                stopped_at[i] = t
                points[i].grad = None  # a group without gradients is not stepped again
                running.discard(i)
        if not running:
            break
    gap = [(surface.f(path[: stopped_at[i] + 1, i]) - surface.f_star).numpy() for i in range(len(lrs))]
    return {
        "lrs": list(lrs),
        "reached_at": reached_at,
        "diverged_at": diverged_at,
        "final_gap": [float(g[-1]) for g in gap],
        "path": [path[: stopped_at[i] + 1, i].numpy() for i in range(len(lrs))],
        "gap": gap,
    }


def best_run(runs: dict[str, Any]) -> int | None:
    """The learning rate (index) to show: the fewest steps to the tolerance; if none reached it, the
    smallest final f − f* among the runs that did not diverge; None if every run diverged. A tie goes to
    the smaller learning rate, so the pick does not depend on the order the grid was given in."""
    reached = [i for i, t in enumerate(runs["reached_at"]) if t is not None]
    if reached:
        return min(reached, key=lambda i: (runs["reached_at"][i], runs["lrs"][i]))
    alive = [i for i, t in enumerate(runs["diverged_at"]) if t is None]
    return min(alive, key=lambda i: (runs["final_gap"][i], runs["lrs"][i])) if alive else None


def thin_path(path: np.ndarray, extent: tuple[float, float, float, float]) -> list[list[float]]:
    """The path's points, dropping each one closer than PATH_RESOLUTION × (plot diagonal) to the last
    kept point: below a pixel when drawn, so the drawn shape is unchanged. First and last are kept."""
    x_min, x_max, y_min, y_max = extent
    resolution = PATH_RESOLUTION * math.hypot(x_max - x_min, y_max - y_min)
    kept = [path[0]]
    for point in path[1:-1]:
        if math.hypot(point[0] - kept[-1][0], point[1] - kept[-1][1]) >= resolution:
            kept.append(point)
    if len(path) > 1:
        kept.append(path[-1])
    return [[float(x), float(y)] for x, y in kept]


def log_sampled(values: np.ndarray) -> dict[str, list]:
    """``values`` (indexed by step 0 … n−1) at step 0 and at about GAP_POINTS log-spaced steps."""
    last = len(values) - 1
    at = np.unique(np.round(np.geomspace(1, max(last, 1), GAP_POINTS)).astype(int)) if last else np.array([], int)
    at = np.concatenate(([0], at[at <= last]))
    return {"steps": at.tolist(), "values": [float(values[t]) for t in at]}
