"""What both libraries' callbacks check before training starts, in a real two-process gloo job."""

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (before any process group: see train.distributed._import_before_joining)
import torch.multiprocessing as mp
from torch import nn

from optiscope.integrations.attach import check_passes
from optiscope.monitor import Curvature
from optiscope.train.distributed import leave_job


def _worker(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    batch = (torch.zeros(4, 2), torch.zeros(4, 1))
    curvature = Curvature(batch, lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), accumulation_batch_size=2)
    try:
        check_passes(curvature, 4, "gradient_accumulation_steps")
        said = "accepted"
    except ValueError as error:
        said = str(error)
    check_passes(None, 4, "gradient_accumulation_steps")  # no curvature: nothing to refuse
    with open(f"{tmp}/said{rank}", "w") as f:
        f.write(said)
    leave_job()  # as the product leaves: DDP wrappers in reference cycles collected first


def test_noise_from_accumulated_passes_is_refused_in_a_job_of_several_ranks(tmp_path):
    """A library hands the callback the bare module, so the monitor cannot see DDP, which overwrites p.grad with
    the ranks' mean at an accumulated step's last pass: the callback refuses, on every rank, in one line."""
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in (0, 1):
        said = (tmp_path / f"said{rank}").read_text()
        assert said.startswith(
            "OptiscopeCallback: Curvature(accumulation_batch_size=2) cannot see a backward pass's own gradient in a "
            "job of 2 ranks"
        ), said
        assert "give Curvature(micro_batches=...)" in said and "\n" not in said
