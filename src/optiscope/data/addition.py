r"""Ten-digit addition: the public 10,010-case suite, the token layout, and training batches.

**The suite** (the public "AdderBoard" challenge): ten edge cases, then 10,000 pairs drawn by
``random.Random(2025)`` as ``(randint(0, 9999999999), randint(0, 9999999999))``, scored by exact
integer match of a + b.

**Tokens.** Digits are written least-significant first, so that the digit being produced only ever
depends on digits already seen (the carry flows the way the sequence is read). With
x = Σ xᵢ10ⁱ, y = Σ yᵢ10ⁱ and z = x + y = Σ zᵢ10ⁱ (11 digits, z₁₀ the final carry)::

    position  0 … 9     10     11 … 20    21     22 … 31
    token     x₀ … x₉   PLUS   y₀ … y₉    EQUALS  z₀ … z₉        (z₁₀ is predicted, never fed)

The model reads the 22-token prompt and emits z₀ … z₁₀ one at a time; in training all 11 answer
digits are predicted in one pass from the 32 tokens above (teacher forcing), the prediction of zᵢ
sitting at position 21 + i.

**Batches.** A batch mixes two kinds of example. *Uniform*: each operand has a length n drawn
uniformly from 1 … ``max_digits`` and uniform digits below it (the digit-length curriculum raises
``max_digits`` over training). *Carry-heavy*: a carry chain is planted — one position with
xᵢ + yᵢ ≥ 10 followed by L − 1 positions with xᵢ + yᵢ ≥ 9, L uniform, half of them exactly 9. The
digit sum 9 is the hard case: the output digit and the next carry then depend on the incoming carry
alone, and uniform digits give it one position in ten, rarely several in a row.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

N_DIGITS = 10
ANSWER_DIGITS = N_DIGITS + 1
MAX_OPERAND = 10**N_DIGITS - 1
PLUS, EQUALS = 10, 11
VOCAB = 12
PROMPT_LEN = 2 * N_DIGITS + 2  # x, PLUS, y, EQUALS
SEQ_LEN = PROMPT_LEN + N_DIGITS  # the prompt and the answer digits that are fed back
TOKEN_NAMES = tuple(str(d) for d in range(10)) + ("+", "=")

SUITE_SEED = 2025
SUITE_RANDOM_CASES = 10_000
EDGE_CASES: tuple[tuple[int, int], ...] = (
    (0, 0),
    (0, 1),
    (MAX_OPERAND, 0),
    (MAX_OPERAND, 1),
    (MAX_OPERAND, MAX_OPERAND),
    (5_000_000_000, 5_000_000_000),
    (1_111_111_111, 8_888_888_889),
    (1_234_567_890, 9_876_543_210),
    (MAX_OPERAND, MAX_OPERAND),
    (1, MAX_OPERAND),
)


def suite() -> list[tuple[int, int]]:
    """The 10,010 (a, b) pairs of the public suite, in the challenge's order."""
    rng = random.Random(SUITE_SEED)
    drawn = [(rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)) for _ in range(SUITE_RANDOM_CASES)]
    return list(EDGE_CASES) + drawn


def check_operand(value: object, name: str = "operand") -> int:
    """``value`` as an int in [0, 9 999 999 999], else a ValueError naming it and the valid range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an integer in [0, {MAX_OPERAND}] (got {type(value).__name__})")
    if not 0 <= value <= MAX_OPERAND:
        raise ValueError(f"{name}={value} is out of range; valid operands are integers in [0, {MAX_OPERAND}]")
    return value


# ------------------------------------------------------------------------------------------ digits
def to_digits(values: Tensor, n: int = N_DIGITS) -> Tensor:
    """Integers (any shape, int64) -> their ``n`` decimal digits, least significant first: (..., n)."""
    powers = 10 ** torch.arange(n, dtype=torch.int64)
    return torch.div(values.unsqueeze(-1), powers, rounding_mode="floor") % 10


def from_digits(digits: Tensor) -> Tensor:
    """Digits (..., n), least significant first -> the integers they spell (int64)."""
    powers = 10 ** torch.arange(digits.shape[-1], dtype=torch.int64)
    return (digits.to(torch.int64) * powers).sum(-1)


def carries(x: Tensor, y: Tensor) -> Tensor:
    """The carry out of every digit position (B, 10) of x + y, as 0/1, without a loop over positions.

    With sᵢ = xᵢ + yᵢ, position i carries exactly when the last position j ≤ i whose sum is not 9
    exists and has sⱼ ≥ 10: a 9 only passes on what reaches it, anything else decides afresh."""
    s = x + y
    positions = torch.arange(N_DIGITS).expand_as(s)
    last_deciding = torch.where(s != 9, positions, -1).cummax(dim=1).values
    decided_by_generate = s.gather(1, last_deciding.clamp(min=0)) >= 10
    return (decided_by_generate & (last_deciding >= 0)).long()


def add_digits(x: Tensor, y: Tensor) -> Tensor:
    """The 11 answer digits (B, 11) of x + y for digit rows (B, 10), least significant first."""
    c = carries(x, y)
    incoming = torch.cat([torch.zeros_like(c[:, :1]), c[:, :-1]], dim=1)
    return torch.cat([(x + y + incoming) % 10, c[:, -1:]], dim=1)


def longest_carry_chain(x: Tensor, y: Tensor) -> Tensor:
    """Per example, the longest run of consecutive positions that carry (0 … 10)."""
    run = torch.zeros(x.shape[0], dtype=torch.int64)
    best = torch.zeros_like(run)
    for c in carries(x, y).unbind(1):
        run = (run + 1) * c
        best = torch.maximum(best, run)
    return best


# ------------------------------------------------------------------------------------------ tokens
def prompt_tokens(x: Tensor, y: Tensor) -> Tensor:
    """Operand digits (B, 10) each -> the prompt (B, 22): x₀…x₉ PLUS y₀…y₉ EQUALS."""
    column = torch.ones(x.shape[0], 1, dtype=torch.int64)
    return torch.cat([x, PLUS * column, y, EQUALS * column], dim=1)


def sequence(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(inputs (B, 32), targets (B, 11)): the teacher-forced training pair for x + y."""
    z = add_digits(x, y)
    return torch.cat([prompt_tokens(x, y), z[:, :N_DIGITS]], dim=1), z


def decode_tokens(tokens: Sequence[int]) -> str:
    """Tokens as text, e.g. '0987654321+0123456789=' (digits as stored: least significant first)."""
    return "".join(TOKEN_NAMES[t] for t in tokens)


# ----------------------------------------------------------------------------------------- batches
def uniform_digits(batch: int, max_digits: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Two operands per example, each with a length uniform in 1 … max_digits and uniform digits."""
    x, y = torch.randint(0, 10, (2, batch, N_DIGITS), generator=generator)
    lengths = torch.randint(1, max_digits + 1, (2, batch, 1), generator=generator)
    keep = torch.arange(N_DIGITS) < lengths
    return x * keep[0], y * keep[1]


def carry_chain_digits(batch: int, max_digits: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Operands of ``max_digits`` digits with a planted carry chain of length L: at its first position
    the digit sum s = xᵢ + yᵢ is 10 … 18 (a carry is born), at the next L − 1 positions s is 9 (the
    carry only passes through) or, as often, 10 … 18 (it is renewed: the sums 18 + 1 and 9 + 1 are
    the easiest to get wrong). Chain start and L are uniform over what fits below ``max_digits``;
    elsewhere the digits are uniform. Given s, x is uniform over the digits that allow it, y = s − x."""
    pos = torch.arange(N_DIGITS)
    start = torch.randint(0, max_digits, (batch, 1), generator=generator)
    length = 1 + (torch.rand(batch, 1, generator=generator) * (max_digits - start)).long()
    born = pos == start
    carried = (pos > start) & (pos < start + length)
    x_free, y_free = torch.randint(0, 10, (2, batch, N_DIGITS), generator=generator)
    high = 10 + torch.randint(0, 9, (batch, N_DIGITS), generator=generator)
    nine = torch.rand(batch, N_DIGITS, generator=generator) < 0.5
    s = torch.where(born | (carried & ~nine), high, torch.where(carried, 9, x_free + y_free))
    low, top = (s - 9).clamp(min=0), s.clamp(max=9)
    x = low + (torch.rand(batch, N_DIGITS, generator=generator) * (top - low + 1)).long()
    x = torch.where(born | carried, x, x_free)
    keep = pos < max_digits
    return x * keep, (s - x) * keep


def training_batch(
    batch: int, max_digits: int, carry_fraction: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """A teacher-forced batch (inputs (B, 32), targets (B, 11)); round(carry_fraction·B) examples
    carry-heavy, the rest uniform."""
    heavy = round(carry_fraction * batch)
    xu, yu = uniform_digits(batch - heavy, max_digits, generator)
    xc, yc = carry_chain_digits(heavy, max_digits, generator)
    return sequence(torch.cat([xc, xu]), torch.cat([yc, yu]))


# ------------------------------------------------------------------- reading a model of this layout
def place(label: str) -> int | None:
    """Digit place of a position label: x3, y3, z3 -> 3; '=' -> -1 (it writes z0); '+' -> None."""
    return -1 if label == "=" else int(label[1:]) if label[0] in "xyz" else None


def routing_summary(pattern: Tensor, labels: list[str]) -> str:
    """Share of one head's attention, over the slots writing z1 … z9 (query at place j), on keys at place
    j + k; the two largest shares, e.g. '48% on place j+1, 45% on place j+0'."""
    rows = [labels.index(f"z{j}") for j in range(9)]
    shares: dict[str, float] = defaultdict(float)
    for r in rows:
        for k, weight in enumerate(pattern[r].tolist()):
            key = place(labels[k])
            name = "delimiters" if key is None or labels[k] == "=" else f"place j{key - place(labels[r]):+d}"
            shares[name] += weight / len(rows)
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{100 * share:.0f}% on {name}" for name, share in top)


def position_labels() -> list[str]:
    """The name of each position of a sequence: x0 … x9, +, y0 … y9, =, z0 … z9."""
    digits = range(N_DIGITS)
    return [f"x{i}" for i in digits] + ["+"] + [f"y{i}" for i in digits] + ["="] + [f"z{i}" for i in digits]
