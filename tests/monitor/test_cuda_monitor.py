"""The monitor on a CUDA device (skipped without one): records of a GPU model against the exact Hessian and
against the same model's records on the CPU, plain numbers in every sink, and the divergence guard."""

import copy
import json

import pytest
import torch
from test_monitor import OPTIMIZERS, Recorder, tiny_lm, train_step
from torch import nn

from curvature_support import adam_scaling, exact_hessian, mlp_problem
from optiscope.monitor import Curvature, Diverged, DivergenceGuard, JSONLSink, Monitor, TensorBoardSink
from optiscope.monitor.curvature import DIRECTIONS
from optiscope.optim import Adam, AdamW, Lion
from support import needs_cuda

pytestmark = needs_cuda


def leaves(record, path=()):
    """(path, value) of every leaf of a record: a record must hold plain numbers, not tensors (JSON, TensorBoard)."""
    if isinstance(record, dict):
        return [x for k, v in record.items() for x in leaves(v, (*path, k))]
    if isinstance(record, list | tuple):
        return [x for i, v in enumerate(record) for x in leaves(v, (*path, i))]
    return [(path, record)]


def test_curvature_records_of_a_cuda_model_hold_the_exact_preconditioned_sharpness(tmp_path):
    model, loss_fn, batch = mlp_problem(0)
    model, batch = model.to("cuda"), tuple(t.to("cuda") for t in batch)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    config = Curvature(batch, loss_fn, every=3, tol=1e-9, directions=DIRECTIONS, trace_probes=4, micro_batches=4)
    recorder = Recorder()
    sinks = [JSONLSink(tmp_path / "m.jsonl"), TensorBoardSink(tmp_path / "tb"), recorder]
    with Monitor(model, opt, every=1, sinks=sinks, curvature=config) as monitor:
        for _ in range(6):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            monitor.step(loss)
    last = recorder.records[-1]
    H = exact_hessian(copy.deepcopy(model).cpu(), loss_fn, tuple(t.cpu() for t in batch))
    d = adam_scaling(model, opt).cpu()
    assert last["sharpness"] == pytest.approx(float(torch.linalg.eigvalsh(d[:, None] * H * d[None, :])[-1]), rel=1e-6)
    assert abs(last["hessian_trace"] - float(torch.trace(H))) < 5 * last["curvature"]["trace_std_error"]
    for record in recorder.records:
        assert all(isinstance(x, int | float | str | bool | type(None)) for _, x in leaves(record)), record
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 6
    json.dumps(recorder.records)


@pytest.mark.parametrize(
    "make",
    [*OPTIMIZERS.values(), lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1), lambda ps: Lion(ps, lr=1e-3)],
    ids=[*OPTIMIZERS, "ours-adamw", "ours-lion"],
)
def test_a_cuda_model_is_recorded_as_on_the_cpu(make):
    """The same model and data on both devices: every recorded statistic agrees to float32 rounding, but the
    largest effective learning rate η/(√v̂ + ε): its v̂ is the smallest, from gradients that cancel to rounding."""
    model, data = tiny_lm()
    runs = {}
    for device in ("cpu", "cuda"):
        net = copy.deepcopy(model).to(device)
        batch = tuple(t.to(device) for t in data)
        opt = make(net.parameters())
        recorder = Recorder()
        with Monitor(net, opt, every=1, sinks=[recorder]) as monitor:
            for _ in range(4):
                loss = train_step(net, opt, batch)
                opt.step()
                monitor.step(loss)
        runs[device] = recorder.records
    for cpu, gpu in zip(runs["cpu"], runs["cuda"], strict=True):
        assert cpu.keys() == gpu.keys()
        a, b = leaves(cpu), leaves(gpu)
        assert [path for path, _ in a] == [path for path, _ in b]
        for (path, x), (_, y) in zip(a, b, strict=True):
            if path[-2:] == ("eff_lr", "max"):
                continue
            if isinstance(x, float) or isinstance(y, float):
                assert y == pytest.approx(x, rel=1e-3, abs=1e-6, nan_ok=True), (path, x, y)
            else:
                assert x == y, (path, x, y)


def test_the_guard_stops_a_cuda_run_that_overflows():
    model, data = tiny_lm()
    model = model.to("cuda")
    batch = tuple(t.to("cuda") for t in data)
    opt = Adam(model.parameters(), lr=1e-2)
    with pytest.raises(Diverged) as info, Monitor(model, opt, every=1, guard=DivergenceGuard(warmup=0)) as monitor:
        for _ in range(3):
            loss = train_step(model, opt, batch, scale=float("inf"))
            opt.step()
            monitor.step(loss)
    assert info.value.record["step"] == 1


def test_effective_lr_of_a_cuda_adam_is_its_definition():
    """η / (√v̂ + ε) per element, from a torch.optim.Adam state on the GPU, by hand."""
    model = nn.Linear(4, 3).to("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    recorder = Recorder()
    with Monitor(model, opt, every=1, sinks=[recorder], histograms=True) as monitor:
        for _ in range(2):
            opt.zero_grad()
            loss = model(torch.randn(8, 4, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            monitor.step(loss)
    state = opt.state[model.weight]
    v_hat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
    by_hand = (1e-2 / (v_hat.sqrt() + 1e-8)).flatten().cpu()
    entry = recorder.records[-1]["params"]["weight"]
    assert entry["eff_lr"]["min"] == pytest.approx(float(by_hand.min()), rel=1e-5)
    assert entry["eff_lr"]["max"] == pytest.approx(float(by_hand.max()), rel=1e-5)
    assert sum(entry["eff_lr_hist"]["counts"]) == by_hand.numel()
