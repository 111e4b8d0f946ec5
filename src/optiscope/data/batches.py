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
    """Split token ids into training and validation parts: the first ⌊(1 − f)·n⌋ ids, then the rest.

    Contiguous, not shuffled: a shuffled split would put the neighbours of every validation window
    into the training set, and validation loss would no longer measure generalisation to unseen text.

    Args:
        ids: n token ids, 1-D (a list from ``Tokenizer.encode`` or a tensor).
        val_fraction: f, the fraction for validation, in [0, 1); 0 leaves validation empty.

    Returns:
        ``(train, val)``, two 1-D int64 tensors (views of ``ids`` when it is an int64 tensor).

    Raises:
        ValueError: ``ids`` not 1-D, ``val_fraction`` outside [0, 1), or a split that leaves training (or,
            with f > 0, validation) empty.

    Examples:
        >>> import torch
        >>> from optiscope.data import train_val_split
        >>> train, val = train_val_split(torch.arange(10), val_fraction=0.2)
        >>> train.tolist(), val.tolist()
        ([0, 1, 2, 3, 4, 5, 6, 7], [8, 9])
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
    """A random training batch: windows of T + 1 ids at start positions drawn uniformly with ``generator``.

    A window starting at s gives the input row x = ids[s : s + T] and its targets y = ids[s + 1 : s + T + 1]
    (T = ``block_size``): position t of y is the token that follows position t of x. Starts are drawn from
    0 … n − T − 1.

    Args:
        ids: n token ids, 1-D (a list or a tensor); n ≥ T + 1.
        block_size: T, the positions per row; a positive integer.
        batch_size: the rows; a positive integer.
        generator: the only source of randomness, the caller's; its state is the data position.

    Returns:
        ``(x, y)``, two contiguous int64 tensors of shape (batch_size, block_size) on the device of ``ids``.

    Raises:
        ValueError: ``ids`` not 1-D, ``block_size`` or ``batch_size`` not a positive integer, or fewer than
            T + 1 ids.
        TypeError: ``generator`` not a ``torch.Generator``.

    Examples:
        >>> import torch
        >>> from optiscope.data import sample_batch
        >>> g = torch.Generator().manual_seed(0)
        >>> x, y = sample_batch(torch.arange(10), block_size=3, batch_size=2, generator=g)
        >>> x.tolist(), y.tolist()
        ([[4, 5, 6], [3, 4, 5]], [[5, 6, 7], [4, 5, 6]])

    Notes:
        Each call advances ``generator`` by one ``torch.randint`` draw, so the same generator state gives the
        same batch: saving ``generator.get_state()`` in a checkpoint and restoring it with ``set_state``
        replays exactly the batches an uninterrupted run would have drawn. For data-parallel training, draw
        the global batch here with a generator every rank holds in the same state and give each rank its rows:
        the run then sees the same data as a single process would.
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

    Each window gives x = ids[s : s + T] and y = ids[s + 1 : s + T + 1] (T = ``block_size``), as in
    [`sample_batch`][optiscope.data.sample_batch]. Every id after the first is a target exactly once, except
    the fewer than T + 1 left at the end.

    Args:
        ids: n token ids, 1-D (a list or a tensor); n ≥ T + 1.
        block_size: T, the positions per row; a positive integer.
        batch_size: the most rows per batch; a positive integer.
        max_batches: keep at most ``max_batches · batch_size`` windows, evenly spaced over the whole split
            rather than its beginning; None keeps all.

    Yields:
        ``(x, y)``, two int64 tensors of shape (rows, block_size) on the device of ``ids``; the last batch may
            have fewer rows.

    Raises:
        ValueError: ``ids`` not 1-D, ``block_size``, ``batch_size`` or ``max_batches`` not a positive integer,
            or fewer than T + 1 ids (raised at the first ``next``, as this is a generator).

    Examples:
        >>> import torch
        >>> from optiscope.data import eval_batches
        >>> [x.tolist() for x, y in eval_batches(torch.arange(10), block_size=3, batch_size=2)]
        [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8]]]

    Notes:
        The last batch may be smaller: to average a loss over tokens, weight each batch's mean by
        ``y.numel()``.
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
