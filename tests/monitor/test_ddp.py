"""Two CPU processes under DistributedDataParallel (gloo): every rank measures the same values (curvature
included) and only rank 0 writes."""

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from optiscope import runs
from optiscope.curvature import gradient_noise_scale, rank_gradients
from optiscope.monitor import Curvature, JSONLSink, Monitor
from optiscope.optim import AdamW


def _worker(rank: int, world: int, tmp: str) -> None:
    """One process group for both checks below (spawning processes costs more than the checks)."""
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    _monitor_only(rank, tmp)
    _with_curvature(rank, tmp)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, str(tmp)), nprocs=2, join=True)
    return tmp


def _monitor_only(rank: int, tmp: str) -> None:
    torch.manual_seed(0)  # same initial weights on every rank
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = AdamW(ddp.parameters(), lr=1e-2)
    monitor = Monitor(ddp, opt, every=2, sinks=[JSONLSink(f"{tmp}/metrics.jsonl")])
    g = torch.Generator().manual_seed(100 + rank)  # different data per rank
    mine = []
    for _ in range(6):
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        if record:
            record.pop("tokens_per_s", None)
            mine.append(runs.to_jsonable(record))
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(mine, f)


def test_two_ranks_agree_and_only_rank_zero_writes(spawned):
    tmp_path = spawned
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0 == rank1 and len(rank0) == 4
    assert set(rank0[0]["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # "module." stripped
    written = runs.read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in written] == [r["step"] for r in rank0]


def _with_curvature(rank: int, tmp: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)

    def loss_fn(net, batch):
        return nn.functional.mse_loss(net(batch[0]), batch[1])

    fixed = torch.Generator().manual_seed(7)  # the same curvature batch on every rank
    batch = (torch.randn(32, 6, generator=fixed), torch.randn(32, 1, generator=fixed))
    curvature = Curvature(batch, loss_fn, every=2, trace_probes=2, micro_batches=2)
    monitor = Monitor(ddp, opt, every=100, curvature=curvature, sinks=[JSONLSink(f"{tmp}/curvature.jsonl")])
    g = torch.Generator().manual_seed(100 + rank)
    mine = []
    for _ in range(4):
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        loss = loss_fn(ddp, (x, y))
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        if record:
            record.pop("tokens_per_s", None)
            mine.append(runs.to_jsonable(record))
    # the ranks as the small batches of the noise scale: local gradients on each rank's own data
    local = torch.autograd.grad(loss_fn(model, (x, y)), list(model.parameters()))
    noise = gradient_noise_scale(rank_gradients(local), 16)
    with open(f"{tmp}/curvature{rank}.json", "w") as f:
        json.dump({"records": mine, "noise": runs.to_jsonable(noise)}, f)


def test_curvature_records_agree_across_ranks(spawned):
    rank0 = json.loads((spawned / "curvature0.json").read_text())
    rank1 = json.loads((spawned / "curvature1.json").read_text())
    assert rank0 == rank1
    assert [r["step"] for r in rank0["records"]] == [1, 2, 4]
    for key in ("sharpness", "threshold", "sharpness/threshold", "curvature/update", "hessian_trace", "noise_scale"):
        assert isinstance(rank0["records"][-1][key], float)
    assert rank0["noise"]["b_big"] == 32 and len(rank0["noise"]["snr"]) == 4
