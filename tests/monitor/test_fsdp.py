"""Two CPU processes (gloo) under FSDP2 (``fully_shard``) and FSDP1 (``use_orig_params`` False and True, and
``NO_SHARD``): every number the monitor records, on both ranks, against an unsharded run of the same model on
the same global batches with the same optimizer (run here, in the test's own process); the divergence guard
decides the same on both ranks when only one rank's shard holds a non-finite weight, and the early warning
when only one rank's data jumps; curvature and the shardings the monitor does not measure are refused in one
line."""

import json
import logging
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (before any process group: see train.distributed._import_before_joining)
import torch.multiprocessing as mp
from torch import nn

from optiscope import runs
from optiscope.curvature import sharpness
from optiscope.monitor import Curvature, EarlyWarning, Monitor
from optiscope.train.distributed import leave_job
from support import DispatchedOps, assert_sharded_close

WORLD, STEPS, ROWS = 2, 4, 8
SETTINGS = ("fsdp2", "fsdp1", "fsdp1_orig", "fsdp1_no_shard")


class Net(nn.Module):
    """A score from 9 features: a layer of 18 909 weights (above ``stats.MEDIAN_SAMPLE`` twice over, so the
    effective LR's median is taken over every other entry, and split between the ranks at an odd offset)
    and one that FSDP shards unevenly."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(9, 2101)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(2101, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.wide(x))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(ROWS, 9, generator=g), torch.randn(ROWS, 1, generator=g)) for _ in range(STEPS)]


LR, EPS, BETA2 = 1e-2, 1e-8, 0.999


def _train(net: nn.Module, rows: slice, opt: torch.optim.Optimizer | None = None, collectives: list | None = None):
    """STEPS Adam steps of ``net`` on ``rows`` of each global batch, measured every 2 steps; the records, and
    into ``collectives`` the number of collectives each optimizer step and ``monitor.step`` dispatched."""
    opt = opt or torch.optim.Adam(net.parameters(), lr=LR, eps=EPS, betas=(0.9, BETA2))
    monitor = Monitor(net, opt, every=2)
    records = []
    for ids, y in _batches():
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(ids[rows]), y[rows])
        loss.backward()
        with DispatchedOps() as ops:
            opt.step()
            record = monitor.step(loss)
        if collectives is not None:
            collectives.append(sum(n for op, n in ops.ops.items() if op.startswith("c10d.")))
        if record is not None:
            record.pop("tokens_per_s", None)
            records.append(runs.to_jsonable(record))
    monitor.close()
    return records


def _sharded(setting: str) -> nn.Module:
    torch.manual_seed(0)  # the unsharded run's initial weights
    net = Net()
    if setting == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(net.wide)
        fully_shard(net.body[1])
        return fully_shard(net)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        net,
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        use_orig_params=setting == "fsdp1_orig",
        sharding_strategy=ShardingStrategy.NO_SHARD if setting == "fsdp1_no_shard" else ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
    )


def _worker(rank: int, tmp: str) -> None:
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD)
    out = {}
    rows = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    for setting in SETTINGS:
        net = _sharded(setting)
        opt = torch.optim.Adam(net.parameters(), lr=LR, eps=EPS, betas=(0.9, BETA2))
        out[f"{setting}_collectives"] = []
        out[setting] = _train(net, rows, opt, out[f"{setting}_collectives"])
        if setting in ("fsdp2", "fsdp1"):
            out[f"{setting}_rate"] = _wide_rate(net, opt)
    out["guard"] = _guard(rank)
    out["early_warning"] = _early_warning()
    out["warnings"] = {setting: _warnings(setting, rank) for setting in ("fsdp2", "fsdp1")}
    out["refused"] = _refusals()
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    leave_job()


def _wide_rate(net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    """The wide layer's effective LR after the last step, η/(√(v/(1 − β₂ᵗ)) + ε), from its second moment
    gathered whole: min, max and the median of every other entry (``stats.sampled``'s sample of 18 909)."""
    if not hasattr(net.wide, "_handle"):  # FSDP2: a DTensor
        state = opt.state[net.wide.weight]
        v = state["exp_avg_sq"].full_tensor()
    else:  # FSDP1: the wide layer's flat parameter, its weight first, in shards of equal (padded) length
        flat = net.wide._handle.flat_param
        state = opt.state[flat]
        shards = [torch.empty_like(state["exp_avg_sq"]) for _ in range(WORLD)]
        dist.all_gather(shards, state["exp_avg_sq"])
        v = torch.cat(shards)[: flat._numels[0]]
    rate = LR / ((v.double() / (1 - BETA2 ** float(state["step"]))).sqrt() + EPS)
    return {"min": float(rate.min()), "median": float(rate.flatten()[::2].median()), "max": float(rate.max())}


def _guard(rank: int) -> dict | None:
    """A non-finite weight in rank 1's shard only, written after the step and before the monitor reads it."""
    net = _sharded("fsdp2")
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)

    def poison(optimizer, args, kwargs):
        if rank == 1:
            with torch.no_grad():
                net.wide.weight.to_local().view(-1)[0] = math.nan

    opt.register_step_post_hook(poison)  # before the monitor's: it runs first
    monitor = Monitor(net, opt, every=1, on_divergence="record")
    ids, y = _batches()[0]
    loss = nn.functional.mse_loss(net(ids), y)
    loss.backward()
    opt.step()
    monitor.step(loss)
    return monitor.diverged


def _early_warning() -> dict[str, list]:
    """early_warning=True on FSDP2: what the optiscope logger said, and the collectives of each step."""
    net = _sharded("fsdp2")
    opt = torch.optim.Adam(net.parameters(), lr=LR, eps=EPS, betas=(0.9, BETA2))
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("optiscope").addHandler(handler)
    collectives = []
    try:
        monitor = Monitor(net, opt, every=2, sinks=[], early_warning=True)
        for ids, y in _batches():
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(ids), y)
            loss.backward()
            with DispatchedOps() as ops:
                opt.step()
                monitor.step(loss)
            collectives.append(sum(n for op, n in ops.ops.items() if op.startswith("c10d.")))
        monitor.close()
    finally:
        logging.getLogger("optiscope").removeHandler(handler)
    return {"said": said, "collectives": collectives}


def _warnings(setting: str, rank: int) -> dict:
    """A loss warning with reduce_lr acting, each rank on its own data, whose targets jump tenfold on rank 1
    at steps 30 to 32 only: the warnings each rank found, and its learning rate after."""
    net = _sharded(setting)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=EPS, betas=(0.9, 0.95))
    warning = EarlyWarning(loss=3.0)
    monitor = Monitor(net, opt, every=10, sinks=[], early_warning=warning, on_warning="reduce_lr")
    g = torch.Generator().manual_seed(100 + rank)
    found = []
    for t in range(1, 41):
        x = torch.randn(ROWS // WORLD, 9, generator=g)
        y = x[:, :1] * (10.0 if 30 <= t <= 32 and rank == 1 else 1.0)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        found += record["warnings"] if record else []
    monitor.flush()
    monitor.close()
    return {"warnings": found, "lr": opt.param_groups[0]["lr"]}


def _refusals() -> dict[str, str]:
    """The one-line messages of what the monitor and curvature do not measure on a sharded model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    out = {}
    net = _sharded("fsdp2")
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    ids, y = _batches()[0]

    def loss_fn(model, batch):
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    for key, call in {
        "curvature": lambda: Monitor(net, opt, curvature=Curvature((ids, y), loss_fn, every=2)),
        "sharpness": lambda: sharpness(net, loss_fn, (ids, y), opt),
        "histograms": lambda: Monitor(net, opt, histograms=True),
    }.items():
        try:
            call()
            out[key] = "not refused"
        except ValueError as error:
            out[key] = str(error)
    tp = nn.Linear(4, 4)
    mesh = init_device_mesh("cpu", (WORLD,))
    tp.weight = nn.Parameter(distribute_tensor(tp.weight.detach(), mesh, [Shard(1)]))  # column-wise: tensor parallel
    hsdp = nn.Linear(4, 4)  # replicated over the mesh's first dimension, sharded over its second
    fully_shard(hsdp, mesh=init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("replicate", "shard")))
    for key, model in {"tensor_parallel": tp, "hsdp": hsdp}.items():
        try:
            Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1))
            out[key] = "not refused"
        except ValueError as error:
            out[key] = str(error)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(str(tmp),), nprocs=WORLD, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def unsharded():
    torch.manual_seed(0)
    return _train(Net(), slice(None))  # the whole batch: the mean of the ranks' mean losses and gradients


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_number_is_the_unsharded_runs_on_every_rank(ranks, unsharded, setting):
    for rank, out in enumerate(ranks):
        records = out[setting]
        assert [r["step"] for r in records] == [1, 2, 4]
        assert set(records[0]["params"]) == {"wide.weight", "wide.bias", "body.1.weight", "body.1.bias"}
        for mine, truth in zip(records, unsharded, strict=True):
            assert_sharded_close(mine, truth, f"rank{rank}.{setting}.step{truth['step']}")
    assert ranks[0][setting] == ranks[1][setting]  # not only close: the same numbers on both ranks


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_step_the_monitor_neither_measures_nor_reads_starts_no_collective(ranks, setting):
    """Step 3 of 4 (measured: 1, 2, 4; the guard reads every 10 steps): none on either rank; the measured steps
    sum their shards' numbers over the ranks (collectives the count sees)."""
    for rank in ranks:
        counts = rank[f"{setting}_collectives"]
        assert counts[2] == 0 and min(counts[0], counts[1], counts[3]) > 0, counts


@pytest.mark.parametrize("setting", ["fsdp2", "fsdp1"])
def test_the_effective_lr_is_that_of_the_whole_state(ranks, setting):
    for out in ranks:
        assert out[setting][-1]["params"]["wide.weight"]["eff_lr"] == pytest.approx(out[f"{setting}_rate"], rel=1e-12)


def test_the_guard_decides_the_same_on_every_rank(ranks):
    first, second = (out["guard"] for out in ranks)
    assert first is not None and first == second
    assert first["reason"] == "non-finite weights in wide.weight"


def test_curvature_and_unmeasured_shardings_are_refused_in_one_line(ranks):
    refused = ranks[0]["refused"]
    for key in ("curvature", "sharpness"):
        assert "is not measured under FSDP" in refused[key] and "\n" not in refused[key]
    assert "histograms=True" in refused["histograms"]
    assert "tensor parallel" in refused["tensor_parallel"]
    assert "2-D device mesh" in refused["hsdp"] and "HSDP" in refused["hsdp"]


def test_deepspeed_parameters_are_refused_in_one_line():
    model = nn.Linear(2, 1)
    model.weight.ds_id = 0  # what DeepSpeed ZeRO marks its partitioned parameters with
    with pytest.raises(ValueError, match="DeepSpeed ZeRO"):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_early_warning_under_fsdp_says_once_that_the_lag_is_not_watched_and_adds_no_collective(ranks):
    for out in ranks:
        said, collectives = out["early_warning"]["said"], out["early_warning"]["collectives"]
        assert [m for m in said if "lag is not watched" in m] == [
            "Monitor(early_warning=...): under FSDP each rank holds part of Adam's moments: its lag is not watched "
            "(said once)"
        ]
        assert collectives[2] == 0  # step 3: neither measured nor read


@pytest.mark.parametrize("setting", ["fsdp2", "fsdp1"])
def test_early_warnings_agree_on_every_rank(ranks, setting):
    """Only rank 1's data jumps; the loss judged is the ranks' mean, so both warn at the same steps and halve the
    learning rate alike (a rank that did not would train on with a different one)."""
    first, second = (out["warnings"][setting] for out in ranks)
    assert first == second
    assert first["warnings"] and {w["signal"] for w in first["warnings"]} == {"loss"}
    assert min(w["step"] for w in first["warnings"]) == 30
    assert first["lr"] == 1e-3 / 2 ** len(first["warnings"])
