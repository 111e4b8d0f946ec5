"""The steps the monitor does not measure read nothing from the device: their losses are kept there and judged
together every ``read_every`` steps, exactly as the guard would have judged them one at a time."""

import copy
import math

import pytest
import torch
from torch import nn

from optiscope.monitor import Diverged, DivergenceGuard, Monitor
from support import DispatchedOps, needs_cuda

#: the loss of a run that settles at 1 and jumps 100-fold at step 31: the median of 9 crosses 4x its lowest at
#: step 35 (five of the last nine at 100; the oracle written out in test_divergence)
JUMP = [1.0] * 30 + [100.0] * 10


def _run(losses, read_every, as_tensor=True, resume_at=None, every=100, on_divergence="raise"):
    """Steps of a model whose loss is given (``losses``, 1-based by step); returns (the divergence record or None,
    the step at which it was raised or recorded, the monitor)."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    guard = DivergenceGuard(warmup=0, read_every=read_every)

    def build():
        return Monitor(model, opt, every=every, sinks=[], guard=guard, on_divergence=on_divergence)

    monitor = build()
    for step, value in enumerate(losses, 1):
        if step == resume_at:
            state = monitor.state_dict()
            monitor.close()
            monitor = build()
            monitor.load_state_dict(state)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        try:
            monitor.step(torch.tensor(value) if as_tensor else value)
        except Diverged as e:
            return e.record, step, monitor
        if monitor.diverged is not None:
            return monitor.diverged, step, monitor
    return None, None, monitor


def test_a_divergence_is_read_with_the_step_it_happened_at_within_read_every_steps():
    """The oracle: ``read_every=1``, each loss judged as it comes (as before losses were kept on the device)."""
    at_once, raised, _ = _run(JUMP, read_every=1)
    assert at_once["step"] == raised == 35 and "4 x its lowest value" in at_once["reason"]
    kept, raised, _ = _run(JUMP, read_every=10)
    assert kept == at_once and raised == 40  # the same record, read at step 40
    recorded, when, _ = _run(JUMP, read_every=10, on_divergence="record")
    assert recorded == at_once and when == 40
    nan = [1.0] * 12 + [math.nan] * 28
    record, raised, _ = _run(nan, read_every=10)
    assert (record["step"], record["reason"], raised) == (13, "loss is nan", 20)


def test_a_measured_step_reads_the_steps_kept_before_it():
    record, raised, _ = _run(JUMP, read_every=10, every=6)  # measured at 36: read there, judged in order
    assert record["step"] == 35 and raised == 36


def test_a_loss_given_as_a_number_is_judged_at_once_in_a_single_process():
    record, raised, _ = _run(JUMP, read_every=10, as_tensor=False)
    assert record["step"] == raised == 35


def test_a_resume_with_losses_not_read_yet_judges_them_where_the_whole_run_does():
    """Saved at step 33, three losses are not read yet: the state holds them as numbers, bit for bit, and the
    resumed run trips where the whole one does, with the same guard state."""
    whole, raised, _ = _run(JUMP, read_every=10)
    resumed, raised_again, monitor = _run(JUMP, read_every=10, resume_at=34)
    assert resumed == whole and raised_again == raised == 40
    _, _, monitor = _run(JUMP[:33], read_every=10)
    unread = monitor.state_dict()["unread"]
    assert unread == [(31, 100.0, 0, True), (32, 100.0, 0, True), (33, 100.0, 0, True)]
    state = monitor.state_dict()
    monitor.flush()
    assert monitor.state_dict()["unread"] == [] and monitor.recent_losses == [1.0] * 6 + [100.0] * 3
    assert state["recent_losses"] == [1.0] * 9  # taken before the flush, not changed by it


def test_flush_judges_the_last_steps_and_close_leaves_them_in_the_state():
    _, _, monitor = _run(JUMP[:37], read_every=10)  # tripped at 35, not read yet
    assert monitor.diverged is None
    twin = copy.deepcopy(monitor.state_dict())
    with pytest.raises(Diverged, match="diverged at step 35"):
        monitor.flush()
    _, _, monitor = _run(JUMP[:37], read_every=10)
    monitor.close()
    assert monitor.diverged is None and monitor.state_dict() == twin


def _scaled_step(model, opt, scaler, monitor, x, y, counter):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    (loss if scaler is None else scaler.scale(loss)).backward()
    with counter:
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        if monitor is not None:
            monitor.step(loss)


@pytest.mark.parametrize("scaled", [False, True], ids=["adamw", "gradscaler-fused-adamw"])
def test_the_steps_between_readings_read_nothing_from_the_device(scaled):
    """Each step's operators after backward (the optimizer's step, the scaler's, the monitor's) against a twin
    trained without the monitor: on the steps neither measured nor read, the monitor adds the loss's float64
    copy and nothing else (no ``_local_scalar_dense``, the host read; no collective). A fused AdamW under a
    GradScaler skips a step inside its kernel on the scaler's ``found_inf``, which the monitor then keeps with
    the loss instead of reading it. The measured steps do read (the counter can fail)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    twin = copy.deepcopy(model)
    make = (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)) if scaled else (
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2)
    )  # fmt: skip
    opt, twin_opt = make(model), make(twin)
    scalers = [torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")] if scaled else [None, None]
    monitor = Monitor(model, opt, every=5, sinks=[], guard=DivergenceGuard(read_every=5))
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    for step in range(1, 11):
        mine, theirs = DispatchedOps(), DispatchedOps()
        _scaled_step(model, opt, scalers[0], monitor, x, y, mine)
        _scaled_step(twin, twin_opt, scalers[1], None, x, y, theirs)
        extra = mine.ops - theirs.ops
        assert not theirs.ops - mine.ops, step
        if step in (1, 5, 10):  # measured and read
            assert extra["aten._local_scalar_dense"] > 0, step
        else:
            assert extra == {"aten.detach": 1, "aten._to_copy": 1}, (step, extra)
    assert monitor.step_count == 10 and monitor.diverged is None
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True))


@pytest.mark.parametrize(
    "scaled", [pytest.param(s, marks=needs_cuda, id=name) for s, name in ((False, "adamw"), (True, "gradscaler-fused"))]
)
def test_a_cuda_run_syncs_only_where_the_monitor_reads(scaled):
    """``torch.cuda.set_sync_debug_mode("error")`` on the steps between readings: any wait for the GPU (a read,
    ``.item()``, ``.cpu()``) raises there."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=scaled)
    scaler = torch.amp.GradScaler("cuda") if scaled else None
    monitor = Monitor(model, opt, every=5, sinks=[], guard=DivergenceGuard(read_every=5))
    x, y = torch.randn(32, 6, device="cuda"), torch.randn(32, 1, device="cuda")
    for step in range(1, 21):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        (loss if scaler is None else scaler.scale(loss)).backward()
        torch.cuda.set_sync_debug_mode("default" if monitor.is_measured(step) else "error")
        try:
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            monitor.step(loss)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert monitor.last_record["step"] == 20 and math.isfinite(monitor.last_record["loss"])
