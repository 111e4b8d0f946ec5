r"""The learning-rate protocol as pure functions of what has been measured.

Grid positions are integers k. In the automatic grid, position k is the learning rate
η_k = η₀ · √10^k rounded to three significant digits, where η₀ is the experiment's usual learning rate
for that optimizer: half a decade between neighbours, so the grid covers a decade in two steps and the
tuned η is within a factor √10^{1/2} ≈ 1.78 of the best on the grid line. An explicit grid (``--lrs``)
has position k = its k-th learning rate in increasing order and is never extended.

The protocol, for one optimizer with seeds s₀ … s_{N−1}:

1. run positions −1, 0, 1 at seed s₀;
2. while the best position is at an end of the grid (and the grid may grow that way), run the next
   position beyond it at s₀ — so the best learning rate ends up interior, with a worse value each side;
   while no position has a finite value yet, run the next one below the grid while its lowest learning rate
   diverged or crashed (divergence says "lower"), the next one above it while its highest finished without
   reaching the objective's target (an η too small to get there in the steps given says "higher"), and
   none when the lowest missed the target and the highest diverged (no η of this grid both trains and
   gets there);
3. run every seed at the best position and its two neighbours; the *tuned* position is the one of the
   positions run with every seed whose mean is the best (``tuned_position``);
4. run the fresh seeds at the tuned position: seeds that chose nothing, so that their mean is an honest
   estimate of the tuned optimizer. The mean of the seeds that chose it is biased towards the good side,
   being the best of (usually) three noisy means: for positions of equal quality whose seed noise σ is
   independent between them, by at least 0.846·σ/√N in expectation (the expected largest of three
   standard normals), and more as the first seed also chose the three (0.91·σ/√N simulated at N = 3;
   tested), as large as the differences a comparison wants to resolve. (The same seed at neighbouring
   positions starts from the same weights, so its noise is partly shared and the bias smaller, not nil.)

Values are objective values where lower is better (``sign`` flips a maximised objective); a trial that
diverged, crashed or never reached its target has +inf (the worst), so it is never the best.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

FACTOR = math.sqrt(10)
#: How far the automatic grid may grow past its first three points on each side, at ``FACTOR`` (√10^7: 3.5
#: decades); a finer grid grows as far in decades (``reach``).
MAX_EXTENSIONS = 6
INITIAL = (-1, 0, 1)


def reach(factor: float = FACTOR) -> int:
    """The farthest position the automatic grid at ``factor`` may reach on each side: as many decades as
    1 + ``MAX_EXTENSIONS`` positions at √10 (3.5), so a finer grid takes more, smaller steps (√2: 23)."""
    return max(1 + MAX_EXTENSIONS, round((1 + MAX_EXTENSIONS) * math.log(FACTOR) / math.log(factor)))


def auto_lr(centre: float, k: int, factor: float = FACTOR) -> float:
    """η_k = centre · factor^k, rounded to three significant digits (the name of the trial's directory)."""
    return float(f"{centre * factor**k:.3g}")


def best_position(values: Mapping[int, float]) -> int | None:
    """The position with the lowest value (ties: the one nearest the centre, then the lower); None when
    every value is the worst (+inf) — nothing was learned about where the optimum is."""
    finite = {k: v for k, v in values.items() if v < math.inf}
    if not finite:
        return None
    return min(finite, key=lambda k: (finite[k], abs(k), k))


def tuned_position(done: Mapping[tuple[int, int], float], seeds: Sequence[int]) -> int | None:
    """Of the positions run with every one of ``seeds``, the one with the best (lowest) mean value (ties:
    the lower position, the lower η); None when none has a finite mean."""
    means = {}
    for k in {k for k, _ in done}:
        if all((k, s) in done for s in seeds):
            means[k] = math.fsum(done[(k, s)] for s in seeds) / len(seeds)
    finite = {k: m for k, m in means.items() if math.isfinite(m)}
    return min(finite, key=lambda k: (finite[k], k)) if finite else None


def next_trials(
    done: Mapping[tuple[int, int], float],
    seeds: Sequence[int],
    bounds: tuple[int, int],
    initial: Sequence[int],
    fresh: Sequence[int] = (),
    missed: Collection[int] = (),
) -> list[tuple[int, int]]:
    """The (position, seed) trials to run next for one optimizer, given ``done`` (position, seed) ->
    value; an empty list when its sweep is complete. ``seeds`` choose the tuned position, ``fresh`` seeds
    are then run at it; ``bounds`` limits the positions the grid may reach; ``missed`` are the positions
    whose first-seed trial finished (neither diverged nor crashed) with the worst value: it never reached
    the objective's target."""
    first = seeds[0]
    grid = {k: v for (k, s), v in done.items() if s == first}
    missing = [(k, first) for k in initial if k not in grid]
    if missing:
        return missing
    best = best_position(grid)
    low, high = min(grid), max(grid)
    if best is None:  # nothing finite yet: the way the failures at the grid's ends point, if it may grow so
        if low not in missed:
            return [(low - 1, first)] if low - 1 >= bounds[0] else []
        return [(high + 1, first)] if high in missed and high + 1 <= bounds[1] else []
    if best == low and low - 1 >= bounds[0]:
        return [(low - 1, first)]
    if best == high and high + 1 <= bounds[1]:
        return [(high + 1, first)]
    tuning = [(k, s) for k in neighbourhood(grid, best) for s in seeds if (k, s) not in done]
    if tuning:
        return tuning
    tuned = tuned_position({(k, s): v for (k, s), v in done.items() if s in seeds}, seeds)
    return [] if tuned is None else [(tuned, s) for s in fresh if (tuned, s) not in done]


def neighbourhood(grid: Mapping[int, float], best: int) -> list[int]:
    """``best`` and the grid positions next to it on each side (one side only at an end)."""
    positions = sorted(grid)
    i = positions.index(best)
    return positions[max(0, i - 1) : i + 2]


def is_interior(grid: Mapping[int, float], best: int | None) -> bool:
    """Has the grid a measured position on each side of ``best``?"""
    return best is not None and min(grid) < best < max(grid)
