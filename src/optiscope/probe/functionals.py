r"""What the probe measures about a model's next-token distributions, per sequence.

For sequences i = 1..E of length T and next-token distributions p_θ(· | x_{i,<t}) over a vocabulary V:

    h_{i,t} = −Σ_{k∈V} p log p        the exact (Rao–Blackwellised) entropy at position t
    ℓ_{i,t} = −log p(x_{i,t+1})       the cross-entropy loss at position t (needs the next token)

Each functional returns the per-sequence sums (Σ_t h_{i,t}, or Σ_t ℓ_{i,t}) over the scored positions
(all, or those where ``scored`` is true: padding and prompts left out) as a float64 vector, so the
mean per token is their total divided by the number of scored positions, and per-sequence
contributions add up to the total exactly. Softmax and logarithms run in float64 whatever the model's
dtype: entropy differences of 1e-7 are what the probe looks for.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .calls import logits_of

FUNCTIONALS = ("entropy", "loss")


def check_logits(output: object) -> Tensor:
    """The model output must be next-token logits of shape (batch, positions, vocabulary) (or hold them:
    a 🤗 output's ``.logits``, a tuple's first element)."""
    logits = logits_of(output)
    if not isinstance(logits, Tensor) or logits.ndim != 3 or logits.shape[-1] < 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(
            f"the model's output {shape} is not a next-token distribution: the probe needs floating-point "
            "logits of shape (batch, positions, vocabulary) with a vocabulary of at least 2"
        )
    return logits


def _sum_scored(values: Tensor, scored: Tensor | None) -> Tensor:
    """Σ_t over the scored positions of each sequence (``where``, not a product: padded positions may hold
    anything, even non-finite values, and must not leak into the sum or its derivatives)."""
    if scored is not None:
        values = torch.where(scored.bool(), values, values.new_zeros(()))
    return values.sum(dim=-1)


def entropy_per_sequence(logits: Tensor, scored: Tensor | None = None) -> Tensor:
    """The summed next-token entropy of each sequence, Σ_t h_{i,t}, in float64.

    With p = softmax(logits) at position t of sequence i, h_{i,t} = −Σ_k p_k log p_k is the exact entropy
    over the vocabulary; the sum runs over the scored positions. Softmax and logarithms run in float64
    whatever the logits' dtype: entropy differences of 1e-7 are what the probe looks for.

    Args:
        logits: next-token logits of shape (E, T, V).
        scored: an (E, T) mask of the positions that count (padding and prompts left out), or None for all.
            Where it is false the value is left out with ``where``, so padded positions may hold anything, even
            non-finite values, without leaking into the sum or its derivatives.

    Returns:
        A float64 tensor of shape (E,). The mean entropy per token is its total over the number of scored
            positions, and per-sequence contributions add up to that total exactly.

    Examples:
        >>> import torch
        >>> from optiscope.probe import entropy_per_sequence
        >>> logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: h = log 4 = 1.3863 per position
        >>> entropy_per_sequence(logits)
        tensor([4.1589, 4.1589], dtype=torch.float64)
        >>> entropy_per_sequence(logits, scored=torch.tensor([[1, 1, 1], [1, 0, 0]]))
        tensor([4.1589, 1.3863], dtype=torch.float64)
    """
    logp = torch.log_softmax(logits.double(), dim=-1)
    return _sum_scored(-(logp.exp() * logp).sum(dim=-1), scored)


def loss_per_sequence(logits: Tensor, targets: Tensor, scored: Tensor | None = None) -> Tensor:
    """The summed next-token cross-entropy of each sequence, Σ_t ℓ_{i,t}, in float64.

    ℓ_{i,t} = −log p(x_{i,t+1}), the loss at position t of sequence i; the sum runs over the scored positions.
    Softmax and logarithms run in float64 whatever the logits' dtype.

    Args:
        logits: next-token logits of shape (E, T, V).
        targets: token ids of shape (E, T): ``targets[i, t]`` is the token after position t.
        scored: an (E, T) mask of the positions that count, or None for all (as ``entropy_per_sequence``).

    Returns:
        A float64 tensor of shape (E,).

    Examples:
        >>> import torch
        >>> from optiscope.probe import loss_per_sequence
        >>> logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: ℓ = log 4 = 1.3863 per position
        >>> loss_per_sequence(logits, targets=torch.zeros(2, 3, dtype=torch.long))
        tensor([4.1589, 4.1589], dtype=torch.float64)
    """
    logp = torch.log_softmax(logits.double(), dim=-1)
    return _sum_scored(-torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1), scored)


def sequence_log_prob(logits: Tensor, targets: Tensor, scored: Tensor | None = None) -> Tensor:
    """log p_θ(x_i) = Σ_t log p(x_{i,t+1} | x_{i,≤t}) over the scored (sampled) tokens of each sequence i."""
    return -loss_per_sequence(logits, targets, scored)


def per_sequence(functional: str, logits: Tensor, targets: Tensor | None, scored: Tensor | None = None) -> Tensor:
    if functional == "entropy":
        return entropy_per_sequence(logits, scored)
    if functional == "loss":
        if targets is None:
            raise ValueError("functional='loss' needs targets (the next tokens)")
        return loss_per_sequence(logits, targets, scored)
    raise ValueError(f"functional={functional!r}; valid: {', '.join(FUNCTIONALS)}")
