"""Lanczos's contract with its caller: a start that is not a vector (or a block of them) of a real floating dtype
is refused in one line naming what it got and what it takes."""

import pytest
import torch

from optiscope.curvature import lanczos


@pytest.mark.parametrize(
    ("start", "said"),
    [
        (torch.tensor(1.0), r"a tensor of shape \(\)"),
        (torch.ones(2, 2, 3), r"a tensor of shape \(2, 2, 3\)"),
        (torch.ones(0), r"a tensor of shape \(0,\)"),
        (torch.ones(2, 0), r"a tensor of shape \(2, 0\)"),
        (torch.ones(3, dtype=torch.long), "a torch.int64 tensor"),
        ([1.0, 2.0, 3.0], "a list"),
    ],
    ids=["scalar", "3-d", "empty", "empty block", "integer", "list"],
)
def test_a_start_that_is_not_a_floating_vector_or_block_is_refused_in_one_line(start, said):
    """It met a tuple unpacking, a norm of integers, a missing attribute, or blamed max_steps=0 for an empty one."""
    with pytest.raises(ValueError, match=rf"^lanczos: start is {said}; give one floating vector \(n,\) with n >= 1"):
        lanczos(lambda v: v, start)
