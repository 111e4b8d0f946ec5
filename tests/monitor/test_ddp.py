"""Two CPU processes under DistributedDataParallel (gloo): every rank measures the same values (curvature
included) and only rank 0 writes; the noise scale over the ranks against the ranks' own gradients."""

import copy
import json
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (before any process group: see train.distributed._import_before_joining)
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from optiscope import runs
from optiscope.curvature import gradient_noise_scale, rank_gradients
from optiscope.monitor import Curvature, Diverged, DivergenceGuard, EarlyWarning, JSONLSink, Monitor
from optiscope.optim import AdamW
from optiscope.train.distributed import leave_job
from support import DispatchedOps, Silent


def _worker(rank: int, world: int, tmp: str) -> None:
    """One process group for both checks below (spawning processes costs more than the checks)."""
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    _monitor_only(rank, tmp)
    _with_curvature(rank, tmp)
    _noise_by_ranks(rank, tmp)
    _between_readings(rank, tmp)
    _early_warning(rank, tmp)
    leave_job()  # as the product leaves: DDP wrappers in reference cycles collected first


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


def _mse(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1])


def _train_with_rank_noise(rank: int, rank_batch_size: int | None):
    """Four Adam steps under DDP on each rank's own data, the averaged gradient clipped before each step
    (the monitor's hook with ``rank_batch_size``, none without), and the oracle, which never clips: at each
    step, this rank's local gradient from a plain copy of the model at the same weights (no DDP), gathered
    from both ranks and given to ``gradient_noise_scale``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    plain = copy.deepcopy(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    fixed = torch.Generator().manual_seed(7)
    batch = (torch.randn(32, 6, generator=fixed), torch.randn(32, 1, generator=fixed))
    monitor = None
    if rank_batch_size is not None:
        curvature = Curvature(batch, _mse, every=2, rank_batch_size=rank_batch_size)
        monitor = Monitor(ddp, opt, every=100, curvature=curvature)
    g = torch.Generator().manual_seed(200 + rank)  # different data per rank; signal (the offset) and noise
    xs = torch.randn(4, 16, 6, generator=g)
    ys = 1.0 + xs[..., :1] + torch.randn(4, 16, 1, generator=g)
    measured, oracle = [], []
    for x, y in zip(xs, ys, strict=True):
        plain.load_state_dict(model.state_dict())
        local = torch.autograd.grad(_mse(plain, (x, y)), list(plain.parameters()))
        flat = torch.cat([t.reshape(-1) for t in local])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        sizes = [t.numel() for t in local]
        small = [[part.view_as(t) for part, t in zip(f.split(sizes), local, strict=True)] for f in gathered]
        opt.zero_grad()
        loss = _mse(ddp, (x, y))
        loss.backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), 1e-3)  # the noise scale is of the gradients, not the clipped step
        opt.step()
        record = monitor.step(loss) if monitor is not None else None
        if record is not None and "noise_scale" in record:
            details = record["curvature"]
            keys = ("grad_sq", "trace_sigma", "snr", "noise_source")
            measured.append(
                {"step": record["step"], "noise_scale": record["noise_scale"]} | {k: details[k] for k in keys}
            )
            oracle.append(gradient_noise_scale(small, 16))
    names = [n for n, _ in model.named_parameters()]
    return [p.detach().clone() for p in model.parameters()], measured, oracle, names


def _noise_by_ranks(rank: int, tmp: str) -> None:
    hooked, measured, oracle, names = _train_with_rank_noise(rank, 16)
    unhooked, _, _, _ = _train_with_rank_noise(rank, None)
    identical = all(torch.equal(a, b) for a, b in zip(hooked, unhooked, strict=True))
    # a model that already has a communication hook: DDP takes one, so the monitor cannot add its own
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(6, 1))
    ddp.register_comm_hook(None, allreduce_hook)
    try:
        batch = (torch.zeros(2, 6), torch.zeros(2, 1))
        Monitor(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), curvature=Curvature(batch, _mse, rank_batch_size=16))
        refused = None
    except ValueError as error:
        refused = str(error)
    # an nn.Embedding(sparse=True)'s gradient is sparse: gathered as its dense values (the oracle: gloo's
    # all_gather of those dense values by hand)
    embedding = nn.Embedding(5, 2, sparse=True)
    embedding(torch.tensor([rank, rank, 4])).sum().backward()
    by_hand = [torch.empty(5, 2) for _ in range(2)]
    dist.all_gather(by_hand, embedding.weight.grad.to_dense())
    gathered = rank_gradients([embedding.weight.grad])
    sparse = all(torch.equal(got[0], want) for got, want in zip(gathered, by_hand, strict=True))
    result = {"measured": measured, "oracle": oracle, "names": names, "identical": identical, "refused": refused}
    result["sparse"] = sparse and len(gathered) == 2 and not torch.equal(by_hand[0], by_hand[1])
    with open(f"{tmp}/ranks{rank}.json", "w") as f:
        json.dump(runs.to_jsonable(result), f)


def test_noise_scale_over_the_ranks_matches_their_gathered_local_gradients(spawned):
    rank0 = json.loads((spawned / "ranks0.json").read_text())
    rank1 = json.loads((spawned / "ranks1.json").read_text())
    assert rank0["measured"] == rank1["measured"]  # every rank records the same values
    assert rank0["sparse"] and rank1["sparse"]  # sparse gradients gathered as their dense values
    assert [m["step"] for m in rank0["measured"]] == [2, 4]
    for got, want in zip(rank0["measured"], rank0["oracle"], strict=True):
        assert got["noise_source"] == "ranks" and want["b_big"] == 32
        assert math.isfinite(got["noise_scale"]) and got["noise_scale"] > 0  # a case the oracle pins down
        for key in ("noise_scale", "grad_sq", "trace_sigma"):
            assert got[key] == pytest.approx(want[key], rel=1e-5), key
        assert list(got["snr"]) == rank0["names"]
        # snr_p near 0 is a difference of near-equal terms: float32 gradients give it an absolute error ~1e-7
        assert list(got["snr"].values()) == pytest.approx(want["snr"], rel=1e-5, abs=1e-5)


def test_the_rank_hook_averages_exactly_as_ddp_does(spawned):
    """Bit-identical parameters with and without the monitor's hook (same processes, same data)."""
    for rank in (0, 1):
        assert json.loads((spawned / f"ranks{rank}.json").read_text())["identical"]


def test_a_model_with_its_own_comm_hook_is_refused_clearly(spawned):
    refused = json.loads((spawned / "ranks0.json").read_text())["refused"]
    assert refused is not None and "rank_batch_size=16" in refused and "already has one" in refused
    assert "micro_batches" in refused


def test_rank_noise_needs_two_ranks(tmp_path):
    """World size 1 (a process group in this process, gloo): nothing to take as small batches; and under DDP
    the passes of an accumulated step are not visible one by one."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
        batch = (torch.zeros(2, 3), torch.zeros(2, 1))
        with pytest.raises(ValueError, match=r"rank_batch_size=8\).*world size 1; run >= 2 ranks"):
            Monitor(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), curvature=Curvature(batch, _mse, rank_batch_size=8))
        accumulated = Curvature(batch, _mse, accumulation_batch_size=8)
        with pytest.raises(ValueError, match=r"accumulation_batch_size=8\).*DistributedDataParallel.*rank_batch_size"):
            Monitor(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), curvature=accumulated)
    finally:
        dist.destroy_process_group()


def test_uneven_inputs_under_join_are_refused_at_the_first_step(tmp_path):
    """Under ``Join`` a rank that ran out of data shadows DDP's collectives but not the monitor's loss average
    (two gloo ranks with 3 and 5 batches aborted on a collective mismatch): every rank refuses at its first
    step, before any collective of the monitor's; outside ``Join`` the same model steps."""
    from torch.distributed.algorithms.join import Join

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        monitor = Monitor(ddp, opt, every=1)
        loss = _mse(ddp, (torch.randn(4, 3), torch.randn(4, 1)))
        loss.backward()
        opt.step()
        assert monitor.step(loss)["step"] == 1
        with pytest.raises(ValueError, match=r"join\(\) \(uneven inputs across ranks\) is not supported"), Join([ddp]):
            loss = _mse(ddp, (torch.randn(4, 3), torch.randn(4, 1)))
            loss.backward()
            opt.step()
            monitor.step(loss)
    finally:
        dist.destroy_process_group()


def _between_readings(rank: int, tmp: str) -> None:
    """A monitored DDP model and a bare twin on the same data: the operators each dispatches after backward (the
    optimizer's step and the monitor's), step by step; then a loss that differs by rank and jumps 100-fold at
    step 31, judged by its mean over the ranks."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)))
    twin = nn.parallel.DistributedDataParallel(copy.deepcopy(model.module))
    opt, twin_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin))
    monitor = Monitor(model, opt, every=5, sinks=[], guard=DivergenceGuard(read_every=5))
    g = torch.Generator().manual_seed(300 + rank)
    extras = []
    for _ in range(10):
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        counted = []
        for net, optimizer, watch in ((model, opt, monitor), (twin, twin_opt, None)):
            optimizer.zero_grad()
            loss = _mse(net, (x, y))
            loss.backward()
            with DispatchedOps() as ops:
                optimizer.step()
                if watch is not None:
                    watch.step(loss)
            counted.append(ops.ops)
        extras.append(dict(counted[0] - counted[1]))
    monitor.close()
    # the guard reads the ranks' mean loss (2x the jump here), every rank the same steps
    jump, guard = [1.0] * 30 + [100.0] * 10, DivergenceGuard(warmup=0, read_every=10)
    monitor = Monitor(model, opt, every=1000, sinks=[], guard=guard)
    raised = None
    for step, value in enumerate(jump, 1):
        _mse(model, (x, y)).backward()
        opt.step()
        try:
            monitor.step(torch.tensor(value * (1 + 2 * rank)))
        except Diverged as e:
            raised = {"at": step, "record": runs.to_jsonable(e.record)}
            break
    monitor.close()
    with open(f"{tmp}/between{rank}.json", "w") as f:
        json.dump({"extras": extras, "raised": raised}, f)


def test_the_steps_between_readings_start_no_collective_and_read_nothing(spawned):
    """On the steps neither measured nor read (every=5, read_every=5) the monitor dispatches the loss's copy and
    nothing else: no collective (``c10d.*``), no host read; the measured steps average the loss (an
    all-reduce, which the counter sees). A divergence is read from the mean over the ranks, with the step it
    happened at, at the same step on both ranks."""
    for rank in (0, 1):
        result = json.loads((spawned / f"between{rank}.json").read_text())
        for step, extra in enumerate(result["extras"], 1):
            if step in (1, 5, 10):
                assert extra["c10d.allreduce_"] >= 1 and extra["aten._local_scalar_dense"] > 0, (rank, step, extra)
            else:
                assert extra == {"aten.detach": 1, "aten._to_copy": 1}, (rank, step, extra)
        raised = result["raised"]
        assert raised["at"] == 40 and raised["record"]["step"] == 35 and raised["record"]["loss"] == 200.0
    assert json.loads((spawned / "between0.json").read_text()) == json.loads((spawned / "between1.json").read_text())


def _early_warning(rank: int, tmp: str) -> None:
    """Molybog's silent input and a loss warning, each rank on its own data, reduce_lr acting: the same warnings
    at the same steps on both ranks, and the same learning rate after."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Silent())
    opt = torch.optim.Adam(ddp.parameters(), lr=0.1, betas=(0.9, 0.95))
    warning = EarlyWarning(loss=2.0)
    monitor = Monitor(ddp, opt, every=10, sinks=[], early_warning=warning, on_warning="reduce_lr")
    g = torch.Generator().manual_seed(100 + rank)
    found = []
    for t in range(1, 216):
        x = torch.randn(16, 2, generator=g) * torch.tensor([1.0, 10.0 if t >= 200 else 0.0])
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), x[:, 0] + 0.5 * x[:, 1])
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        found += record["warnings"] if record else []
    monitor.flush()
    monitor.close()
    with open(f"{tmp}/warnings{rank}.json", "w") as f:
        json.dump({"warnings": found, "lr": opt.param_groups[0]["lr"]}, f)


def test_early_warnings_agree_across_ranks(spawned):
    rank0 = json.loads((spawned / "warnings0.json").read_text())
    rank1 = json.loads((spawned / "warnings1.json").read_text())
    assert rank0 == rank1
    assert {w["signal"] for w in rank0["warnings"]} == {"loss", "lag"}
    assert rank0["lr"] == 0.1 / 2 ** len(rank0["warnings"])
