"""The monitor's hooks hold it weakly and ``close()`` lets go: the model, its DDP wrapper and the optimizer are
freed by their reference counts the moment the user drops them, with the garbage collector off (a reference
cycle would keep them, and the process group with them, until the collector runs: at interpreter shutdown,
after ``destroy_process_group``, where gloo's threads abort the process)."""

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

from optiscope.monitor import Curvature, JSONLSink, Monitor


@pytest.fixture
def no_collector():
    """The garbage collector off for the test. torch's first optimizer imports dynamo, whose import leaves that
    optimizer's frames in cycles: done before, with the collector still on."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _mse(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1])


def _trained(wrap, close: bool, tmp_path, **options):
    """Weak references to a model (as ``wrap`` wraps it), its optimizer and its monitor, after 5 steps (measured
    and not) and, with ``close``, ``monitor.close()``; every strong reference is gone when this returns."""
    torch.manual_seed(0)
    model = wrap(nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randint(0, 10, (8, 3)), torch.randn(8, 1)
    curvature = options.pop("curvature", None)
    if curvature is not None:
        options["curvature"] = Curvature((x, y), _mse, every=2, **curvature)
    monitor = Monitor(model, opt, every=2, sinks=[JSONLSink(tmp_path / "m.jsonl")], **options)
    for _ in range(5):
        opt.zero_grad()
        for _ in range(2):  # two accumulated backward passes a step
            _mse(model, (x, y)).backward()
        opt.step()
        monitor.step(_mse(model, (x, y)).detach())
    assert monitor.last_record["step"] == 4
    if close:
        monitor.close()
    return weakref.ref(model), weakref.ref(opt), weakref.ref(monitor)


OPTIONS = {
    "plain": {},
    "curvature": {"curvature": {"micro_batches": 2}, "histograms": True, "embedding": "0.weight"},
    "accumulated passes": {"curvature": {"accumulation_batch_size": 8}},
}


@pytest.mark.parametrize("close", [True, False], ids=["closed", "dropped"])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS)
def test_the_model_and_optimizer_are_freed_without_the_garbage_collector(no_collector, tmp_path, options, close):
    refs = _trained(lambda m: m, close, tmp_path, **dict(options))
    assert [r() is None for r in refs] == [True, True, True]


def test_a_ddp_wrapper_is_freed_without_the_garbage_collector(no_collector, tmp_path):
    """The wrapper holds the process group: freed by its reference count, it lets go of it before
    ``destroy_process_group`` (a gloo group of one process, in this one)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        refs = _trained(nn.parallel.DistributedDataParallel, True, tmp_path)
        assert [r() is None for r in refs] == [True, True, True]
    finally:
        dist.destroy_process_group()


def test_a_closed_monitor_keeps_its_records_and_refuses_to_step(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1, sinks=[])
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    record = monitor.step(1.0)
    monitor.close()
    monitor.close()  # twice: nothing more
    assert monitor.model is None and monitor.optimizer is None
    assert monitor.last_record is record and monitor.state_dict()["step_count"] == 1
    opt.step()  # its hooks are gone
    with pytest.raises(ValueError, match=r"Monitor.step: the monitor is closed; build a new Monitor") as info:
        monitor.step(1.0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
def test_under_fsdp1_the_monitor_and_optimizer_go_and_nothing_of_ours_holds_the_model(
    no_collector, tmp_path, use_orig_params
):
    """FSDP1 (torch 2.13) keeps its model alive past the user's last name for it, monitor or not (its
    ``FlatParamHandle`` holds a bound method of itself; its post-backward hooks hold the module): the monitor
    cannot free that model early, but it adds nothing that holds it. The monitor and the optimizer go by their
    reference counts, and neither what holds the model nor what the collector finds holds an object of ours."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    def wrap(module):
        return FullyShardedDataParallel(module, use_orig_params=use_orig_params, device_id=torch.device("cpu"))

    def ours(objects):
        return [type(o) for o in objects if type(o).__module__.startswith("optiscope")]

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        model, opt, monitor = _trained(wrap, True, tmp_path)
        assert monitor() is None and opt() is None
        assert model() is not None, "FSDP1 frees its model by reference count now: update the torchrun guide"
        assert ours(gc.get_referrers(model())) == []
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            assert ours(gc.garbage) == []
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        dist.destroy_process_group()
