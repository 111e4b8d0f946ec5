"""The challenge's interface and scoring: ``build_model``, ``add``, greedy decoding, the suite report.

Decoding is generic: feed the prompt, take the argmax of the last position's logits, append it, and
repeat eleven times. Nothing here knows about carries; the model alone does the arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from ..data.addition import (
    ANSWER_DIGITS,
    N_DIGITS,
    PROMPT_LEN,
    add_digits,
    check_operand,
    from_digits,
    longest_carry_chain,
    prompt_tokens,
    sequence,
    suite,
    to_digits,
)
from ..runs import load_checkpoint
from .adder import AdderConfig, AdderModel, count_parameters

EVAL_CHUNK = 2048  # rows per forward pass: bounds the (rows, heads, 32, 32) attention tensor


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def greedy_answer(model: nn.Module, prompts: Tensor) -> Tensor:
    """Prompts (B, 22) -> the 11 answer digits (B, 11) the model writes, one argmax at a time."""
    seq = prompts
    for _ in range(ANSWER_DIGITS):
        next_digit = model(seq)[:, -1].argmax(-1)
        seq = torch.cat([seq, next_digit[:, None]], dim=1)
    return seq[:, prompts.shape[1] :]


@torch.no_grad()
def add_many(model: nn.Module, a: Tensor, b: Tensor) -> Tensor:
    """a + b as the model computes it, for int64 tensors of operands (evaluated in chunks)."""
    answers = [
        greedy_answer(model, prompt_tokens(to_digits(ca), to_digits(cb)))
        for ca, cb in zip(a.split(EVAL_CHUNK), b.split(EVAL_CHUNK), strict=True)
    ]
    return from_digits(torch.cat(answers)) if answers else a.new_zeros(0)


def add(model: nn.Module, a: int, b: int) -> int:
    """The challenge's ``add(model, a, b)``: a + b as the model computes it, for 0 ≤ a, b ≤ 9 999 999 999."""
    a, b = check_operand(a, "a"), check_operand(b, "b")
    with eval_mode(model):
        return int(add_many(model, torch.tensor([a]), torch.tensor([b]))[0])


def build_model(checkpoint: str | Path) -> tuple[AdderModel, dict]:
    """The challenge's ``build_model``: the model saved in ``checkpoint`` (by ``optiscope run adder``)
    and its metadata (name, unique-parameter count, architecture)."""
    state = load_checkpoint(Path(checkpoint))
    cfg = AdderConfig.from_dict(state["model_config"])
    model = AdderModel(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    metadata = {
        "name": "optiscope adder",
        "params": count_parameters(model),
        "architecture": f"1 layer, {cfg.n_heads} head(s), d_model {cfg.d_model}, FFN {cfg.ffn_width}",
        "config": state["model_config"],
    }
    return model, metadata


@torch.no_grad()
def evaluate(model: nn.Module, pairs: list[tuple[int, int]] | None = None, examples: int = 8) -> dict:
    """Exact-match accuracy of ``model`` on ``pairs`` (default: the 10,010-case suite), with the
    wrong digits per answer position, accuracy per longest-carry-chain length and a few failures."""
    pairs = suite() if pairs is None else pairs
    a = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    with eval_mode(model):
        predicted = add_many(model, a, b)
    x, y = to_digits(a), to_digits(b)
    wrong_digits = to_digits(predicted, ANSWER_DIGITS) != add_digits(x, y)
    correct = ~wrong_digits.any(1)
    chains = longest_carry_chain(x, y)
    by_chain = [
        {"chain": n, "cases": int((chains == n).sum()), "correct": int(correct[chains == n].sum())}
        for n in range(N_DIGITS + 1)
    ]
    failures = [
        {"a": int(a[i]), "b": int(b[i]), "expected": int(a[i] + b[i]), "got": int(predicted[i])}
        for i in (~correct).nonzero().flatten()[:examples].tolist()
    ]
    return {
        "correct": int(correct.sum()),
        "cases": len(pairs),
        "accuracy": float(correct.float().mean()) if pairs else 0.0,
        "wrong_digits_by_position": wrong_digits.sum(0).tolist(),
        "by_carry_chain": by_chain,
        "failures": failures,
    }


class SuiteScorer:
    """Exact matches on the suite from one teacher-forced pass instead of eleven decoding passes.

    Greedy decoding writes the right answer exactly when every teacher-forced argmax is right: up to
    the first wrong digit both feed the model the same tokens, and a causal model's output at a
    position does not depend on what follows. So the count equals the greedy one (barring float
    near-ties between the two computations); ``evaluate`` remains the challenge's measurement."""

    def __init__(self, pairs: list[tuple[int, int]] | None = None) -> None:
        pairs = suite() if pairs is None else pairs
        x = to_digits(torch.tensor([a for a, _ in pairs], dtype=torch.int64))
        y = to_digits(torch.tensor([b for _, b in pairs], dtype=torch.int64))
        self.inputs, self.targets = sequence(x, y)
        self.cases = len(pairs)

    @torch.no_grad()
    def right(self, model: nn.Module) -> Tensor:
        """Per case: is every answer digit the teacher-forced argmax? (bool, cases)"""
        with eval_mode(model):
            return torch.cat(
                [
                    (model(inp)[:, PROMPT_LEN - 1 :].argmax(-1) == tgt).all(1)
                    for inp, tgt in zip(self.inputs.split(EVAL_CHUNK), self.targets.split(EVAL_CHUNK), strict=True)
                ]
            )

    def correct(self, model: nn.Module) -> int:
        return int(self.right(model).sum())
