"""Split and batches: exact windows on ids that name their own positions, a generator state that replays
the data order, and evaluation windows that cover the split once."""

import io

import pytest
import torch

from optiscope.data.batches import eval_batches, sample_batch, train_val_split


def test_split_is_contiguous_and_deterministic():
    ids = list(range(10, 30))
    train, val = train_val_split(ids, val_fraction=0.1)
    assert train.tolist() == list(range(10, 28)) and val.tolist() == [28, 29]
    train, val = train_val_split(torch.arange(7), val_fraction=0.25)  # ⌊0.75 · 7⌋ = 5
    assert train.tolist() == [0, 1, 2, 3, 4] and val.tolist() == [5, 6]
    train, val = train_val_split(torch.arange(7), val_fraction=0)
    assert len(train) == 7 and len(val) == 0


@pytest.mark.parametrize(
    ("n", "fraction", "message"),
    [
        (10, 1.0, r"val_fraction=1.0 must be in \[0, 1\)"),
        (10, -0.1, r"must be in \[0, 1\)"),
        (10, 1e-18, r"leaves 10 for training and 0 for validation"),
        (0, 0.1, r"of 0 ids leaves 0 for training"),
        (1, 0.5, r"leaves 0 for training"),
    ],
)
def test_split_rejects_empty_parts(n, fraction, message):
    with pytest.raises(ValueError, match=message):
        train_val_split(torch.arange(n), fraction)


def test_batch_rows_are_windows_and_targets_are_the_next_tokens():
    ids = torch.arange(50) * 3  # id = 3 × position, so every row shows where it came from
    x, y = sample_batch(ids, block_size=8, batch_size=64, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (64, 8) and x.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
    starts = x[:, 0] // 3
    assert torch.equal(x, 3 * (starts[:, None] + torch.arange(8)))
    assert torch.equal(y, x + 3)
    assert int(starts.min()) >= 0 and int(starts.max()) <= 50 - 8 - 1


def test_every_start_position_is_reachable():
    ids = torch.arange(12)
    x, _ = sample_batch(ids, block_size=4, batch_size=2000, generator=torch.Generator().manual_seed(1))
    assert sorted(set(x[:, 0].tolist())) == list(range(12 - 4))


def test_generator_state_is_the_data_position():
    ids = torch.arange(1000)

    def draw(g, k):
        return [sample_batch(ids, 16, 4, g) for _ in range(k)]

    straight = draw(torch.Generator().manual_seed(7), 5)
    g = torch.Generator().manual_seed(7)
    first = draw(g, 2)
    buffer = io.BytesIO()
    torch.save({"data_rng": g.get_state()}, buffer)  # what a checkpoint keeps
    buffer.seek(0)
    resumed = torch.Generator()
    resumed.set_state(torch.load(buffer, weights_only=True)["data_rng"])
    torch.manual_seed(12345)  # the global RNG plays no part
    rest = draw(resumed, 3)
    for (xa, ya), (xb, yb) in zip(straight, first + rest, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_sampler_rejects_bad_arguments():
    ids = torch.arange(10)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"10 token ids are too few for block_size=10: a window needs 11"):
        sample_batch(ids, 10, 2, g)
    with pytest.raises(ValueError, match=r"batch_size=0 must be a positive integer"):
        sample_batch(ids, 4, 0, g)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        sample_batch(ids, 4, 2, None)
    with pytest.raises(ValueError, match=r"must be 1-D, got shape \(2, 5\)"):
        sample_batch(ids.view(2, 5), 4, 2, g)


def test_eval_batches_cover_the_split_in_order():
    ids = torch.arange(23)
    batches = list(eval_batches(ids, block_size=5, batch_size=2))
    # windows need 6 ids: starts 0, 5, 10, 15 (20 would need ids up to 25)
    assert [x[:, 0].tolist() for x, _ in batches] == [[0, 5], [10, 15]]
    targets = torch.cat([y.reshape(-1) for _, y in batches])
    assert targets.tolist() == list(range(1, 21))
    assert all(torch.equal(y, x + 1) for x, y in batches)
    again = list(eval_batches(ids, block_size=5, batch_size=2))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))


def test_eval_batches_limit_spreads_windows_and_last_batch_may_be_short():
    ids = torch.arange(101)
    assert [x[:, 0].tolist() for x, _ in eval_batches(ids, 10, 3)] == [[0, 10, 20], [30, 40, 50], [60, 70, 80], [90]]
    limited = [x[:, 0].tolist() for x, _ in eval_batches(ids, 10, 2, max_batches=1)]
    assert limited == [[0, 90]]  # the first and last of the ten windows, not the first two
    with pytest.raises(ValueError, match=r"max_batches=0 must be a positive integer or None"):
        list(eval_batches(ids, 10, 2, max_batches=0))
