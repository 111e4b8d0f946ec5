r"""The methods that read a learning rate from a probe session, and the factors σ fitted for each.

Each method measures an η, most of them an *edge*: the η at which the optimizer's stability threshold c/η
(``curvature.thresholds``: 2/η for gradient descent, 3.8/η for heavy ball at β = 0.9, 38/η for Adam at β₁ = 0.9)
meets a curvature λ it measured, η_edge = c/λ; the suggestion is σ times it. They differ in what they measure and
where:

* ``sharpness`` — λ₁ of H (of P⁻¹H for an Adam-family optimizer, P = diag(√v̂ + ε)) at the weights as given,
  after a few steps at η = 0 that fill the optimizer's state without moving the weights; Lanczos on fresh batches,
  each measured after a step at η = 0 on it (P holds its gradient, as in the step that meets that curvature), while
  the budget lasts; the median taken. η_edge = c/λ₁.
* ``noise`` — not the edge but McCandlish et al.'s (2018) optimal step in a noisy quadratic model, from the same
  warm-up: the greedy step along the (preconditioned) mean gradient of the warm-up's batches, ε_max = ḠᵀP⁻¹Ḡ /
  (ḠᵀP⁻¹HP⁻¹Ḡ), shrunk by one batch's gradient noise over its signal N, ε_max/(1 + N), and divided by the steady
  gain of the optimizer's momentum (1/(1 − β) for heavy ball; 1 for Adam, whose m̂ is an average). Along a concave
  mean gradient it reads nothing.
* ``limits`` — the lower of the two: the edge where the curvature binds, the noise limit where the noise does.
* ``warmup`` — λ₁ again after a short warm-up at a safe η = ½·c/λ₀ (λ₀ measured as ``sharpness`` does, on part of
  the budget): the sharpness the first steps lead to.
* ``range-test`` — no curvature: an LR range test on the copy (η rising geometrically from 1e-6 to 1 over the
  budget, the loss smoothed) and its "valley" rule (2/3 of the way along the longest falling stretch of the loss).
  What an optimizer without a known threshold gets, said as a fallback.

σ and the band of each were fitted on the calibration tasks of the evaluation (``benchmarks/suggest_lr.py``,
``docs/experiments/suggest-lr.md``): σ = exp(median log(η*/η_edge)) over their cases, the band the 10th and 90th
percentiles of η*/η_suggested there. No held-out case was used. The calibration cases: ``lm`` at batch 12 and 4
and ``adder`` at batch 256 and 64, each with the five optimizers: 20 cases, 16 with a threshold (ADOPT has none);
``noise`` read an η on 6 of them only, the range test on all 20 as a method of its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .session import HVP_COST, Session

#: steps at η = 0 before the first measurement: they fill the optimizer's state (P) and give the noise scale its
#: gradients (at least 2)
WARM = 5
#: Lanczos products per sharpness measurement: at most, and the fewest worth taking
MAX_HVPS, MIN_HVPS = 20, 3
#: sharpness measurements at most (their median is taken)
MEASUREMENTS = 5
#: the warm-up's η, as a share of the edge its first measurement gives
SAFE = 0.5
#: the range test's η at its first and its last step (times the reference lr of each group)
RANGE = (1e-6, 1.0)
#: a range test stops once its smoothed loss exceeds this many times its lowest (Lightning's early stop)
DIVERGED = 4.0
#: the noise limit's passes: a directional curvature's graph and one product
NOISE_COST = 1 + HVP_COST


@dataclass(frozen=True)
class Method:
    """A way to read η_edge from a session, and its fitted factor σ and band (low/lr, high/lr)."""

    name: str
    measure: Callable[[Session], float | None]
    least: Callable[[Session], int]
    sigma: float
    band: tuple[float, float]
    #: whether it reads the optimizer's threshold (the others serve an optimizer without one)
    threshold: bool = True


def lanczos_cost(session: Session, hvps: int = MIN_HVPS) -> int:
    """The passes of one sharpness measurement: its step at η = 0 (Adam-family: P takes the batch's gradient), the
    gradient graph and ``hvps`` products."""
    return (1 if session.adaptive else 0) + 1 + HVP_COST * hvps


def warm(session: Session) -> int:
    """Steps at η = 0 before the first measurement: up to ``WARM``, a fifth of the budget, at least 2."""
    return min(WARM, max(2, int(0.2 * session.steps)))


def edge(session: Session, values: list[float | None]) -> float | None:
    """c/λ for the median λ of the positive ``values``; None without one."""
    positive = [v for v in values if v is not None and v > 0]
    if not positive or not session.coefficient:
        return None
    return session.coefficient / statistics.median(positive)


def hvps_for(session: Session, passes: float) -> int:
    """The products a sharpness measurement spending at most ``passes`` can take."""
    return max(MIN_HVPS, min(MAX_HVPS, int((passes - lanczos_cost(session, 0)) // HVP_COST)))


def start(session: Session, lanczos: bool = True, noise: bool = True) -> tuple[float | None, dict | None]:
    """The measurements at the weights as given: the warm-up at η = 0, then the noise limit (``noise``) and
    sharpness measurements on fresh batches while the budget lasts (``lanczos``); (η_edge, the noise limit)."""
    session.warm_up(warm(session))
    limit = session.noise_limit() if noise and session.remaining >= NOISE_COST else None
    values = []
    while lanczos and session.remaining >= lanczos_cost(session) and len(values) < MEASUREMENTS:
        values.append(session.sharpness(hvps_for(session, session.remaining)))
    if limit is not None:
        session.notes.append(
            f"noise: one batch's gradient noise over its signal N = {limit['noise']:.3g}, the greedy step along the "
            f"mean gradient {limit['greedy']:.3g}: the noise-limited step {limit['limit']:.3g}"
        )
    return edge(session, values), limit


def at_start(session: Session) -> float | None:
    return start(session, noise=False)[0]


def noise_limited(session: Session) -> float | None:
    limit = start(session, lanczos=False)[1]
    return None if limit is None else limit["limit"]


def either_limit(session: Session) -> float | None:
    """The lower of the stability edge and the noise limit: whichever binds first."""
    found, limit = start(session)
    if limit is None or found is None:
        return found
    session.notes.append(
        f"limits: the edge of stability η = {found:.3g}, the noise-limited step {limit['limit']:.3g}: "
        f"the {'noise' if limit['limit'] < found else 'edge'} binds"
    )
    return min(found, limit["limit"])


def after_warmup(session: Session) -> float | None:
    session.warm_up(warm(session))
    first = edge(session, [session.sharpness(hvps_for(session, 0.4 * session.steps - session.spent))])
    if first is None:
        return None
    while session.remaining - 1 >= lanczos_cost(session) and session.taken < 0.6 * session.steps:
        session.step(SAFE * first)
    return edge(session, [session.sharpness(hvps_for(session, session.remaining))]) or first


def range_test(session: Session) -> float | None:
    n = int(session.remaining)
    low, high = RANGE
    lrs = [low * (high / low) ** (j / max(1, n - 1)) for j in range(n)]
    beta = min(0.98, max(0.5, 1 - 10 / n))  # a window of about a tenth of the test: fastai's 0.98 at 500 steps
    smoothed: list[float] = []
    average = 0.0
    for j, lr in enumerate(lrs):
        loss = session.step(lr)
        if not math.isfinite(loss):
            break
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** (j + 1)))
        if smoothed[-1] > DIVERGED * min(smoothed):
            break
    return valley(lrs[: len(smoothed)], smoothed)


def valley(lrs: list[float], losses: list[float]) -> float | None:
    """The "valley" rule of an LR range test: the η two thirds of the way along the longest falling subsequence of
    the loss (fastai's rule, written here anew); None with fewer than three losses.

    Examples:
        >>> valley([1, 2, 3, 4, 5, 6, 7], [5.0, 4.0, 3.5, 3.0, 2.0, 2.5, 9.0])
        4
    """
    n = len(losses)
    if n < 3:
        return None
    # longest[i]: the length of the longest strictly falling subsequence ending at i; start[i]: where it starts
    longest, start = [1] * n, list(range(n))
    for i in range(n):
        for j in range(i):
            if losses[j] > losses[i] and longest[j] + 1 > longest[i]:
                longest[i], start[i] = longest[j] + 1, start[j]
    end = max(range(n), key=lambda i: (longest[i], -i))
    first = start[end]
    return lrs[first + round(2 * (end - first) / 3)]


def least_start(session: Session) -> int:
    return 2 + lanczos_cost(session)


def least_noise(session: Session) -> int:
    return 2 + NOISE_COST


def least_both(session: Session) -> int:
    return 2 + NOISE_COST + lanczos_cost(session)


def least_warmup(session: Session) -> int:
    return 2 + 2 * lanczos_cost(session) + 1


#: Every method, by name; the first is the default (the threshold-reading method that missed least when σ was fitted
#: on one calibration task and scored on the other). σ and the bands: fitted on the calibration tasks (module doc).
METHODS: dict[str, Method] = {
    "limits": Method("limits", either_limit, least_both, sigma=0.453, band=(0.267, 6.11)),
    "sharpness": Method("sharpness", at_start, least_start, sigma=0.378, band=(0.244, 9.65)),
    "noise": Method("noise", noise_limited, least_noise, sigma=0.332, band=(0.443, 1.27)),
    "warmup": Method("warmup", after_warmup, least_warmup, sigma=0.453, band=(0.032, 5.53)),
    "range-test": Method("range-test", range_test, lambda session: 8, sigma=3.53, band=(0.381, 4.21), threshold=False),
}
#: The method ``suggest_lr`` uses unless told otherwise.
DEFAULT_METHOD = next(iter(METHODS))
#: What an optimizer without a known stability threshold gets.
FALLBACK = "range-test"
