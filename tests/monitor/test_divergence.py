"""The divergence guard's judgement of a loss: healthy noisy training goes on, a loss that explodes stops."""

import math

import pytest
import torch
from torch import nn

from optiscope.monitor import Diverged, DivergenceGuard, Monitor


def noisy_classifier(guard, steps=1500, seed=0):
    """A 10-class MLP on batches of 16 with 20 % of the labels random, under Adam at 1e-3: (the step the guard
    tripped at or None, the held-out loss before and after, on 4,000 examples)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(20, 10)

    def batch(n):
        x = torch.randn(n, 20)
        y = (x @ teacher).argmax(1)
        flip = torch.rand(n) < 0.2
        y[flip] = torch.randint(0, 10, (int(flip.sum()),))
        return x, y

    held_out = batch(4000)

    def held_out_loss():
        with torch.no_grad():
            return float(nn.functional.cross_entropy(model(held_out[0]), held_out[1]))

    before, tripped = held_out_loss(), None
    monitor = Monitor(model, opt, every=100, sinks=[], guard=guard)
    for _ in range(steps):
        x, y = batch(16)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        try:
            monitor.step(loss)
        except Diverged as e:
            tripped = e.record["step"]
            break
    monitor.close()
    return tripped, before, held_out_loss()


def test_a_healthy_noisy_run_is_judged_by_the_median_of_its_recent_losses_and_goes_on():
    """One lucky batch set the lowest loss and a hard one later exceeded 4× it: judged step by step
    (``window=1``) this healthy run is stopped; by the median of 9 steps (the default) it trains to the end.
    Oracle of health: the held-out loss falls steadily."""
    tripped, before, after = noisy_classifier(DivergenceGuard(window=1))
    assert tripped is not None  # a batch's loss does trip it: the test can fail
    tripped, before, after = noisy_classifier(DivergenceGuard())
    assert tripped is None and after < 0.7 * before


def test_a_loss_that_explodes_is_caught_within_half_a_window():
    """A loss that jumps 100-fold and stays there: the median of the last 9 crosses 4× the lowest after 5 such
    steps, at the step the oracle (the median written out) says."""
    guard = DivergenceGuard(warmup=0)
    losses = [1.0] * 30 + [100.0] * 10
    recent, lowest, tripped = [], math.inf, None
    for step, loss in enumerate(losses, 1):
        recent.append(loss)
        level = guard.level(recent)
        if level is not None:
            lowest = min(lowest, level)
        if guard.reason(step, loss, level, lowest, losses[0]) is not None:
            tripped = step
            break
    assert tripped == 35  # steps 31..35: five of the last nine at 100
    assert guard.reason(3, math.nan, None, math.inf, 1.0) == "loss is nan"  # not finite: at once, any step


def test_a_window_must_be_a_count():
    with pytest.raises(ValueError, match=r"window=0 must be an integer >= 1"):
        DivergenceGuard(window=0)


def test_a_diagnosis_without_an_explosion_says_which_measured_steps_it_compared():
    """ "No parameter's u/w exploded" compares each parameter's early u/w with its latest: the sentence says between
    which measured steps, and that one measured step leaves nothing to compare (not a growth of 1x). A record
    without those steps (an older file's, a loop's own) reads as before."""
    calm = [{"name": "0.weight", "first_step": None, "growth": 1.0}, {"name": "0.bias", "growth": 0.5}]
    record = {"step": 30, "loss": math.nan, "reason": "loss is nan", "exploded_first": [], "grew_most": calm}
    one = str(Diverged({**record, "first_measured_step": 1, "last_measured_step": 1}))
    assert one.endswith("no parameter's u/w exploded: only step 1 was measured, no growth to compare"), one
    two = str(Diverged({**record, "first_measured_step": 1, "last_measured_step": 26}))
    assert two.endswith("no parameter's u/w exploded between the measured steps 1 and 26 (the most: 0.weight, 1x)")
    assert str(Diverged(record)).endswith("no parameter's u/w exploded (the most: 0.weight, 1x)")
