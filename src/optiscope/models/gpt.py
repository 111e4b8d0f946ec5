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
    """Sizes and options of a ``GPT``.

    ``bias=False`` drops the biases of every Linear and LayerNorm (as nanoGPT's default configuration
    does; slightly fewer parameters, no loss in quality at this scale). ``tie_weights`` makes the output
    head share the token embedding matrix.
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
    """The model of the module docstring. Parameters are initialised from torch's global RNG."""

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
        """GPT-2 initialisation (module docstring); a tied matrix is drawn once, as the embedding."""
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
        """Logits (B, T, V) for token ids ``idx`` (B, T); with ``targets`` (B, T), ``(logits, loss)``.

        The loss is the mean cross-entropy −log softmax(logits)[target] over all B·T positions.
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
        """Number of scalar parameters, a tied matrix counted once."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate_greedy(self, idx: Tensor, max_new_tokens: int) -> Tensor:
        """``idx`` (B, T₀) extended by ``max_new_tokens`` tokens, each the argmax of the next-token logits
        (temperature 0; the lowest id wins a tie). Runs in the model's current mode: call ``eval()``
        first when dropout is on."""
        return self._extend(idx, max_new_tokens, lambda logits: logits.argmax(dim=-1, keepdim=True))

    @torch.no_grad()
    def sample(
        self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, generator: torch.Generator | None = None
    ) -> Tensor:
        """``idx`` (B, T₀) extended by ``max_new_tokens`` tokens drawn from softmax(logits / temperature).

        Randomness comes from ``generator`` (on the model's device) or, when None, torch's global RNG.
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
