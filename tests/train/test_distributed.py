"""Joining a torchrun job: the device each process takes, checked before any process joins; leaving it."""

import subprocess
import sys

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


#: one rank of a 2-process job: DDP, a collective, then the end of the job; says whether anything of the
#: process group is left (the group itself, gloo's threads: their names, read from /proc on Linux)
ONE_RANK = """
import os, sys, weakref
import torch
import torch.distributed as dist
from optiscope.train import distributed

procs = distributed.start_processes("cpu", batch_size=2)
group = weakref.ref(dist.group.WORLD)
net = distributed.wrap(torch.nn.Linear(3, 1), procs)
net(torch.ones(1, 3)).sum().backward()
distributed.global_mean(1.0)
del net
distributed.leave_job()
tasks = "/proc/self/task"
names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
left = [name for name in names if "gloo" in name]
print(f"rank {procs.rank}: group freed: {group() is None}; gloo threads left: {left}", flush=True)
sys.exit(0 if group() is None and not left else 1)
"""


def test_a_job_that_ends_frees_its_process_group(tmp_path):
    """After ``leave_job`` no gloo thread of the job is left to run while the interpreter shuts down: one
    that was (the group held by ``torch.distributed.nn``'s defaults, imported by DDP after the job joined)
    could abort a finished process (SIGABRT: "terminate called without an active exception")."""
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    done = subprocess.run(torchrun, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: group freed: True; gloo threads left: []" in done.stdout


def test_a_single_process_has_no_job_to_stop():
    procs = distributed.start_processes("cpu")
    distributed.leave_job()
    assert procs.world == 1 and not torch.distributed.is_initialized()
