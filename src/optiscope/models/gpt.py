r"""A small GPT: a decoder-only transformer language model, in one file.

Shapes: B batch, T positions (≤ ``block_size``), C = ``n_embd``, H = ``n_head``, D = C / H, V = ``vocab_size``,
L = ``n_layer``. For token ids ``idx`` of shape (B, T)::

    x₀     = E[idx] + P[0 … T−1]                 token and learned position embeddings, (B, T, C)
    xₗ'    = xₗ  + Attn(LN(xₗ))                   L pre-norm residual blocks, l = 0 … L−1
    xₗ₊₁   = xₗ' + MLP(LN(xₗ'))
    logits = LN(x_L) Wᵀ                           (B, T, V); W is E itself when tie_weights

    Attn(x) = concat_h softmax(q_h k_hᵀ / √D + M) v_h · W_o,   [q | k | v] = x W_qkv,
              M[i, j] = 0 for j ≤ i and −∞ for j > i (position i sees only positions up to i)
    MLP(x)  = GELU(x W_up) W_down,   W_up: C → 4C,  W_down: 4C → C

so the logits at position t depend on ``idx[:, : t + 1]`` only. Dropout, when configured, acts on the
embeddings, on the attention weights and on both residual branches.

Initialisation follows GPT-2: weights ~ N(0, 0.02²), biases 0, LayerNorm scale 1. The two matrices
that write into the residual stream, W_o and W_down, get std 0.02 / √(2L): each of the 2L residual
branches adds its variance to the stream, and the scaling keeps the stream's variance at
initialisation from growing with depth.

``attention="auto"`` calls ``torch.nn.functional.scaled_dot_product_attention``, which picks a fused
kernel (flash or memory-efficient attention) where one applies. Those kernels have no second derivative
and no forward-mode rule, so ``attention="math"`` computes the formula above with plain matmul, mask
and softmax: double backward (Hessian-vector products), ``torch.func.jvp`` and float64 all work. The
two modes have the same parameters, so a checkpoint trained with one loads into the other
(``GPT(dataclasses.replace(config, attention="math")).load_state_dict(...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_MODES = ("auto", "math")
INIT_STD = 0.02


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and options of a [`GPT`][optiscope.models.GPT]; frozen, validated when built.

    With V = ``vocab_size``, C = ``n_embd``, L = ``n_layer`` and T = ``block_size``, the model has V·C + T·C
    embedding parameters, 12·C² per block in its matrices, and a V·C head unless it is tied (biases and
    LayerNorm scales aside).

    Args:
        vocab_size: V, the number of token ids; a positive integer.
        n_layer: L, the number of transformer blocks; a positive integer.
        n_head: H, the attention heads per block; a positive integer dividing ``n_embd``.
        n_embd: C, the width of the residual stream; a positive integer.
        block_size: T, the most positions the model reads (its learned position embeddings); a positive
            integer.
        dropout: the dropout probability on the embeddings, the attention weights and both residual
            branches, in [0, 1); 0 for none.
        bias: whether every Linear and LayerNorm has a bias. False, as in nanoGPT's default configuration:
            slightly fewer parameters, no loss in quality at this scale.
        tie_weights: whether the output head shares the token embedding matrix.
        attention: ``"auto"`` for torch's ``scaled_dot_product_attention`` (a fused kernel where one
            applies); ``"math"`` for plain matmul, mask and softmax, which have second derivatives (for
            Hessian-vector products), forward-mode rules (``torch.func.jvp``) and float64.

    Raises:
        ValueError: a size that is not a positive integer, ``n_embd`` not divisible by ``n_head``, ``dropout``
            outside [0, 1), or an unknown ``attention``.

    Examples:
        >>> from optiscope.models import GPTConfig
        >>> config = GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=16, block_size=32)
        >>> config.n_embd // config.n_head, config.attention, config.tie_weights
        (8, 'auto', True)
        >>> GPTConfig(vocab_size=65, n_layer=2, n_head=3, n_embd=16, block_size=32)
        Traceback (most recent call last):
        ...
        ValueError: GPTConfig: n_embd=16 must be divisible by n_head=3 (heads split n_embd evenly)
    """

    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    attention: str = "auto"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig: {name}={value!r} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} must be divisible by n_head={self.n_head} (heads split n_embd evenly)"
            )
        if not (isinstance(self.dropout, int | float) and 0 <= self.dropout < 1):
            raise ValueError(f"GPTConfig: dropout={self.dropout!r} must be in [0, 1)")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"GPTConfig: attention={self.attention!r}; valid modes: {', '.join(ATTENTION_MODES)}")


def math_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """Causal attention softmax(q kᵀ/√D + M) v from plain ops, for (…, T, D) queries, keys and values."""
    t, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(diagonal=1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return F.dropout(weights, dropout_p) @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.dropout, self.math = config.n_head, config.dropout, config.attention == "math"
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        # (B, T, 3C) → three (B, H, T, D) tensors: heads become a batch dimension
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        p = self.dropout if self.training else 0.0
        if self.math:
            y = math_attention(q, k, v, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.up = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.down = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm_attn = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.norm_mlp = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


class GPT(nn.Module):
    """A small decoder-only transformer language model (nanoGPT's shape): token ids in, next-token logits out.

    For ids (B, T): x₀ = E[idx] + P[0 … T−1], then L pre-norm residual blocks
    x ← x + Attn(LN(x)), x ← x + MLP(LN(x)) with causal attention over H heads and MLP(x) = GELU(x W_up) W_down
    (C → 4C → C), and logits = LN(x_L) Wᵀ, W = E when tied. The logits at position t depend on
    ``idx[:, : t + 1]`` only.

    Args:
        config: the sizes and options.

    Raises:
        TypeError: ``config`` not a [`GPTConfig`][optiscope.models.GPTConfig].

    Examples:
        >>> import torch
        >>> from optiscope.models import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=4))
        >>> model.num_parameters()
        904
        >>> idx = torch.zeros(2, 4, dtype=torch.long)
        >>> logits, loss = model(idx, targets=idx)
        >>> logits.shape, round(loss.item(), 1)  # about ln 10 at initialisation
        (torch.Size([2, 4, 10]), 2.3)

    Notes:
        - **Initialisation** follows GPT-2, from torch's global RNG: weights ~ N(0, 0.02²), biases 0, LayerNorm
          scale 1; the two matrices that write into the residual stream, W_o and W_down, get std 0.02/√(2L), so
          that the stream's variance at initialisation does not grow with depth (each of the 2L residual
          branches adds its variance). A tied matrix is drawn once, as the embedding.
        - **Attention modes.** ``attention="auto"``'s fused kernels (flash, memory-efficient) have no second
          derivative and no forward-mode rule; ``attention="math"`` computes softmax(q kᵀ/√D + M) v from plain
          ops, so double backward, ``torch.func.jvp`` and float64 work. The two have the same parameters: a
          checkpoint trained with one loads into the other
          (``GPT(dataclasses.replace(config, attention="math")).load_state_dict(...)``).
        - The output head is registered last: ``optim.split_params_for_muon`` takes the last Linear of a model
          as its output head.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_out = nn.LayerNorm(config.n_embd, bias=config.bias)
        # Registered last: optim.split_params_for_muon takes the last Linear of a model as its output head.
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.token_embedding.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw every parameter anew: GPT-2's initialisation, from torch's global RNG.

        Weights ~ N(0, 0.02²), W_o and W_down with std 0.02/√(2L), biases 0, LayerNorm scale 1; a tied matrix
        is drawn once, as the embedding.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding) and not (module is self.head and self.config.tie_weights):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.down.weight, mean=0.0, std=residual_std)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Next-token logits for token ids, and the loss when targets are given.

        Args:
            idx: token ids, an integer tensor of shape (B, T) with T ≤ ``block_size``.
            targets: the next token at each position, (B, T); None for logits alone.

        Returns:
            Logits of shape (B, T, V); with ``targets``, ``(logits, loss)``, the loss the mean cross-entropy
                −log softmax(logits)[target] over all B·T positions (a scalar tensor).

        Raises:
            ValueError: ``idx`` not 2-D, or T > ``block_size``.
        """
        if idx.ndim != 2:
            raise ValueError(f"GPT: idx must have shape (batch, time), got {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"GPT: sequence length {t} exceeds block_size={self.config.block_size}")
        positions = torch.arange(t, device=idx.device)
        x = self.dropout(self.token_embedding(idx) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm_out(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def num_parameters(self) -> int:
        """Number of scalar parameters, a tied matrix counted once.

        Returns:
            The count.
        """
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate_greedy(self, idx: Tensor, max_new_tokens: int) -> Tensor:
        """``idx`` extended by ``max_new_tokens`` tokens, each the argmax of the next-token logits.

        Temperature 0; the lowest id wins a tie. The model reads at most the last ``block_size`` positions.
        Runs in the model's current mode: call ``eval()`` first when dropout is on.

        Args:
            idx: the prompt, token ids of shape (B, T₀) with T₀ ≥ 1.
            max_new_tokens: how many tokens to append; ≥ 0.

        Returns:
            Token ids of shape (B, T₀ + ``max_new_tokens``), the prompt first.

        Raises:
            ValueError: ``max_new_tokens`` not a non-negative integer, or ``idx`` not of shape (B, T₀ ≥ 1).
        """
        return self._extend(idx, max_new_tokens, lambda logits: logits.argmax(dim=-1, keepdim=True))

    @torch.no_grad()
    def sample(
        self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, generator: torch.Generator | None = None
    ) -> Tensor:
        """``idx`` extended by ``max_new_tokens`` tokens drawn from softmax(logits / temperature).

        The model reads at most the last ``block_size`` positions, in its current mode (call ``eval()`` first
        when dropout is on).

        Args:
            idx: the prompt, token ids of shape (B, T₀) with T₀ ≥ 1.
            max_new_tokens: how many tokens to append; ≥ 0.
            temperature: divides the logits; finite and > 0 (``generate_greedy`` is temperature 0).
            generator: the source of randomness, on the model's device; None for torch's global RNG.

        Returns:
            Token ids of shape (B, T₀ + ``max_new_tokens``), the prompt first.

        Raises:
            ValueError: ``temperature`` not finite and > 0, ``max_new_tokens`` not a non-negative integer, or
                ``idx`` not of shape (B, T₀ ≥ 1).
        """
        if not (isinstance(temperature, int | float) and temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"sample: temperature={temperature!r} must be > 0 (use generate_greedy for temperature 0)")

        def draw(logits: Tensor) -> Tensor:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            return torch.multinomial(probs, num_samples=1, generator=generator)

        return self._extend(idx, max_new_tokens, draw)

    def _extend(self, idx: Tensor, max_new_tokens: int, choose: Callable[[Tensor], Tensor]) -> Tensor:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a non-negative integer")
        if idx.ndim != 2 or idx.shape[1] == 0:
            raise ValueError(f"the prompt idx must have shape (batch, time ≥ 1), got {tuple(idx.shape)}")
        for _ in range(max_new_tokens):
            # the model has seen at most block_size positions, so it only ever reads the latest ones
            logits = self(idx[:, -self.config.block_size :])[:, -1, :]
            idx = torch.cat([idx, choose(logits)], dim=1)
        return idx
