r"""Three 2-D loss surfaces f(θ), θ = (x, y), each showing one reason the optimizers evolved.

* ravine      f = ½ (x² + κ y²)              curvatures 1 and κ (the condition number): a step size
                                              stable across the steep y walls crawls along the x floor.
                                              Minimum f* = 0 at the origin.
* saddle      f = ½ x² − ½ μ y² + ¼ y⁴        a flat saddle at the origin (curvature −μ along y);
                                              minima f* = −μ²/4 at (0, ±√μ). Starting almost on the
                                              ridge, the gradient along y is tiny.
* rosenbrock  f = (1 − x)² + 100 (y − x²)²    a curved, flat-bottomed valley. Minimum f* = 0 at (1, 1).

Every function takes θ of shape (..., 2) and works on a batch of points at once; gradients are written
out by hand (the tests check them against finite differences).

The starts have four decimals on purpose: Lion moves every coordinate by exactly ±η, and from a start
whose distance to the minimum is a whole multiple of a grid η (Rosenbrock's classic (−1.2, 1) with
η = 0.01, say) it lands exactly on the minimum, a coincidence of the numbers rather than a property of
the method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

#: The saddle's negative curvature along y: small, so the saddle is flat and slow to leave.
SADDLE_MU = 0.1


@dataclass(frozen=True)
class Surface:
    name: str
    formula: str
    f: Callable[[Tensor], Tensor]
    grad: Callable[[Tensor], Tensor]
    start: tuple[float, float]
    minima: tuple[tuple[float, float], ...]
    f_star: float
    extent: tuple[float, float, float, float]  # x_min, x_max, y_min, y_max of the plot


def ravine_f(theta: Tensor, condition_number: float) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    return 0.5 * (x**2 + condition_number * y**2)


def ravine_grad(theta: Tensor, condition_number: float) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    return torch.stack((x, condition_number * y), dim=-1)


def saddle_f(theta: Tensor) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    return 0.5 * x**2 - 0.5 * SADDLE_MU * y**2 + 0.25 * y**4


def saddle_grad(theta: Tensor) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    return torch.stack((x, y**3 - SADDLE_MU * y), dim=-1)


def rosenbrock_f(theta: Tensor) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def rosenbrock_grad(theta: Tensor) -> Tensor:
    x, y = theta[..., 0], theta[..., 1]
    valley = y - x**2
    return torch.stack((-2 * (1 - x) - 400 * x * valley, 200 * valley), dim=-1)


def surfaces(condition_number: float) -> dict[str, Surface]:
    """The three surfaces, the ravine with condition number κ = ``condition_number``."""
    well = SADDLE_MU**0.5
    return {
        "ravine": Surface(
            name="ravine",
            formula=f"f = ½(x² + {condition_number:g}·y²)",
            f=partial(ravine_f, condition_number=condition_number),
            grad=partial(ravine_grad, condition_number=condition_number),
            start=(-3.7213, 0.9047),
            minima=((0.0, 0.0),),
            f_star=0.0,
            extent=(-4.6, 1.2, -1.3, 1.3),
        ),
        "saddle": Surface(
            name="saddle",
            formula=f"f = ½x² − {SADDLE_MU / 2:g}·y² + ¼y⁴",
            f=saddle_f,
            grad=saddle_grad,
            start=(-1.9371, 1e-3),
            minima=((0.0, well), (0.0, -well)),
            f_star=-(SADDLE_MU**2) / 4,
            extent=(-2.4, 1.2, -0.7, 0.7),
        ),
        "rosenbrock": Surface(
            name="rosenbrock",
            formula="f = (1 − x)² + 100(y − x²)²",
            f=rosenbrock_f,
            grad=rosenbrock_grad,
            start=(-1.2071, 1.0463),
            minima=((1.0, 1.0),),
            f_star=0.0,
            extent=(-1.6, 1.6, -0.5, 1.6),
        ),
    }
