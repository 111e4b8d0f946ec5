"""Two CPU processes under DistributedDataParallel (gloo): every rank measures the same values and
only rank 0 writes."""

import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from optiscope import runs
from optiscope.monitor import JSONLSink, Monitor
from optiscope.optim import AdamW


def _worker(rank: int, world: int, tmp: str) -> None:
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
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
    dist.destroy_process_group()


def test_two_ranks_agree_and_only_rank_zero_writes(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0 == rank1 and len(rank0) == 4
    assert set(rank0[0]["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # "module." stripped
    written = runs.read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in written] == [r["step"] for r in rank0]
