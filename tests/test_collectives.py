"""A collective returns only once gloo's worker thread has let go of its tensors, so the caller's reference is
their last (a tensor freed on the worker during interpreter shutdown aborts the process). A gloo group of one
process, in this one. ``torch.distributed``'s own calls return with gloo still holding the tensor now and then
(in about a fifth of 5,000 all-reduces on a loaded 2-core machine): without the wait this failed."""

import pytest
import torch
import torch.distributed as dist

from optiscope import collectives

ROUNDS = 400


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_after_a_collective_no_other_thread_holds_its_tensors(gloo):
    for i in range(ROUNDS):
        t = torch.full((3,), float(i), dtype=torch.float64)
        assert collectives.all_reduce(t) is t
        assert t._use_count() == 1 and t.tolist() == [float(i)] * 3  # one process: the sum is itself
        gathered = collectives.all_gather(t)
        assert [g._use_count() for g in gathered] == [1] and t._use_count() == 1
        assert torch.equal(gathered[0], t)
