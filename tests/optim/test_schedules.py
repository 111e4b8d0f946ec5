"""Schedules: exact endpoints, the seed's formulas, and the LambdaLR adaptor in a real loop."""

import io
import math

import pytest
import torch

from optiscope.optim import SGD, Schedule, as_lambda_lr, constant, cosine, linear_warmup, warmup_cosine


def test_warmup_cosine_endpoints_are_exact():
    s = warmup_cosine(3e-4, total_steps=1000, warmup_steps=100, min_lr=3e-5)
    assert s(1) == 3e-4 / 100
    assert s(100) == 3e-4  # warmup ends exactly at the peak
    assert s(1000) == 3e-5  # the total is where the decay ends: warmup counts inside it
    assert s(5000) == 3e-5
    assert s(550) == pytest.approx(3e-5 + 0.5 * (3e-4 - 3e-5))  # half-way through the decay


def test_matches_the_seed_formula_everywhere():
    lr_max, lr_min, warm, total = 1.0, 0.1, 20, 200
    s = warmup_cosine(lr_max, total, warm, lr_min)
    for t in range(1, total + 1):
        if t < warm:
            expected = lr_max * t / warm
        else:
            expected = lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * (t - warm) / (total - warm)))
        assert s(t) == pytest.approx(expected, abs=1e-15)


def test_shapes():
    assert [constant(0.1)(t) for t in (1, 10, 10**6)] == [0.1, 0.1, 0.1]
    assert [linear_warmup(1.0, 4)(t) for t in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    c = cosine(1.0, 10)
    assert c(10) == 0.0 and all(c(t) > c(t + 1) for t in range(1, 10))


def test_lambda_lr_adaptor_gives_the_schedule_at_each_step():
    p = torch.zeros(2, requires_grad=True)
    q = torch.zeros(2, requires_grad=True)
    opt = SGD([{"params": [p], "lr": 0.5}, {"params": [q], "lr": 0.05}], lr=0.5)
    s = warmup_cosine(0.5, total_steps=30, warmup_steps=5, min_lr=0.05)
    sched = as_lambda_lr(opt, s)
    for t in range(1, 31):
        assert opt.param_groups[0]["lr"] == pytest.approx(s(t), rel=1e-12)  # the lr of the t-th step
        assert opt.param_groups[1]["lr"] == pytest.approx(s(t) / 10, rel=1e-12)  # same shape, own peak
        p.grad = q.grad = torch.ones(2)
        opt.step()
        sched.step()
    assert sched.state_dict()["lr_lambdas"][0]  # the schedule is saved with the scheduler


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lr_max=-1.0), "lr_max=-1.0 must be a finite number >= 0"),
        (dict(lr_max=1.0, warmup_steps=10, total_steps=10), "total_steps=10 must be an integer > warmup_steps=10"),
        (dict(lr_max=1.0, min_lr=2.0), r"min_lr=2\.0 must be in \[0, lr_max=1\.0\]"),
        (dict(lr_max=1.0, warmup_steps=-1), "warmup_steps=-1 must be an integer >= 0"),
    ],
)
def test_bad_schedules_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Schedule(**kwargs)


def test_step_zero_is_rejected():
    with pytest.raises(ValueError, match="t=0 must be >= 1"):
        constant(1.0)(0)


def test_numpy_numbers_are_taken_and_bools_refused():
    """A sweep's grid may hand in NumPy scalars: they are numbers (η(t) then as with Python floats); True is not 1."""
    np = pytest.importorskip("numpy")
    s = Schedule(np.float32(0.5), warmup_steps=np.int64(2), total_steps=np.int64(4), min_lr=np.float32(0.25))
    assert [s(t) for t in (1, 2, 3, 4)] == [0.25, 0.5, 0.25 + 0.125 * (1 + math.cos(math.pi / 2)), 0.25]
    assert type(s(3)) is float
    with pytest.raises(ValueError, match="warmup_steps=True must be an integer >= 0"):
        Schedule(1.0, warmup_steps=True)


def test_a_schedulers_state_dict_loads_with_torch_load_defaults():
    """torch.load reads with weights_only=True by default: the adaptor's saved state must be plain data. A resumed
    loop continues with the schedule's η(t), the closed form."""
    s = warmup_cosine(0.5, total_steps=12, warmup_steps=3, min_lr=0.05)
    p = torch.zeros(2, requires_grad=True)
    opt = SGD([p], lr=0.5, momentum=0.9)
    sched = as_lambda_lr(opt, s)
    for _ in range(5):
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    q = p.detach().clone().requires_grad_()
    opt2 = SGD([q], lr=0.5, momentum=0.9)
    sched2 = as_lambda_lr(opt2, s)
    opt2.load_state_dict(saved["optimizer"])
    sched2.load_state_dict(saved["scheduler"])
    for t in range(6, 13):
        assert opt2.param_groups[0]["lr"] == pytest.approx(s(t), rel=1e-12)
        q.grad = torch.ones(2)
        opt2.step()
        sched2.step()
