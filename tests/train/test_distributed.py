"""Joining a torchrun job: the device each process takes, checked before any process joins."""

import pytest
import torch

from optiscope.errors import UserError
from optiscope.train import distributed


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_more_processes_than_gpus_on_a_machine_are_refused_before_joining(monkeypatch, device):
    """Two processes on a machine with one GPU (simulated): process 1 would ask for cuda:1, which does not exist."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    message = rf"--device {device}: 2 processes on this machine but 1 CUDA device\(s\), .* --nproc_per_node=1, or"
    with pytest.raises(UserError, match=message):
        distributed.start_processes(device, batch_size=4)
    assert not torch.distributed.is_initialized()
