r"""The largest eigenvalues of a symmetric operator A by Lanczos iteration with full reorthogonalisation.

The search space starts as the span of one unit vector q₁ (or of several: a *block* start) and grows by
one vector per product: V_j = [q₁ … q_j] orthonormal, W_j = A V_j. Rayleigh–Ritz on it gives the
projected matrix T_j = V_jᵀ A V_j and its eigenpairs (θ_i, s_i), the Ritz pairs (θ_i, y_i = V_j s_i)
with A y_i = W_j s_i known without another product, so each residual

    r_i = A y_i − θ_i y_i

is exact. The space grows by the residual of the least converged wanted pair, orthogonalised against
V_j: from a single start every residual is parallel to the next Krylov direction, so V_j spans
{q₁, A q₁, …, A^{j−1} q₁} and this is Lanczos (T_j tridiagonal in exact arithmetic); we keep W and
the full T rather than the three-term recurrence, which costs memory 2·j·n but keeps ghost copies of
converged eigenvalues out ("twice is enough" Gram–Schmidt) and lets a block start in.

Stopping rule (the tolerance we state): the top-k Ritz pairs all have ‖A y − θ y‖ ≤ tol·|θ|. For a
symmetric A a residual r bounds the eigenvalue's error by r, and by r²/gap once the gap to the rest of
the spectrum exceeds r, so tol = 1e-3 gives a well separated eigenvalue far better than 1e-3 relative (one
in a cluster only within the residual bound). A θ that is zero to rounding (A rank-deficient) is judged
against ε^(2/3) times the largest |θ| instead: ARPACK's floor, ε^(2/3), made relative to the spectrum's
scale so that the test does not depend on the loss's units.

A single start vector has one component in each eigenspace, so its Krylov space holds one vector of an
eigenvalue repeated m times and finds it once: a block of k start vectors finds multiplicities up to k
(``sharpness`` adds k − 1 random ones). A search space that becomes invariant with fewer than k Ritz
values (a rank-deficient A) goes on with a random vector orthogonal to it.

Products rounded in a floating dtype stop the residual near a floor of the order of √n·ε (ε the dtype's
machine epsilon; ``benchmarks/curvature_cost.py`` prints where it lies on the ``lm`` GPT's 0.8M float32
parameters, where √n·ε = 1.1e-4), and a ``tol`` below the floor would run to ``max_steps``. So the search
also ends, unconverged, once its residual is within 100·√n·ε and has not improved by 10 % in ``STALL``
products; the Ritz values of the space so far are returned (the top one only rises as the space grows,
so stopping never makes it worse than it was).

A warm start (the previous call's top eigenvector while training moves slowly) puts q₁ close to the
wanted eigenvector, so fewer products reach the tolerance. A block start also returns the Rayleigh
quotient vᵀAv/vᵀv of every start vector, from the product it took anyway: the curvature along the
gradient or the update costs nothing beyond the product that also enlarges the search space (and the
gradient tends to lie near the top eigenvectors, Gur-Ari et al. 2018, so it helps convergence).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..checks import is_count, is_number

STALL = 8  # products without a 10 % better residual, near the rounding floor, that end the search


@dataclass
class LanczosResult:
    """What [`lanczos`][optiscope.curvature.lanczos] found: the top-k Ritz pairs, their residuals and the cost.

    A Ritz pair (θ, y) of the search space V is an eigenpair of VᵀAV lifted by V; its relative residual
    ‖Ay − θy‖/|θ| bounds how far θ is from an eigenvalue of A.

    Args:
        eigenvalues: the top k Ritz values θ, largest first (NaN when a product was not finite; fewer than k
            when the space was invariant with fewer).
        vectors: the Ritz vectors y as the rows of a (k, n) tensor, unit norm, in the order of ``eigenvalues``.
        residuals: ‖Ay − θy‖/|θ| for each (a θ that is zero to rounding is judged against ε^(2/3) times the
            largest |θ|).
        steps: the products A q taken.
        converged: whether every one of the top k met ``tol``.
        start_quotients: vᵀAv/vᵀv for each start vector, in order (NaN for a zero or non-finite one).

    Examples:
        >>> import torch
        >>> from optiscope.curvature import lanczos
        >>> result = lanczos(lambda v: torch.tensor([3.0, 2.0, 1.0]) * v, torch.ones(3), k=2)
        >>> [round(e, 4) for e in result.eigenvalues], result.vectors.shape, result.steps, result.converged
        ([3.0, 2.0], torch.Size([2, 3]), 3, True)
        >>> [round(q, 4) for q in result.start_quotients]  # (3 + 2 + 1)/3
        [2.0]
    """

    eigenvalues: list[float]  # top k, descending
    vectors: Tensor  # (k, n) Ritz vectors, unit norm
    residuals: list[float]  # ‖A y − θ y‖ / |θ| for each
    steps: int  # products A q taken
    converged: bool
    start_quotients: list[float] = field(default_factory=list)  # vᵀAv/vᵀv per start vector (NaN for 0)


def lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor,
    k: int = 1,
    tol: float = 1e-3,
    max_steps: int = 100,
) -> LanczosResult:
    """The k largest eigenvalues of a symmetric linear operator, by Lanczos with full reorthogonalisation.

    The search space V grows by one vector per product A q; Rayleigh–Ritz on it gives Ritz pairs (θ, y) with
    exact residuals r = Ay − θy, and it stops when the top k all have ‖r‖ ≤ ``tol``·|θ|. For a symmetric A, a
    residual r puts θ within ‖r‖ of an eigenvalue, and within ‖r‖²/gap once the gap to the rest of the
    spectrum exceeds ‖r‖.

    Args:
        matvec: v ↦ A v for A symmetric, on flat tensors of ``start``'s length, dtype and device (a
            [`HessianOperator`][optiscope.curvature.HessianOperator] is one).
        start: one start vector (n,), or a block of m as the rows of (m, n); floating, the first finite and
            non-zero. Each row costs one product (a zero or non-finite row none).
        k: how many of the largest (algebraic) eigenvalues to find; at least 1.
        tol: the relative residual at which a Ritz pair counts as converged; > 0.
        max_steps: the most products to take; at least ``k`` and the number of start vectors (capped at
            n + m − 1, past which the space can grow no more).

    Returns:
        A [`LanczosResult`][optiscope.curvature.LanczosResult] with the top-k Ritz values and vectors, their
            residuals, the products taken, whether it converged and each start vector's Rayleigh quotient.

    Raises:
        ValueError: ``k``, ``tol`` or ``max_steps`` invalid; ``start`` not a floating tensor of 1 or 2
            dimensions with n ≥ 1, or its first vector zero or not finite.

    Examples:
        >>> import torch
        >>> from optiscope.curvature import lanczos
        >>> A = torch.diag(torch.tensor([4.0, 3.0, 1.0, 0.5]))
        >>> result = lanczos(lambda v: A @ v, torch.ones(4), k=2, tol=1e-6)
        >>> [round(e, 4) for e in result.eigenvalues], result.converged
        ([4.0, 3.0], True)

    Notes:
        - **When it stops.** At ``tol``; after ``max_steps`` products; when the space is invariant (the Ritz
          values are then exact); or, unconverged, when the residual has stalled at the dtype's rounding floor:
          within 100·√n·ε and no 10 % gain in 8 products (on the ``lm`` GPT's 0.8M float32 parameters
          √n·ε = 1.1e-4; ``benchmarks/curvature_cost.py`` prints where the floor lies). The top Ritz value only
          rises as the space grows, so stopping never makes it worse. A θ that is zero to rounding (a
          rank-deficient A) is judged against ε^(2/3) times the largest |θ| (ARPACK's floor, made relative).
        - **Blocks.** A single start vector has one component in each eigenspace, so it finds an eigenvalue
          repeated m times once; a block of k start vectors finds multiplicities up to k. A space that becomes
          invariant with fewer than k Ritz values goes on with a random vector orthogonal to it. Each start
          vector's Rayleigh quotient vᵀAv/vᵀv comes from the product it took anyway: the curvature along the
          gradient or the update costs nothing beyond the product that also enlarges the space (and the
          gradient tends to lie near the top eigenvectors, Gur-Ari et al. 2018, which helps convergence). A
          start vector within ε^(1/4) of the span so far (2 % in float32) is not added to it.
        - **Warm starts.** A first start vector close to the wanted eigenvector (the previous call's, while
          training moves slowly) reaches ``tol`` in fewer products.
        - **Divergence.** A product that is not finite (a model that diverged) ends it with NaN eigenvalues,
          vectors and residuals rather than an error.
        - **Memory.** Keeps V and W = AV, 2·j·n numbers after j products, and the full projected matrix rather
          than the three-term recurrence: "twice is enough" Gram–Schmidt keeps ghost copies of converged
          eigenvalues out and lets a block start in. The small projected eigenproblem is solved on the CPU in
          float64.
    """
    if not is_count(k):
        raise ValueError(f"lanczos: k={k!r} must be an integer >= 1")
    if not (is_number(tol) and tol > 0):
        raise ValueError(f"lanczos: tol={tol!r} must be a number > 0")
    if not is_count(max_steps):
        raise ValueError(f"lanczos: max_steps={max_steps!r} must be an integer >= 1")
    fault = _start_fault(start)
    if fault is not None:
        raise ValueError(
            f"lanczos: start is {fault}; give one floating vector (n,) with n >= 1, or several as the rows of (m, n)"
        )
    starts = start.reshape(1, -1) if start.ndim == 1 else start
    m, n = starts.shape
    max_steps = min(max_steps, n + m - 1)
    if max_steps < max(k, m):
        raise ValueError(f"lanczos: max_steps={max_steps} must be >= k={k} and >= the {m} start vectors")
    norm = starts[0].norm()
    if not (torch.isfinite(norm) and norm > 0):
        raise ValueError("lanczos: the start vector must be finite and non-zero")
    space = _Space(n, starts.dtype, starts.device, capacity=m + 4, limit=max_steps)
    quotients = []
    steps = 0
    for row in starts:
        norm = row.norm()
        if not (torch.isfinite(norm) and norm > 0):  # no direction: no product
            quotients.append(math.nan)
            continue
        q = row / norm
        w = matvec(q)
        steps += 1
        quotients.append(float(torch.dot(q, w)))
        space.add(q, w)
    floor = 100 * math.sqrt(n) * torch.finfo(starts.dtype).eps
    history: list[float] = []  # the largest top-k residual after each product
    while True:
        if not space.finite():  # a diverged model: no spectrum to report
            nan = [math.nan] * k
            missing = torch.full((k, n), math.nan, dtype=starts.dtype, device=starts.device)
            return LanczosResult(nan, missing, nan, steps, False, quotients)
        values, vectors, residual_vectors, scale = space.ritz(k)
        # relative to |θ|, but a θ that is zero to rounding (a rank-deficient A) is judged against the spectrum's
        # scale (ARPACK's ε^(2/3) floor, made relative), instead of dividing by nothing
        zero = torch.finfo(starts.dtype).eps ** (2 / 3) * scale
        residuals = [float(r.norm()) / max(abs(v), zero, 1e-300) for v, r in zip(values, residual_vectors, strict=True)]
        converged = len(values) >= k and all(r <= tol for r in residuals)
        history.append(max(residuals) if len(values) >= k else math.inf)
        if converged or steps >= max_steps or stalled(history, floor):
            return LanczosResult(values, vectors, residuals, steps, converged, quotients)
        worst = max(range(len(residuals)), key=residuals.__getitem__)
        expansion = space.orthogonal(residual_vectors[worst])
        if expansion is None and len(values) < k:  # invariant, with fewer than k: go on in its complement
            fresh = torch.randn(n, generator=torch.Generator().manual_seed(steps), dtype=torch.float64)
            expansion = space.orthogonal(fresh.to(starts.dtype).to(starts.device))
        if expansion is None:  # an invariant subspace: the Ritz values are eigenvalues
            return LanczosResult(values, vectors, residuals, steps, len(values) >= k, quotients)
        q, _ = expansion
        space.append(q, matvec(q))
        steps += 1


def _start_fault(start: object) -> str | None:
    """What ``start`` is, said for an error, when it is not a real floating vector (n,) or block (m, n) with
    n, m >= 1; None when it is one."""
    if not isinstance(start, Tensor):
        return f"a {type(start).__name__}"
    if not start.is_floating_point():
        return f"a {start.dtype} tensor"
    if start.ndim not in (1, 2) or start.numel() == 0:
        return f"a tensor of shape {tuple(start.shape)}"
    return None


def stalled(history: list[float], floor: float) -> bool:
    """Whether the residuals so far have reached ``floor`` and the last ``STALL`` brought no 10 % gain."""
    if len(history) <= STALL or min(history) > floor:
        return False
    return min(history[-STALL:]) > 0.9 * min(history[:-STALL])


class _Space:
    """An orthonormal basis V (rows), W = A V (rows) and T = V Wᵀ, grown a vector at a time."""

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device, capacity: int, limit: int) -> None:
        # V and W are views of the first ``rows`` rows of buffers that grow by half when full, so a product
        # appends in place (concatenating copied the whole basis at every product: time quadratic in the
        # products). By half, not doubling: each spare row is the model's size
        self.limit = limit  # the most vectors the space will hold
        self._V = torch.empty(min(capacity, limit), n, dtype=dtype, device=device)
        self._W = torch.empty_like(self._V)
        self.rows = 0
        # T is tiny (one row per product) and lives on the CPU: on a GPU, an eigendecomposition of a tiny matrix
        # costs a solver launch and a synchronisation per product, more than the arithmetic
        self.T = torch.empty(0, 0, dtype=torch.float64)
        self.nonfinite = False  # a product that was not finite (checked once, as it comes in)

    @property
    def V(self) -> Tensor:
        return self._V[: self.rows]

    @property
    def W(self) -> Tensor:
        return self._W[: self.rows]

    def orthogonal(
        self, q: Tensor, w: Tensor | None = None, inside: float = 1e-10
    ) -> tuple[Tensor, Tensor | None] | None:
        """(q, w = A q) with the span of V taken out of q twice and normalised, w following by linearity
        (None stays None); None when q lies in the span already: less than ``inside`` of its norm outside."""
        size = q.norm()
        for _ in range(2):
            c = self.V @ q
            q = q - c @ self.V
            if w is not None:
                w = w - c @ self.W
        norm = q.norm()
        if not norm > inside * size:
            return None
        return q / norm, None if w is None else w / norm

    def add(self, q: Tensor, w: Tensor) -> None:
        """A start vector q with w = A q: orthogonalised against the basis first, dropped if within ε^{1/4}
        of it (2 % in float32). Its w follows by linearity, w − W c, which cancels as q − V c does: the
        product's rounding comes out magnified by |q| / |q − V c|, and from a q all but inside the span
        (the update along the gradient in SGD, equal up to rounding) it would fill T with noise."""
        pair = self.orthogonal(q, w, inside=torch.finfo(q.dtype).eps ** 0.25)
        if pair is None:  # a start vector inside the span so far, or too nearly to add to it
            self.nonfinite |= not bool(torch.isfinite(w).all())
            return
        q, w = pair
        assert w is not None
        self.append(q, w)

    def append(self, q: Tensor, w: Tensor) -> None:
        """A unit vector q already orthogonal to the basis, with w = A q."""
        if not bool(torch.isfinite(w).all()):
            self.nonfinite = True
            return
        column = ((self.W @ q + self.V @ w).double() / 2).cpu()  # T is symmetric: average the two halves
        corner = torch.dot(q, w).double().reshape(1, 1).cpu()
        self.T = torch.cat([torch.cat([self.T, column[:, None]], 1), torch.cat([column[None], corner], 1)], 0)
        if self.rows == self._V.shape[0]:
            capacity = min(max(self.rows * 3 // 2, self.rows + 1), self.limit)
            self._V, self._W = (
                torch.cat([b[: self.rows], b.new_empty(capacity - self.rows, b.shape[1])]) for b in (self._V, self._W)
            )
        self._V[self.rows] = q
        self._W[self.rows] = w
        self.rows += 1

    def finite(self) -> bool:
        return not self.nonfinite and bool(torch.isfinite(self.T).all())

    def ritz(self, k: int) -> tuple[list[float], Tensor, Tensor, float]:
        """The top-k Ritz values, their vectors, their residual vectors A y − θ y, and the largest |θ| of all."""
        theta, S = torch.linalg.eigh(self.T)
        order = torch.argsort(theta, descending=True)[:k]
        top = S[:, order].T.to(self.V.device, self.V.dtype)
        values = theta[order].to(self.V.dtype)
        vectors, products = top @ self.V, top @ self.W
        scale = float(theta.abs().max()) if len(theta) else 0.0
        residuals = products - values.to(self.V.device)[:, None] * vectors
        return [float(v) for v in values], vectors, residuals, scale
