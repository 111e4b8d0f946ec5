r"""Tiny one-layer transformers that add two ten-digit numbers (~50 to a few thousand parameters).

The residual stream has d = tok_dim + pos_dim dimensions: what a token *is* lives in the first
tok_dim, where it *is* in the last pos_dim (concatenated, not summed, so neither blurs the other)::

    x = [e(token) | p(position)]
    x ← x + Attention(norm(x))
    x ← x + FFN(norm(x))                   FFN(h) = W₂ GELU(W₁ h + b₁) + b₂
    logits_d = ⟨W_head norm(x), e(d)⟩      for the ten digits d: the output is tied to the embedding

Every trick of the public MicroAdder is an option of ``AdderConfig``:

* ``token_embedding="arc"``: the ten digits on a circular arc, e(d) = r (cos(α + dδ), sin(α + dδ)),
  three parameters r, α, δ (PLUS and EQUALS embed as 0). ``"table"``: a learned 12 × tok_dim table.
* ``positions="spiral"``: a frozen spiral p(i) = (a cos(2πi/n + φ), a sin(2πi/n + φ), s·i + o),
  n = ``turn`` places per turn, shared by xᵢ, yᵢ and zᵢ (so "same digit place" is "same point"),
  PLUS at 0, and two special points, learned with ``learned_points``: EQUALS (which predicts z₀)
  and CARRY (the slot of z₉, which predicts the final carry z₁₀ and has no x₁₀, y₁₀ to look at).
  ``"learned"``: a 32 × pos_dim table.
* attention with ``qk_source="pos"``: queries and keys read only the position encodings (before
  any norm), so *where* a token sits decides the routing and *what* it is cannot disturb it.
  ``shared_qk``: one matrix W for both, K = W x and Q = R(θ) W x, where R turns every plane
  (2k, 2k+1) of the query by the head's angle θ: on the spiral, a look-ahead of θ·turn/2π digit
  places. ``q_phase="learned"`` learns θ (starting one place ahead for the first head, down to 0
  for the last), ``"frozen"`` keeps those angles, ``"none"`` has no rotation. ``qk_per_head=False``:
  all heads share W and differ only by θ, i.e. by how far ahead they look. Scores are QKᵀ/√qk_dim
  under a causal mask.
* ``attn_rank=r``: each token offers r numbers Uᵀ x_v (x_v its token dims with ``v_source="tok"``),
  attention mixes them, and B (d × r) writes the mix back: r (dim(x_v) + d) parameters per head.
  Rank 1 is a scalar "digit value" per token.
* ``norm``: RMSNorm n(x) = w ⊙ x / √(mean(x²) + ε) before attention, FFN and head; ``"shared"``
  learns one w for all three, ``"separate"`` three, ``"unit"`` none (w = 1), ``"none"`` skips it.
* ``ffn_width``, ``ffn_bias``.

``parameter_budget(model)`` lists every learned tensor and every frozen buffer with its size, read
from the module: the explainer's budget panel and the challenge's parameter count come from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.addition import N_DIGITS, SEQ_LEN, VOCAB

TOKEN_EMBEDDINGS = ("arc", "table")
POSITIONS = ("spiral", "learned")
SOURCES = ("pos", "tok", "all")
NORMS = ("none", "unit", "shared", "separate")
PHASES = ("learned", "frozen", "none")
NORM_SITES = ("attention", "ffn", "head")


@dataclass(frozen=True)
class AdderConfig:
    tok_dim: int = 2
    pos_dim: int = 3
    token_embedding: str = "arc"
    positions: str = "spiral"
    spiral: tuple[float, float, float, float] = (1.0, 0.0, 0.25, -1.0)  # a, φ, s, o (frozen)
    turn: int = 10  # digit places per turn of the spiral
    learned_points: bool = True  # EQUALS and CARRY points learned (else frozen at places −1 and 9)
    n_heads: int = 1
    qk_dim: int = 4
    qk_source: str = "pos"
    shared_qk: bool = True
    qk_per_head: bool = True
    q_phase: str = "learned"
    v_source: str = "tok"
    attn_rank: int = 1
    ffn_width: int = 2
    ffn_bias: bool = False
    norm: str = "none"

    def __post_init__(self) -> None:
        def choice(name: str, valid: tuple[str, ...]) -> None:
            if getattr(self, name) not in valid:
                raise ValueError(f"AdderConfig.{name}={getattr(self, name)!r}; valid: {', '.join(valid)}")

        choice("token_embedding", TOKEN_EMBEDDINGS)
        choice("positions", POSITIONS)
        choice("qk_source", SOURCES)
        choice("v_source", SOURCES)
        choice("norm", NORMS)
        choice("q_phase", PHASES)
        for name in ("tok_dim", "pos_dim", "n_heads", "qk_dim", "attn_rank", "ffn_width", "turn"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"AdderConfig.{name}={value!r} must be an integer >= 1")
        if self.token_embedding == "arc" and self.tok_dim != 2:
            raise ValueError(f"AdderConfig: the arc embedding is 2-D; tok_dim={self.tok_dim} needs 'table'")
        if self.positions == "spiral" and self.pos_dim != 3:
            raise ValueError(f"AdderConfig: the spiral is 3-D; pos_dim={self.pos_dim} needs positions='learned'")
        if len(self.spiral) != 4:
            raise ValueError(f"AdderConfig.spiral={self.spiral!r} must be four numbers (a, φ, s, o)")

    @property
    def d_model(self) -> int:
        return self.tok_dim + self.pos_dim

    def source_dim(self, source: str) -> int:
        return {"pos": self.pos_dim, "tok": self.tok_dim, "all": self.d_model}[source]

    @classmethod
    def from_dict(cls, values: dict) -> AdderConfig:
        """The inverse of ``dataclasses.asdict`` (after a JSON round trip, which turns tuples into lists)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known})


# ------------------------------------------------------------------------------------------ pieces
class ArcEmbedding(nn.Module):
    """e(d) = r (cos(α + dδ), sin(α + dδ)) for the digits, 0 for PLUS and EQUALS: three parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.radius = nn.Parameter(torch.tensor(2.0))
        self.start = nn.Parameter(torch.tensor(-0.9))
        self.stride = nn.Parameter(torch.tensor(0.2))

    def digits(self) -> Tensor:
        angle = self.start + self.stride * torch.arange(10, dtype=self.radius.dtype)
        return self.radius * torch.stack([angle.cos(), angle.sin()], dim=1)

    def table(self) -> Tensor:
        return torch.cat([self.digits(), self.radius.new_zeros(VOCAB - 10, 2)])


class TableEmbedding(nn.Module):
    """A learned row per token (12 × tok_dim); the first ten rows double as the output vectors."""

    def __init__(self, tok_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(VOCAB, tok_dim))

    def digits(self) -> Tensor:
        return self.weight[:10]

    def table(self) -> Tensor:
        return self.weight


def spiral_points(spiral: tuple[float, float, float, float], turn: int, places: Tensor) -> Tensor:
    """p(i) = (a cos(2πi/turn + φ), a sin(2πi/turn + φ), s·i + o) for the digit places ``places``."""
    a, phase, slope, offset = spiral
    angle = 2 * math.pi * places / turn + phase
    return torch.stack([a * angle.cos(), a * angle.sin(), slope * places + offset], dim=1)


class SpiralPositions(nn.Module):
    """Frozen spiral points for the digit places, shared by x, y and z, and two special points.

    PLUS sits at 0. EQUALS (which predicts z₀) starts at place −1 and the slot of z₉ (CARRY: it
    predicts the final carry z₁₀, which has no x₁₀, y₁₀ to read) at place 9; with ``learned`` they
    are parameters, else they stay there. With ``turn = 11`` places per turn, place −1 is a free
    point of the circle: EQUALS is then "digit place −1" for every query, so the slot that writes
    z₁₀ finds it one place ahead, where z₁₀'s missing digits would be, and reads its value 0."""

    def __init__(self, spiral: tuple[float, float, float, float], turn: int, learned: bool) -> None:
        super().__init__()
        self.register_buffer("spiral", spiral_points(spiral, turn, torch.arange(N_DIGITS, dtype=torch.float32)))
        equals = spiral_points(spiral, turn, torch.tensor([-1.0]))[0]
        carry = self.spiral[N_DIGITS - 1].clone()
        if learned:
            self.equals, self.carry = nn.Parameter(equals), nn.Parameter(carry)
        else:
            self.register_buffer("equals", equals)
            self.register_buffer("carry", carry)

    def table(self) -> Tensor:
        """(32, 3): x₀…x₉, PLUS, y₀…y₉, EQUALS, z₀…z₈, CARRY (the slot of z₉)."""
        s, zero = self.spiral, self.spiral.new_zeros(1, 3)
        return torch.cat([s, zero, s, self.equals[None], s[: N_DIGITS - 1], self.carry[None]])


class LearnedPositions(nn.Module):
    def __init__(self, pos_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(SEQ_LEN, pos_dim))

    def table(self) -> Tensor:
        return self.weight


class RMSNorms(nn.Module):
    """The three pre-norms (attention, FFN, head) with no, one shared, or three weight vectors."""

    def __init__(self, kind: str, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.kind, self.eps = kind, eps
        n = {"none": 0, "unit": 0, "shared": 1, "separate": len(NORM_SITES)}[kind]
        self.weight = nn.Parameter(torch.ones(n, d)) if n else None

    def site_weight(self, site: int) -> Tensor | None:
        if self.weight is None:
            return None
        return self.weight[0 if self.kind == "shared" else site]

    def forward(self, x: Tensor, site: int) -> Tensor:
        """x (d, …) normalised over its first (feature) dim."""
        if self.kind == "none":
            return x
        x = x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + self.eps)
        w = self.site_weight(site)
        return x if w is None else x * w.view(-1, *([1] * (x.dim() - 1)))


def rotate_planes(q: Tensor, theta: Tensor) -> Tensor:
    """Turn each plane (2k, 2k+1) of q (H, qk, …) by its head's angle θ (H,); an odd last dim stays."""
    pairs = q.shape[1] // 2
    shape = (-1,) + (1,) * (q.dim() - 1)
    c, s = theta.cos().view(shape), theta.sin().view(shape)
    even, odd = q[:, 0 : 2 * pairs : 2], q[:, 1 : 2 * pairs : 2]
    turned = torch.stack([c * even - s * odd, s * even + c * odd], dim=2).flatten(1, 2)
    return torch.cat([turned, q[:, 2 * pairs :]], dim=1)


def apply(weight: Tensor, x: Tensor) -> Tensor:
    """weight (out, in) applied to x (in, …) -> (out, …): a plain matrix product over the flattened rest."""
    return (weight @ x.reshape(x.shape[0], -1)).view(weight.shape[0], *x.shape[1:])


class Attention(nn.Module):
    """Causal self-attention with cheap options: position-only routing, one Q/K matrix turned by a
    learned phase, and a rank-r value/output path. Heads are the leading dim of every tensor."""

    def __init__(self, cfg: AdderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, qk, src, v = cfg.n_heads, cfg.qk_dim, cfg.source_dim(cfg.qk_source), cfg.source_dim(cfg.v_source)
        hq = h if cfg.qk_per_head else 1  # one matrix broadcast over the heads
        self.query = nn.Parameter(torch.randn(hq, qk, src) / math.sqrt(src))
        self.key = None if cfg.shared_qk else nn.Parameter(torch.randn(hq, qk, src) / math.sqrt(src))
        # one digit place on the spiral is 2π/turn: the first head looks one place ahead, the last at its own
        phase = torch.linspace(2 * math.pi / cfg.turn, 0.0, h)
        if cfg.q_phase == "learned":
            self.phase = nn.Parameter(phase)
        else:
            self.register_buffer("phase", phase if cfg.q_phase == "frozen" else None)
        self.value = nn.Parameter(torch.randn(h, cfg.attn_rank, v) / math.sqrt(v))
        self.output = nn.Parameter(torch.randn(h, cfg.d_model, cfg.attn_rank) / math.sqrt(cfg.d_model))
        self.register_buffer("causal", torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool).tril())

    def _source(self, x: Tensor, source: str) -> Tensor:
        tok = self.cfg.tok_dim
        return {"pos": x[tok:], "tok": x[:tok], "all": x}[source]

    def pattern(self, x: Tensor, positions: Tensor) -> Tensor:
        """Attention weights (H, B, T, T) [query, key] for the normalised residual x (d, B, T). With
        ``qk_source="pos"`` queries and keys read the position encodings (pos_dim, T) themselves, so the
        pattern is the same for every sequence and comes back as (H, 1, T, T)."""
        src = positions[:, None] if self.cfg.qk_source == "pos" else self._source(x, self.cfg.qk_source)
        q = torch.einsum("hkc,cbt->hbtk", self.query, src)
        k = q if self.key is None else torch.einsum("hkc,cbt->hbtk", self.key, src)
        if self.phase is not None:
            q = q.expand(self.cfg.n_heads, *q.shape[1:])  # a shared W still turns by each head's own angle
            q = rotate_planes(q.movedim(-1, 1), self.phase).movedim(1, -1)
        t = src.shape[-1]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.cfg.qk_dim)
        return scores.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(-1)

    def forward(self, x: Tensor, positions: Tensor, last: int) -> Tensor:
        """The attention update (d, B, last) for the last ``last`` positions of x (d, B, T)."""
        h, r = self.cfg.n_heads, self.cfg.attn_rank
        d, b, t = x.shape
        values = apply(self.value.reshape(h * r, -1), self._source(x, self.cfg.v_source)).view(h, r, b, t)
        weights = self.pattern(x, positions)[:, :, t - last :]  # (H, B or 1, last, T)
        if weights.shape[1] == 1:  # one pattern for all: (H, r·B, T) @ (H, T, last) is one small matmul
            mixed = values.reshape(h, r * b, t) @ weights[:, 0].transpose(-1, -2)
        else:
            mixed = torch.einsum("hbqk,hrbk->hrbq", weights, values)
        return apply(self.output.permute(1, 0, 2).reshape(d, h * r), mixed.reshape(h * r, b, last))


# ------------------------------------------------------------------------------------------- model
class AdderModel(nn.Module):
    """``forward(tokens (B, T)) -> logits (B, T, 10)``: at every position, scores for the next digit.

    Inside, activations are feature-first (d, B, T): the matrices here are tiny (d ≈ 5), and a
    (out × d) @ (d × B·T) product runs about ten times faster on a CPU than the row-major
    (B·T × d) @ (d × out) — the whole training step is a string of such products."""

    def __init__(self, cfg: AdderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token = ArcEmbedding() if cfg.token_embedding == "arc" else TableEmbedding(cfg.tok_dim)
        if cfg.positions == "spiral":
            self.positions = SpiralPositions(cfg.spiral, cfg.turn, cfg.learned_points)
        else:
            self.positions = LearnedPositions(cfg.pos_dim)
        self.norm = RMSNorms(cfg.norm, cfg.d_model)
        self.attention = Attention(cfg)
        # nn.Linear only holds the weights (so Muon's split recognises them); they act as W @ x
        self.up = nn.Linear(cfg.d_model, cfg.ffn_width, bias=cfg.ffn_bias)
        self.down = nn.Linear(cfg.ffn_width, cfg.d_model, bias=cfg.ffn_bias)
        self.head = nn.Linear(cfg.d_model, cfg.tok_dim, bias=False)

    def embed(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The residual stream's start [e(token) | p(position)] (d, B, T), and p (pos_dim, T)."""
        b, t = tokens.shape
        pos = self.positions.table()[:t].T
        return torch.cat([self.token.table().T[:, tokens], pos[:, None].expand(-1, b, t)]), pos

    def _linear(self, layer: nn.Linear, x: Tensor) -> Tensor:
        y = apply(layer.weight, x)
        return y if layer.bias is None else y + layer.bias.view(-1, *([1] * (x.dim() - 1)))

    def residuals(self, tokens: Tensor, last: int | None = None) -> list[Tensor]:
        """The residual stream (d, B, last) of the last ``last`` positions (all by default) where the
        three norms read it: at the start, after attention, after the FFN."""
        last = tokens.shape[1] if last is None else last
        x, pos = self.embed(tokens)
        start = x[:, :, -last:]
        middle = start + self.attention(self.norm(x, 0), pos, last)
        return [start, middle, middle + self._linear(self.down, F.gelu(self._linear(self.up, self.norm(middle, 1))))]

    def scores(self, tokens: Tensor, last: int | None = None) -> Tensor:
        """Feature-first logits (10, B, last) for the last ``last`` positions (all by default)."""
        return apply(self.token.digits() @ self.head.weight, self.norm(self.residuals(tokens, last)[-1], 2))

    def forward(self, tokens: Tensor) -> Tensor:
        return self.scores(tokens).permute(1, 2, 0)

    def attention_pattern(self, tokens: Tensor) -> Tensor:
        """The weights (H, B or 1, T, T) that ``forward`` uses on ``tokens``."""
        x, pos = self.embed(tokens)
        return self.attention.pattern(self.norm(x, 0), pos)


# ---------------------------------------------------------------------------------------- counting
COMPONENTS = {
    "token": "token embedding",
    "positions": "positions",
    "attention": "attention",
    "norm": "norm",
    "up": "FFN",
    "down": "FFN",
    "head": "output head",
}


def parameter_budget(model: nn.Module) -> list[dict]:
    """One row per learned tensor (counted once however often it is used) and per frozen buffer
    (0 parameters: fixed encodings are free): name, component, shape, params."""
    rows = []
    for name, p in model.named_parameters():  # named_parameters() yields a tied tensor once
        rows.append(
            {
                "name": name,
                "component": COMPONENTS.get(name.split(".")[0], name.split(".")[0]),
                "shape": list(p.shape),
                "params": p.numel() if p.requires_grad else 0,
            }
        )
    for name, b in model.named_buffers():
        if b.dtype.is_floating_point:  # masks are plumbing, not encodings
            component = COMPONENTS.get(name.split(".")[0], name.split(".")[0])
            rows.append({"name": name, "component": component, "shape": list(b.shape), "params": 0})
    return rows


def count_parameters(model: nn.Module) -> int:
    """The challenge's count: elements of unique trainable tensors (weight tying respected, buffers free)."""
    unique = {id(p): p for p in model.parameters() if p.requires_grad}
    return sum(p.numel() for p in unique.values())
