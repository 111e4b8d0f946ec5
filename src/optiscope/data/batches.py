"""Token ids → training and evaluation batches for a next-token model.

A window of ``block_size + 1`` consecutive ids starting at s gives one input row
``x = ids[s : s + T]`` and its targets ``y = ids[s + 1 : s + T + 1]`` (T = ``block_size``): position t
of ``y`` is the token that follows position t of ``x``.

Training batches draw their start positions from a ``torch.Generator`` the caller owns and nothing
else, so ``generator.get_state()`` *is* the data position: saving it in a checkpoint and restoring it
with ``set_state`` replays exactly the batches an uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor


def _as_ids(ids: Sequence[int] | Tensor) -> Tensor:
    """A 1-D int64 tensor of token ids (a list from ``Tokenizer.encode`` or a tensor)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {tuple(ids.shape)}")
    return ids


def train_val_split(ids: Sequence[int] | Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """The first ⌊(1 − f)·n⌋ ids for training and the rest for validation (f = ``val_fraction``).

    Contiguous, not shuffled: a shuffled split would put the neighbours of every validation window
    into the training set, and validation loss would no longer measure generalisation to unseen text.
    """
    ids = _as_ids(ids)
    if not (isinstance(val_fraction, int | float) and 0 <= val_fraction < 1):
        raise ValueError(f"val_fraction={val_fraction!r} must be in [0, 1)")
    n_train = int(len(ids) * (1 - val_fraction))
    if n_train == 0 or (val_fraction > 0 and n_train == len(ids)):
        raise ValueError(
            f"val_fraction={val_fraction} of {len(ids)} ids leaves {n_train} for training and "
            f"{len(ids) - n_train} for validation; both must be non-empty"
        )
    return ids[:n_train], ids[n_train:]


def _check_sizes(ids: Tensor, block_size: int, batch_size: int) -> None:
    for name, value in (("block_size", block_size), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if len(ids) < block_size + 1:
        raise ValueError(
            f"{len(ids)} token ids are too few for block_size={block_size}: a window needs {block_size + 1}"
        )


def sample_batch(
    ids: Sequence[int] | Tensor, block_size: int, batch_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``batch_size`` windows at start positions drawn uniformly from 0 … n − T − 1 with ``generator``.

    Returns ``(x, y)``, two contiguous int64 tensors of shape (batch_size, block_size) on the device of
    ``ids``. Each call advances ``generator`` by one ``torch.randint`` draw, so the same generator state
    gives the same batch. For data-parallel training, draw the global batch here with a generator every
    rank holds in the same state and give each rank its rows: the run then sees the same data as a
    single process would.
    """
    ids = _as_ids(ids)
    _check_sizes(ids, block_size, batch_size)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (its state is the data position), got {generator!r}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator, device=generator.device)
    rows = starts.to(ids.device)[:, None] + torch.arange(block_size, device=ids.device)
    return ids[rows], ids[rows + 1]


def eval_batches(
    ids: Sequence[int] | Tensor, block_size: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Deterministic evaluation batches: non-overlapping windows at starts 0, T, 2T, … in order.

    Every id after the first is a target exactly once, except the fewer than T + 1 left at the end.
    With ``max_batches``, at most ``max_batches · batch_size`` windows are kept, evenly spaced over the
    whole split rather than its beginning. The last batch may be smaller: to average a loss over
    tokens, weight each batch's mean by ``y.numel()``.
    """
    ids = _as_ids(ids)
    _check_sizes(ids, block_size, batch_size)
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches={max_batches!r} must be a positive integer or None")
    starts = torch.arange(0, len(ids) - block_size, block_size, device=ids.device)
    if max_batches is not None and len(starts) > max_batches * batch_size:
        keep = torch.linspace(0, len(starts) - 1, max_batches * batch_size).round().long()
        starts = starts[keep.to(ids.device)]
    offsets = torch.arange(block_size, device=ids.device)
    for chunk in starts.split(batch_size):
        rows = chunk[:, None] + offsets
        yield ids[rows], ids[rows + 1]
