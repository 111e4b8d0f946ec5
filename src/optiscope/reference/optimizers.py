"""NumPy twins of the optimizers: the readable oracle the torch code is tested against.

The contract is the seed's ``[{"params": ndarray, "grad": ndarray}, ...]``; ``Optimizer``'s docstring
states it. These classes are deliberately plain — one parameter at a time, the textbook formula on each
line — and share no code with ``optiscope.optim``; agreement between the two is evidence, not tautology.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Optimizer(ABC):
    """Base class of the NumPy twins: the seed's contract, a list of ``{"params": θ, "grad": g}`` dicts.

    On ``step()`` the optimizer updates every ``"params"`` array θ *in place* from its ``"grad"`` g. State
    lives in ``self.state[i]`` (i = the parameter's position) and is updated in place too: ``m[...] = ...``,
    never ``m = ...``, which would leave the stored state stale (the seed writes ``m[:]``, which fails on
    0-d arrays). The step counter t (``self.t``) is global and is incremented *before* use, so bias
    corrections never divide by 1 − β⁰ = 0. A subclass implements ``update(i, theta, grad)``.

    Args:
        params: the parameters, ``[{"params": ndarray, "grad": ndarray}, ...]``: each dict with exactly
            these two keys, the arrays of the same shape (0-d arrays included). The caller writes each
            ``"grad"`` in place before ``step()``.
        lr: η.

    Raises:
        ValueError: a dict whose keys are not exactly ``"params"`` and ``"grad"``, or whose arrays differ in shape.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import Optimizer
        >>> class SignSGD(Optimizer):
        ...     def update(self, i, theta, grad):  # θ ← θ − η sign(g), in place
        ...         theta -= self.lr * np.sign(grad)
        >>> p = {"params": np.array([0.5, -2.0]), "grad": np.array([1.0, -4.0])}
        >>> optimizer = SignSGD([p], lr=0.1)
        >>> optimizer.step()
        >>> p["params"], optimizer.t
        (array([ 0.4, -1.9]), 1)

    Notes:
        These classes are deliberately plain (one parameter at a time, the textbook formula on each line)
        and share no code with ``optiscope.optim``; agreement between the two is evidence, not tautology.
        ``tests/optim`` runs every optimizer and option combination 100 steps in float64 against its twin.
    """

    def __init__(self, params: list[dict], lr: float) -> None:
        for i, p in enumerate(params):
            if set(p) != {"params", "grad"} or p["params"].shape != p["grad"].shape:
                raise ValueError(f"params[{i}] must be a dict with 'params' and 'grad' arrays of the same shape")
        self.params = params
        self.lr = lr
        self.state: dict[int, dict[str, np.ndarray]] = {}
        self.t = 0

    def zero_grad(self) -> None:
        """Set every ``"grad"`` array to 0, in place."""
        for p in self.params:
            p["grad"][...] = 0.0

    def step(self) -> None:
        """Advance t by one, then update every parameter from its gradient (``update``), in place."""
        self.t += 1
        for i, p in enumerate(self.params):
            self.update(i, p["params"], p["grad"])

    @abstractmethod
    def update(self, i: int, theta: np.ndarray, grad: np.ndarray) -> None:
        """Update parameter i (``theta``, in place) from its gradient, creating its state on first use.

        Args:
            i: the parameter's position in ``params``, the key of its state in ``self.state``.
            theta: θ, the ``"params"`` array, to be updated in place.
            grad: g, the ``"grad"`` array (not to be modified).
        """


class SGD(Optimizer):
    """SGD's twin: θ ← θ − η d with d = g, the momentum buffer b, or Nesterov's g + μ b.

    ```text
    g ← −g                   if maximize
    g ← g + λθ               coupled decay;  θ ← (1 − ηλ) θ  decoupled
    b ← g on the first step, b ← μ b + (1 − τ) g  afterwards
    d = g + μ b (Nesterov)   or  d = b  (heavy ball)  or  d = g  (μ = 0)
    θ ← θ − η d
    ```

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η (default 0.01, not torch's 1e-3).
        momentum: μ; 0 for plain SGD.
        dampening: τ, the share of g that does not enter b.
        nesterov: Nesterov momentum; needs μ > 0. Note the order: before ``weight_decay``, unlike torch.
        weight_decay: λ.
        decoupled_weight_decay: shrink θ by (1 − ηλ) instead of adding λθ to g.
        maximize: ascend (g ← −g).

    Raises:
        ValueError: ``nesterov=True`` with μ = 0, or malformed ``params``.

    Examples:
        The same two heavy-ball steps on ‖θ‖² as ``optiscope.optim.SGD``'s example:

        >>> import numpy as np
        >>> from optiscope.reference import SGD
        >>> p = {"params": np.array([1.0, -2.0]), "grad": np.zeros(2)}
        >>> optimizer = SGD([p], lr=0.1, momentum=0.9)
        >>> for _ in range(2):
        ...     p["grad"][...] = 2 * p["params"]
        ...     optimizer.step()
        >>> p["params"], optimizer.state[0]["velocity"]
        (array([ 0.46, -0.92]), array([ 3.4, -6.8]))

    Notes:
        State per parameter: ``velocity`` (b, only when μ ≠ 0).
    """

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
    """RMSprop's twin: v = α v + (1 − α) g²;  θ ← θ − η g / (√v + ε), optionally centered and with momentum.

    ```text
    g ← −g                       if maximize
    g ← g + λθ                   coupled decay
    v ← α v + (1 − α) g²
    ḡ ← α ḡ + (1 − α) g          centered only; then v − ḡ² replaces v below
    d = g / (√v + ε)
    b ← μ b + d,  θ ← θ − η b    with momentum;  θ ← θ − η d  without
    ```

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η.
        alpha: α, the smoothing of v (and ḡ).
        eps: ε, added to √v.
        weight_decay: λ, added to g as λθ.
        momentum: μ; 0 for none.
        centered: divide by √(v − ḡ²) instead of √v.
        maximize: ascend (g ← −g).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import RMSProp
        >>> p = {"params": np.array([1.0, -2.0]), "grad": np.array([2.0, -4.0])}
        >>> RMSProp([p], lr=0.01).step()
        >>> p["params"]  # v = (1 − α) g², so the first step is 10 η
        array([ 0.9, -1.9])

    Notes:
        State per parameter: ``v``, ``g_avg`` (ḡ) and ``b``, all created on the first step.
    """

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
    """Adam's twin: m̂ = m/(1 − β1ᵗ), v̂ = v/(1 − β2ᵗ); θ ← θ − η m̂ / (√v̂ + ε), with L2 decay in g.

    ```text
    g ← −g                                 if maximize
    g ← g + λθ                             L2: the penalty enters the moments (not in AdamW)
    m ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²
    v_max ← max(v_max, v)                  amsgrad only; v_max replaces v below
    m̂ = m / (1 − β1ᵗ),  v̂ = v / (1 − β2ᵗ)  (m̂ = m, v̂ = v without bias correction)
    θ ← θ − η m̂ / (√v̂ + ε)                 (AdamW: θ ← θ − η (m̂ / (√v̂ + ε) + λθ))
    ```

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η.
        betas: (β1, β2).
        eps: ε, added to √v̂.
        weight_decay: λ, added to g as λθ (``AdamW``: decoupled).
        amsgrad: use the running maximum v_max of v.
        bias_correction: divide m and v by (1 − β1ᵗ) and (1 − β2ᵗ).
        maximize: ascend (g ← −g).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        The seed's worked example, Adam on θ² from θ = 3:

        >>> import numpy as np
        >>> from optiscope.reference import Adam
        >>> p = {"params": np.array(3.0), "grad": np.array(0.0)}
        >>> optimizer = Adam([p], lr=1e-3)
        >>> for _ in range(3):
        ...     p["grad"][...] = 2 * p["params"]
        ...     optimizer.step()
        ...     print(round(float(p["params"]), 3))
        2.999
        2.998
        2.997

    Notes:
        State per parameter: ``m``, ``v`` and ``v_max`` (created even without amsgrad).
    """

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
        """η / (√v̂ + ε) for parameter i after the latest step.

        Args:
            i: the parameter's position in ``params``.

        Returns:
            An array of the parameter's shape (a NumPy scalar for a 0-d parameter).

        Raises:
            KeyError: parameter i has no state yet (no step taken).
        """
        v = self.state[i]["v_max"] if self.amsgrad else self.state[i]["v"]
        v_hat = v / (1.0 - self.beta2**self.t) if self.bias_correction else v
        return self.lr / (np.sqrt(v_hat) + self.eps)


class AdamW(Adam):
    """AdamW's twin: Adam with decoupled decay θ ← θ − η (m̂ / (√v̂ + ε) + λθ), default λ = 0.01.

    That is θ ← (1 − ηλ) θ − η m̂ / (√v̂ + ε): the decay does not enter m and v.

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η.
        weight_decay: λ.
        **kwargs (Any): ``Adam``'s other arguments (``betas``, ``eps``, ``amsgrad``, ``bias_correction``, ``maximize``).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import AdamW
        >>> p = {"params": np.array([1.0]), "grad": np.zeros(1)}
        >>> AdamW([p], lr=0.1, weight_decay=0.5).step()
        >>> p["params"]  # a zero gradient: only the decay, 1 − ηλ
        array([0.95])
    """

    decoupled = True

    def __init__(self, params: list[dict], lr: float = 0.001, weight_decay: float = 0.01, **kwargs) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kwargs)


class AdamL2(Adam):
    """AdamL2's twin: Adam with the L2 penalty folded into the gradient ("the wrong way"), default λ = 0.01.

    g ← g + λθ before the moments, so the decay passes through 1/(√v̂ + ε).

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η.
        weight_decay: λ.
        **kwargs (Any): ``Adam``'s other arguments (``betas``, ``eps``, ``amsgrad``, ``bias_correction``, ``maximize``).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import AdamL2
        >>> p = {"params": np.array([1.0]), "grad": np.zeros(1)}
        >>> AdamL2([p], lr=0.1, weight_decay=0.5).step()
        >>> p["params"]  # g = λθ, normalised by Adam to a step of η (AdamW: 0.95)
        array([0.9])
    """

    def __init__(self, params: list[dict], lr: float = 0.001, weight_decay: float = 0.01, **kwargs) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kwargs)


class Lion(Optimizer):
    """Lion's twin: θ ← θ − η (sign(β1 m + (1 − β1) g) + λθ);  m ← β2 m + (1 − β2) g.

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` (see ``Optimizer``).
        lr: η.
        betas: (β1, β2).
        weight_decay: λ, decoupled.
        maximize: ascend (g ← −g).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import Lion
        >>> p = {"params": np.array([1.0, -2.0]), "grad": np.array([2.0, -4.0])}
        >>> optimizer = Lion([p], lr=0.1)
        >>> optimizer.step()
        >>> p["params"], optimizer.state[0]["m"]  # every coordinate moves by η
        (array([ 0.9, -1.9]), array([ 0.02, -0.04]))

    Notes:
        State per parameter: ``m``.
    """

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
    """Newton–Schulz's twin: X ← a X + b (X Xᵀ) X + c (X Xᵀ)² X from X = G/‖G‖_F, on the wide orientation.

    The arithmetic runs in ``g``'s precision (float64 for the float64 arrays the tests use), where
    ``optiscope.optim.newton_schulz`` runs in its ``dtype``.

    Args:
        g: G, a real 2-D array (a tall one is transposed and back).
        coefficients (tuple[float, float, float]): (a, b, c) of the quintic.
        steps: the number of iterations.
        eps: the floor on ‖G‖_F.

    Returns:
        X (np.ndarray): an array of ``g``'s shape whose singular values are near 1, approximately G's orthogonal
            factor U Vᵀ.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import newton_schulz
        >>> g = np.random.default_rng(0).standard_normal((4, 8))
        >>> x = newton_schulz(g)
        >>> x.shape, np.linalg.svd(x, compute_uv=False).round(1)
        ((4, 8), array([1.1, 1. , 0.9, 0.8]))
    """
    a, b, c = coefficients
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.T if g.shape[0] > g.shape[1] else x


class Muon(Optimizer):
    """Muon's twin: b ← μ b + (1 − μ) g;  θ ← (1 − ηλ) θ − η √max(1, A/B) NS(d) for θ ∈ ℝ^{A×B}.

    d = (1 − μ) g + μ b with Nesterov, else b; NS is ``newton_schulz`` with its default coefficients and ε.

    Args:
        params: ``[{"params": ndarray, "grad": ndarray}, ...]`` of 2-D arrays (see ``Optimizer``).
        lr: η.
        weight_decay: λ, decoupled (default 0.1, as torch.optim.Muon).
        momentum: μ.
        nesterov: orthogonalise (1 − μ) g + μ b instead of b.
        ns_steps: Newton–Schulz iterations.
        maximize: ascend (g ← −g).

    Raises:
        ValueError: malformed ``params``.

    Examples:
        >>> import numpy as np
        >>> from optiscope.reference import Muon
        >>> rng = np.random.default_rng(0)
        >>> p = {"params": rng.standard_normal((4, 8)), "grad": rng.standard_normal((4, 8))}
        >>> before = p["params"].copy()
        >>> Muon([p], lr=0.02, weight_decay=0.0).step()
        >>> np.linalg.svd((before - p["params"]) / 0.02, compute_uv=False).round(1)  # η' = η here (A < B)
        array([1.1, 1.1, 1. , 0.7])

    Notes:
        State per parameter: ``b``. Only torch's ``"original"`` learning-rate scale; a parameter that is not
        2-D fails at ``step()`` (ValueError from unpacking its shape).
    """

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
