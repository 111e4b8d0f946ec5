"""The addition suite, digits, tokens and batches, checked against plain Python integer arithmetic."""

import hashlib
import random

import pytest
import torch

from optiscope.data import addition as A

BIG = 9_999_999_999


def py_digits(n: int, width: int) -> list[int]:
    return [int(c) for c in str(n).zfill(width)[::-1]]


def py_carries(a: int, b: int) -> list[int]:
    out, carry = [], 0
    for i in range(10):
        carry = (a // 10**i % 10 + b // 10**i % 10 + carry) // 10
        out.append(carry)
    return out


def py_longest_chain(a: int, b: int) -> int:
    best = run = 0
    for c in py_carries(a, b):
        run = run + 1 if c else 0
        best = max(best, run)
    return best


def digit_rows(pairs):
    return A.to_digits(torch.tensor([a for a, _ in pairs])), A.to_digits(torch.tensor([b for _, b in pairs]))


# ---------------------------------------------------------------------------------------------- suite
def test_suite_edge_cases_and_first_random_pairs():
    cases = A.suite()
    assert len(cases) == 10_010
    assert cases[:10] == [
        (0, 0),
        (0, 1),
        (BIG, 0),
        (BIG, 1),
        (BIG, BIG),
        (5_000_000_000, 5_000_000_000),
        (1_111_111_111, 8_888_888_889),
        (1_234_567_890, 9_876_543_210),
        (BIG, BIG),
        (1, BIG),
    ]
    # the first pairs drawn by the challenge's generator, pinned as numbers and recomputed here
    assert cases[10:13] == [(2395527356, 9334186774), (4296888873, 8475224721), (2446880696, 4577514554)]
    rng = random.Random(2025)
    assert cases[10:] == [(rng.randint(0, BIG), rng.randint(0, BIG)) for _ in range(10_000)]


def test_suite_checksum():
    text = ";".join(f"{a}+{b}" for a, b in A.suite())
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "fb42f7ccdb43d41f"


@pytest.mark.parametrize("bad", [-1, 10**10, 1.5, "7", True, None, 2.0])
def test_check_operand_rejects_with_the_valid_range(bad):
    with pytest.raises(ValueError, match=r"a=.*\[0, 9999999999\]"):
        A.check_operand(bad, "a")


def test_check_operand_accepts_the_ends():
    assert A.check_operand(0) == 0 and A.check_operand(BIG) == BIG


# --------------------------------------------------------------------------------------------- digits
def test_digits_round_trip_and_arithmetic_against_python():
    rng = random.Random(7)
    pairs = A.suite()[:50] + [(rng.randint(0, BIG), rng.randint(0, BIG)) for _ in range(500)]
    pairs += [(10**k - 1, 1) for k in range(1, 11)] + [(5 * 10**k, 5 * 10**k) for k in range(10)]
    x, y = digit_rows(pairs)
    assert x[0].tolist() == [0] * 10 and A.to_digits(torch.tensor([1234])).tolist() == [[4, 3, 2, 1, 0, 0, 0, 0, 0, 0]]
    assert A.from_digits(x).tolist() == [a for a, _ in pairs]
    z = A.add_digits(x, y)
    assert z.tolist() == [py_digits(a + b, 11) for a, b in pairs]
    assert A.carries(x, y).tolist() == [py_carries(a, b) for a, b in pairs]
    assert A.longest_carry_chain(x, y).tolist() == [py_longest_chain(a, b) for a, b in pairs]


def test_suite_has_every_carry_chain_length():
    x, y = digit_rows(A.suite())
    counts = torch.bincount(A.longest_carry_chain(x, y), minlength=11)
    assert counts.sum() == 10_010 and (counts > 0).all()


# --------------------------------------------------------------------------------------------- tokens
def test_token_layout():
    x, y = digit_rows([(123, 4_000_000_009)])
    inputs, targets = A.sequence(x, y)
    assert A.decode_tokens(A.prompt_tokens(x, y)[0].tolist()) == "3210000000+9000000004="
    assert targets[0].tolist() == py_digits(4_000_000_132, 11)
    assert inputs.shape == (1, A.SEQ_LEN) and targets.shape == (1, A.ANSWER_DIGITS)
    assert inputs[0, A.PROMPT_LEN :].tolist() == targets[0, :10].tolist()


# -------------------------------------------------------------------------------------------- batches
def test_uniform_digits_respect_the_length_cap():
    g = torch.Generator().manual_seed(0)
    x, y = A.uniform_digits(2000, 4, g)
    assert (x[:, 4:] == 0).all() and (y[:, 4:] == 0).all()
    assert x.min() >= 0 and x.max() <= 9
    lengths = 10 - (x.flip(1) != 0).long().argmax(1)  # position of the highest nonzero digit + 1
    assert set(lengths[x.any(1)].tolist()) == {1, 2, 3, 4}


def test_carry_chain_digits_plant_chains():
    g = torch.Generator().manual_seed(1)
    x, y = A.carry_chain_digits(3000, 10, g)
    assert x.min() >= 0 and x.max() <= 9 and y.min() >= 0 and y.max() <= 9
    chains = A.longest_carry_chain(x, y)
    assert (chains >= 1).all()  # every example carries somewhere
    assert (chains >= 6).float().mean() > 0.1  # long chains are common, unlike uniform digits
    ux, uy = A.uniform_digits(3000, 10, g)
    assert (A.longest_carry_chain(ux, uy) >= 6).float().mean() < (chains >= 6).float().mean() / 2
    cx, cy = A.carry_chain_digits(500, 3, g)
    assert (cx[:, 3:] == 0).all() and (cy[:, 3:] == 0).all()


def test_training_batch_is_reproducible_and_mixed():
    a = A.training_batch(64, 10, 0.25, torch.Generator().manual_seed(5))
    b = A.training_batch(64, 10, 0.25, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    inputs, targets = a
    x, y = inputs[:, :10], inputs[:, 11:21]
    assert torch.equal(A.add_digits(x, y), targets)
    assert (A.longest_carry_chain(x[:16], y[:16]) >= 1).all()  # the first quarter is carry-heavy


def test_position_labels_follow_the_sequence_layout():
    labels = A.position_labels()
    assert len(labels) == A.SEQ_LEN  # the prompt, then the answer digits fed back (z0 … z9)
    assert labels[:2] == ["x0", "x1"] and labels[A.N_DIGITS] == "+" and labels[A.PROMPT_LEN - 1] == "="
    assert [A.place(x) for x in ("x3", "y7", "z0", "=", "+")] == [3, 7, 0, -1, None]


def test_routing_summary_reads_where_each_answer_slot_looks():
    """A head whose every z_j slot attends half to x_{j+1} and half to y_j routes 50/50 to places j+1, j+0."""
    labels = A.position_labels()
    pattern = torch.zeros(len(labels), len(labels))
    for j in range(9):
        row = labels.index(f"z{j}")
        pattern[row, labels.index(f"x{j + 1}")] = 0.5
        pattern[row, labels.index(f"y{j}")] = 0.5
    summary = A.routing_summary(pattern, labels)
    assert summary in ("50% on place j+1, 50% on place j+0", "50% on place j+0, 50% on place j+1")
