r"""The largest eigenvalues of a symmetric operator by Lanczos iteration with full reorthogonalisation.

From a unit start vector q₁, Lanczos builds an orthonormal basis Q_j of the Krylov space
span{q₁, A q₁, …, A^{j−1} q₁} and the tridiagonal T_j = Q_jᵀ A Q_j (α on the diagonal, β beside it),
one product A q per step. The eigenpairs (θ_i, s_i) of T_j give Ritz pairs (θ_i, y_i = Q_j s_i), and

    ‖A y_i − θ_i y_i‖ = β_j |s_i[j]|

so the residual of every Ritz pair is known without another product. Stopping rule (the tolerance we
state): the top-k Ritz pairs all have ‖A y − θ y‖ ≤ tol·|θ|. For a symmetric A a residual r bounds the
eigenvalue's error by r, and by r²/gap once the spectrum around it is separated, so tol = 1e-3 gives
eigenvalues far better than 1e-3 relative. Each new vector is reorthogonalised against all previous
ones (twice, "twice is enough"), which costs memory j·n but keeps ghost copies of converged
eigenvalues out — the price for a handful to a few dozen steps.

A warm start (``init``, e.g. the previous call's top eigenvector while training moves slowly) puts q₁
close to the wanted eigenvector, so fewer steps reach the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LanczosResult:
    eigenvalues: list[float]  # top k, descending
    vectors: Tensor  # (k, n) Ritz vectors, unit norm
    residuals: list[float]  # ‖A y − θ y‖ / |θ| for each
    steps: int  # products A q taken
    converged: bool


def lanczos(
    matvec: Callable[[Tensor], Tensor],
    start: Tensor,
    k: int = 1,
    tol: float = 1e-3,
    max_steps: int = 100,
) -> LanczosResult:
    """The k largest (algebraic) eigenvalues of the symmetric operator ``matvec`` on vectors like ``start``.

    Stops when the top-k relative residuals are ≤ ``tol``, after ``max_steps`` products, or when the
    Krylov space is exhausted (then the Ritz values are exact). A product that is not finite (a model
    that diverged) ends it with NaN eigenvalues rather than an error.
    """
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"lanczos: k={k!r} must be an integer >= 1")
    if not tol > 0:
        raise ValueError(f"lanczos: tol={tol!r} must be > 0")
    n = start.numel()
    max_steps = min(max_steps, n)
    if max_steps < k:
        raise ValueError(f"lanczos: max_steps={max_steps} (at most the dimension {n}) must be >= k={k}")
    norm = start.norm()
    if not (torch.isfinite(norm) and norm > 0):
        raise ValueError("lanczos: the start vector must be finite and non-zero")
    basis = [start / norm]
    alphas: list[float] = []
    betas: list[float] = []
    best = None
    for j in range(max_steps):
        w = matvec(basis[j])
        alpha = float(torch.dot(w, basis[j]))
        alphas.append(alpha)
        Q = torch.stack(basis)
        for _ in range(2):
            w = w - Q.T @ (Q @ w)
        beta = float(w.norm())
        if not (math.isfinite(alpha) and math.isfinite(beta)):  # a diverged model: no spectrum to report
            nan = [math.nan] * k
            return LanczosResult(nan, torch.full((k, n), math.nan, dtype=start.dtype), nan, j + 1, False)
        best = _ritz(alphas, betas, beta, Q, k, tol)
        if best.converged:
            break
        scale = max([abs(a) for a in alphas] + betas)
        if beta <= 1e-12 * scale:  # an invariant subspace: the Ritz values are eigenvalues
            best.converged = len(best.eigenvalues) >= k
            break
        if j + 1 < max_steps:
            betas.append(beta)
            basis.append(w / beta)
    assert best is not None
    return best


def _ritz(alphas: list[float], betas: list[float], beta_next: float, Q: Tensor, k: int, tol: float) -> LanczosResult:
    j = len(alphas)
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    theta, S = torch.linalg.eigh(T)
    order = torch.argsort(theta, descending=True)[: min(k, j)]
    values = [float(theta[i]) for i in order]
    residuals = [beta_next * abs(float(S[-1, i])) / max(abs(float(theta[i])), 1e-300) for i in order]
    vectors = S[:, order].T.to(Q.dtype) @ Q
    converged = len(values) >= k and all(r <= tol for r in residuals)
    return LanczosResult(values, vectors, residuals, j, converged)
