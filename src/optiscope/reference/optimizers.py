"""NumPy twins of the optimizers: the readable oracle the torch code is tested against.

The contract is the seed's: an optimizer receives a list of parameter dicts
``[{"params": ndarray, "grad": ndarray}, ...]`` and, on ``step()``, updates every ``"params"`` array
*in place* from its ``"grad"``. State lives in ``self.state[i]`` (i = the parameter's position) and is
updated in place too: ``m[...] = ...``, never ``m = ...``, which would leave the stored state stale (the
seed writes ``m[:]``, which fails on 0-d arrays). The step counter ``self.t`` is global and is
incremented *before* use, so bias corrections never divide by 1 − β⁰ = 0.

These classes are deliberately plain — one parameter at a time, the textbook formula on each line —
and share no code with ``optiscope.optim``; agreement between the two is evidence, not tautology.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Optimizer(ABC):
    def __init__(self, params: list[dict], lr: float) -> None:
        for i, p in enumerate(params):
            if set(p) != {"params", "grad"} or p["params"].shape != p["grad"].shape:
                raise ValueError(f"params[{i}] must be a dict with 'params' and 'grad' arrays of the same shape")
        self.params = params
        self.lr = lr
        self.state: dict[int, dict[str, np.ndarray]] = {}
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p["grad"][...] = 0.0

    def step(self) -> None:
        self.t += 1
        for i, p in enumerate(self.params):
            self.update(i, p["params"], p["grad"])

    @abstractmethod
    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        """Update parameter i (``theta``, in place) from its gradient, creating its state on first use."""


class SGD(Optimizer):
    """θ ← θ − η d with d = g, the momentum buffer b = μ b + (1 − τ) g, or Nesterov's g + μ b."""

    def __init__(
        self,
        params: list[dict],
        lr: float = 0.01,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr)
        if nesterov and momentum == 0.0:
            raise ValueError("Nesterov momentum requires momentum > 0")
        self.momentum, self.dampening, self.nesterov = momentum, dampening, nesterov
        self.weight_decay, self.decoupled, self.maximize = weight_decay, decoupled_weight_decay, maximize

    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        g = -grad if self.maximize else grad
        if self.decoupled:
            theta *= 1.0 - self.lr * self.weight_decay
        else:
            g = g + self.weight_decay * theta
        if self.momentum == 0.0:
            theta -= self.lr * g
            return
        if i not in self.state:
            self.state[i] = {"velocity": np.array(g)}  # the first step takes g itself, undampened
        else:
            b = self.state[i]["velocity"]
            b[...] = self.momentum * b + (1.0 - self.dampening) * g
        b = self.state[i]["velocity"]
        if self.nesterov:
            theta -= self.lr * (g + self.momentum * b)
        else:
            theta -= self.lr * b


class RMSProp(Optimizer):
    """v = α v + (1 − α) g²;  θ ← θ − η g / (√v + ε)  (optionally centered, optionally with momentum)."""

    def __init__(
        self,
        params: list[dict],
        lr: float = 0.01,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.alpha, self.eps, self.weight_decay = alpha, eps, weight_decay
        self.momentum, self.centered, self.maximize = momentum, centered, maximize

    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        g = -grad if self.maximize else grad
        g = g + self.weight_decay * theta
        if i not in self.state:
            self.state[i] = {"v": np.zeros_like(theta), "g_avg": np.zeros_like(theta), "b": np.zeros_like(theta)}
        s = self.state[i]
        s["v"][...] = self.alpha * s["v"] + (1.0 - self.alpha) * g**2
        variance = s["v"]
        if self.centered:
            s["g_avg"][...] = self.alpha * s["g_avg"] + (1.0 - self.alpha) * g
            variance = s["v"] - s["g_avg"] ** 2
        d = g / (np.sqrt(variance) + self.eps)
        if self.momentum > 0:
            s["b"][...] = self.momentum * s["b"] + d
            theta -= self.lr * s["b"]
        else:
            theta -= self.lr * d


class Adam(Optimizer):
    """m, v moving averages; m̂ = m/(1 − β1ᵗ), v̂ = v/(1 − β2ᵗ); θ ← θ − η m̂ / (√v̂ + ε); L2 decay in g."""

    decoupled = False

    def __init__(
        self,
        params: list[dict],
        lr: float = 0.001,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        bias_correction: bool = True,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.amsgrad, self.bias_correction, self.maximize = amsgrad, bias_correction, maximize

    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        g = -grad if self.maximize else grad
        if not self.decoupled:
            g = g + self.weight_decay * theta  # L2: the penalty enters the moments
        if i not in self.state:
            self.state[i] = {"m": np.zeros_like(theta), "v": np.zeros_like(theta), "v_max": np.zeros_like(theta)}
        m, v, v_max = self.state[i]["m"], self.state[i]["v"], self.state[i]["v_max"]
        m[...] = self.beta1 * m + (1.0 - self.beta1) * g
        v[...] = self.beta2 * v + (1.0 - self.beta2) * g**2
        if self.amsgrad:
            v_max[...] = np.maximum(v_max, v)
            v = v_max
        if self.bias_correction:
            m_hat = m / (1.0 - self.beta1**self.t)
            v_hat = v / (1.0 - self.beta2**self.t)
        else:
            m_hat, v_hat = m, v
        if self.decoupled:
            theta -= self.lr * (m_hat / (np.sqrt(v_hat) + self.eps) + self.weight_decay * theta)
        else:
            theta -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def effective_lr(self, i: int) -> np.ndarray:
        """η / (√v̂ + ε) for parameter i after the latest step."""
        v = self.state[i]["v_max"] if self.amsgrad else self.state[i]["v"]
        v_hat = v / (1.0 - self.beta2**self.t) if self.bias_correction else v
        return self.lr / (np.sqrt(v_hat) + self.eps)


class AdamW(Adam):
    """Adam with decoupled decay: θ ← θ − η (m̂ / (√v̂ + ε) + λθ), default λ = 0.01."""

    decoupled = True

    def __init__(self, params: list[dict], lr: float = 0.001, weight_decay: float = 0.01, **kwargs) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kwargs)


class AdamL2(Adam):
    """Adam with the L2 penalty folded into the gradient ("the wrong way"), default λ = 0.01."""

    def __init__(self, params: list[dict], lr: float = 0.001, weight_decay: float = 0.01, **kwargs) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kwargs)


class Lion(Optimizer):
    """θ ← θ − η (sign(β1 m + (1 − β1) g) + λθ);  m = β2 m + (1 − β2) g."""

    def __init__(
        self,
        params: list[dict],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.beta1, self.beta2 = betas
        self.weight_decay, self.maximize = weight_decay, maximize

    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        g = -grad if self.maximize else grad
        if i not in self.state:
            self.state[i] = {"m": np.zeros_like(theta)}
        m = self.state[i]["m"]
        c = self.beta1 * m + (1.0 - self.beta1) * g
        theta -= self.lr * (np.sign(c) + self.weight_decay * theta)
        m[...] = self.beta2 * m + (1.0 - self.beta2) * g


def newton_schulz(g: np.ndarray, coefficients=(3.4445, -4.775, 2.0315), steps: int = 5, eps: float = 1e-7):
    """X ← a X + b (X Xᵀ) X + c (X Xᵀ)² X from X = G/‖G‖_F, on the wide orientation, in float64."""
    a, b, c = coefficients
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.T if g.shape[0] > g.shape[1] else x


class Muon(Optimizer):
    """b = μ b + (1 − μ) g;  O = NS(Nesterov ? (1 − μ) g + μ b : b);  θ ← (1 − ηλ) θ − η √max(1, A/B) O."""

    def __init__(
        self,
        params: list[dict],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.weight_decay, self.momentum, self.nesterov = weight_decay, momentum, nesterov
        self.ns_steps, self.maximize = ns_steps, maximize

    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        g = -grad if self.maximize else grad
        if i not in self.state:
            self.state[i] = {"b": np.zeros_like(theta)}
        b = self.state[i]["b"]
        b[...] = self.momentum * b + (1.0 - self.momentum) * g
        d = (1.0 - self.momentum) * g + self.momentum * b if self.nesterov else b
        rows, cols = theta.shape
        theta *= 1.0 - self.lr * self.weight_decay
        theta -= self.lr * np.sqrt(max(1.0, rows / cols)) * newton_schulz(d, steps=self.ns_steps)
