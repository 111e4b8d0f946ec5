"""The training core: exact resume after an interruption at any step, divergence as a result, and
checkpoints that are either complete and ours or refused by name.

The oracle for every resume is the same run trained without interruption (bit for bit: one process,
one machine)."""

import json
import math
import os
import signal

import pytest
import torch
from torch import nn

from optiscope import runs, train
from optiscope.monitor import DivergenceGuard, JSONLSink, Monitor
from optiscope.optim import AdamW, as_lambda_lr, warmup_cosine
from optiscope.train.checkpoint import FORMAT
from optiscope.train.loop import new_history

STEPS = 12


class Regression(train.Task):
    """y = x·w* + noise on fresh batches; evaluation = loss on a fixed batch; ``hook(step)`` runs while
    the batch of ``step`` is drawn (to interrupt there)."""

    def __init__(self, hook=None, goal=None):
        self.hook, self.goal = hook, goal
        g = torch.Generator().manual_seed(99)
        self.x_eval = torch.randn(64, 4, generator=g)
        self.w = torch.tensor([1.0, -2.0, 0.5, 3.0])

    def batch(self, step, data):
        x = torch.randn(16, 4, generator=data)
        y = x @ self.w + 0.1 * torch.randn(16, generator=data)
        if self.hook is not None:
            self.hook(step)
        return x, y

    def loss(self, net, batch):
        x, y = batch
        return nn.functional.mse_loss(net(x).squeeze(-1), y + 0.01 * torch.randn_like(y))  # draws from the RNG too

    def evaluate(self, run):
        with torch.no_grad():
            value = float(nn.functional.mse_loss(run.model(self.x_eval).squeeze(-1), self.x_eval @ self.w))
        run.history["evals"].append([run.step, value])
        return self.goal is not None and value < self.goal


def make_run(tmp_path, label="reg"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = AdamW(model.parameters(), lr=0.05)
    monitor = Monitor(model, optimizer, every=3, sinks=[JSONLSink(tmp_path / "metrics.jsonl")], context={"run": label})
    scheduler = as_lambda_lr(optimizer, warmup_cosine(0.05, STEPS, 2, 0.005))
    history = new_history(evals=[])
    return train.Run(label, model, optimizer, torch.Generator().manual_seed(1), scheduler, monitor, history)


PLAN = train.Plan(STEPS, clip=1.0, eval_every=4, checkpoint_every=5)


@pytest.mark.parametrize(
    "setting, error, valid",
    [
        ({"steps": -1}, ValueError, "an integer >= 0"),
        ({"steps": "10"}, TypeError, "an integer >= 0"),
        ({"steps": True}, TypeError, "an integer >= 0"),
        ({"clip": 0.0}, ValueError, "None or a number > 0"),
        ({"clip": math.nan}, ValueError, "None or a number > 0"),
        ({"clip": "1"}, TypeError, "None or a number > 0"),
        ({"eval_every": 0}, ValueError, "None or an integer >= 1"),
        ({"checkpoint_every": 2.5}, TypeError, "None or an integer >= 1"),
        ({"eval_at_start": 1}, TypeError, "True or False"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_value(setting, error, valid):
    """What the Plan's fields mean (its docstring) is what it takes: a setting outside it is refused in one line
    naming it, rather than train nothing (steps=-1), checkpoint at odd steps (2.5) or fail later unnamed."""
    ((name, value),) = setting.items()
    with pytest.raises(error) as refused:
        train.Plan(**{"steps": STEPS, **setting})
    assert str(refused.value) == f"Plan: {name}={value!r} must be {valid}" or str(refused.value).startswith(
        f"Plan: {name}={value!r} must be {valid} ("
    )


def finished(tmp_path, task=None, plan=PLAN):
    run = make_run(tmp_path)
    train.train(run, task or Regression(), plan, tmp_path / "ckpt.pt")
    return run


def comparable(run, tmp_path):
    """Everything a run leaves, without the wall-clock numbers."""
    history = {k: v for k, v in run.history.items() if k != "seconds"}
    history["train"] = {k: v for k, v in history["train"].items() if k != "seconds"}
    records = [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in runs.read_jsonl(tmp_path / "metrics.jsonl")]
    return history, records


def assert_same(a, b, dir_a, dir_b):
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        for key, value in a.optimizer.state[p].items():
            assert torch.equal(value, b.optimizer.state[q][key]), key
    assert comparable(a, dir_a) == comparable(b, dir_b)


@pytest.fixture
def straight(tmp_path):
    return finished(tmp_path / "straight"), tmp_path / "straight"


@pytest.mark.parametrize("at", [1, 3, 5, 7, 11])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_request_at_any_step_resumes_bit_exact(tmp_path, straight, at, signum):
    """Ctrl-C or SIGTERM while step ``at`` runs: the step completes, is checkpointed, and the resumed run
    equals the uninterrupted one (weights, optimizer state, history, every logged record)."""
    here = tmp_path / "stopped"

    def stop(step):
        if step == at:
            os.kill(os.getpid(), signum)

    with pytest.raises(train.Interrupted) as info:
        train.train(make_run(here), Regression(stop), PLAN, here / "ckpt.pt")
    assert info.value.step == at and runs.load_checkpoint(here / "ckpt.pt")["step"] == at
    resumed = make_run(here)
    train.train(resumed, Regression(), PLAN, here / "ckpt.pt")
    assert_same(straight[0], resumed, straight[1], here)


@pytest.mark.parametrize("at", [2, 6, 12])
def test_a_hard_kill_resumes_from_the_last_checkpoint_bit_exact(tmp_path, straight, at):
    """An exception mid-step (as kill -9 leaves things): the last periodic checkpoint resumes exactly."""
    here = tmp_path / "killed"

    def die(step):
        if step == at:
            raise KeyboardInterrupt  # not a request: nothing is saved on the way out

    with pytest.raises(KeyboardInterrupt):
        train.train(make_run(here), Regression(die), PLAN, here / "ckpt.pt")
    saved = (at - 1) // 5 * 5
    assert (here / "ckpt.pt").exists() == (saved > 0)
    resumed = make_run(here)
    train.train(resumed, Regression(), PLAN, here / "ckpt.pt")
    assert_same(straight[0], resumed, straight[1], here)


def stopped_by(hook, tmp_path):
    """The KeyboardInterrupt (an ``Interrupted`` or a plain one) that ends training with ``hook`` called at each batch,
    or None. Caught here rather than by pytest.raises, so that a plain KeyboardInterrupt where an ``Interrupted`` is
    expected fails the test instead of ending pytest's session."""
    try:
        train.train(make_run(tmp_path), Regression(hook), PLAN, tmp_path / "ckpt.pt")
    except KeyboardInterrupt as e:
        return e
    return None


def test_a_second_stop_request_stops_at_once(tmp_path):
    def twice(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    stopped = stopped_by(twice, tmp_path)
    assert type(stopped) is KeyboardInterrupt and not (tmp_path / "ckpt.pt").exists()


def test_sigterm_then_sigint_is_one_request(tmp_path, straight):
    """A scheduler's SIGTERM to every process of a job and the sweep's SIGINT passing its own stop on reach a
    trial's worker together: one request (the step completes and is checkpointed), not the second that stops at
    once; the resumed run equals the uninterrupted one."""

    def both(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)

    stopped = stopped_by(both, tmp_path)
    assert isinstance(stopped, train.Interrupted), f"stopped by {stopped!r}, not as one request"
    assert stopped.step == 3 and runs.load_checkpoint(tmp_path / "ckpt.pt")["step"] == 3
    resumed = make_run(tmp_path)
    train.train(resumed, Regression(), PLAN, tmp_path / "ckpt.pt")
    assert_same(straight[0], resumed, straight[1], tmp_path)


def test_a_signal_that_came_before_stops_at_once_whichever_came_between(tmp_path):
    """SIGTERM, SIGINT (one request), then SIGTERM again: a second request, which stops at once."""

    def thrice(step):
        if step == 3:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), signum)

    stopped = stopped_by(thrice, tmp_path)
    assert type(stopped) is KeyboardInterrupt and not (tmp_path / "ckpt.pt").exists()


def test_a_finished_run_is_not_trained_again(tmp_path):
    run = finished(tmp_path)
    again = make_run(tmp_path)
    train.train(again, Regression(), PLAN, tmp_path / "ckpt.pt")
    assert again.history == run.history and again.history["status"] == "ok"


def test_the_goal_stops_training_early(tmp_path):
    run = finished(tmp_path, Regression(goal=math.inf), train.Plan(STEPS, eval_every=4, eval_at_start=True))
    assert run.step == 0 and run.history["evals"][0][0] == 0 and run.history["status"] == "ok"
    # checkpointed as every finished run is: resumed, it returns that outcome instead of evaluating again
    saved = runs.load_checkpoint(tmp_path / "ckpt.pt")
    assert saved["step"] == 0 and saved["history"]["status"] == "ok" and saved["training"] is not None
    again = make_run(tmp_path)
    train.train(
        again, Regression(goal=math.inf), train.Plan(STEPS, eval_every=4, eval_at_start=True), tmp_path / "ckpt.pt"
    )
    assert again.history == run.history


def test_a_run_interrupted_past_the_plans_steps_is_refused_not_called_finished(tmp_path):
    """A run stopped at step 7, resumed with a plan of 5 steps, would be marked finished at step 7 with no
    checkpoint of it: refused instead, naming both, and the checkpoint left as it was."""

    def stop(step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(train.Interrupted):
        train.train(make_run(tmp_path), Regression(stop), PLAN, tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    message = r"interrupted at step 7, past the plan's steps=5; resume it with steps >= 7, or start it afresh elsewhere"
    with pytest.raises(runs.CheckpointError, match=message):
        train.train(make_run(tmp_path), Regression(), train.Plan(5), tmp_path / "ckpt.pt")
    assert (tmp_path / "ckpt.pt").read_bytes() == before


class Poisoned(Regression):
    """From step ``at`` on the batch (and so the loss or only the gradient) is not finite."""

    def __init__(self, at, where):
        super().__init__()
        self.at, self.where = at, where

    def batch(self, step, data):
        x, y = super().batch(step, data)
        if step >= self.at:
            if self.where == "loss":
                y = y * math.nan
            else:  # a finite loss whose gradient overflows: inf inputs times zero-initialised weights
                x = x * math.inf
        return x, y


@pytest.mark.parametrize("where", ["loss", "gradient"])
def test_a_non_finite_step_is_never_taken(tmp_path, where):
    run = make_run(tmp_path)
    if where == "gradient":
        nn.init.zeros_(run.model[0].weight)
    task = Poisoned(8, where)
    train.train(run, task, PLAN, tmp_path / "ckpt.pt")
    assert run.history["status"] == "diverged" and run.history["divergence"]["step"] == 8
    assert "the step was not taken" in run.history["divergence"]["reason"]
    assert run.step == 7 and all(torch.isfinite(p).all() for p in run.model.parameters())
    saved = train.load(tmp_path / "ckpt.pt", "reg")
    assert saved["step"] == 5 and saved["history"]["status"] == "diverged"  # the last good state, and the outcome
    assert saved["history"]["divergence"]["checkpoint_step"] == 5
    divergence = [r for r in runs.read_jsonl(tmp_path / "metrics.jsonl") if r.get("diverged")]
    assert len(divergence) == 1 and divergence[0]["step"] == 8
    again = make_run(tmp_path)
    train.train(again, Regression(), PLAN, tmp_path / "ckpt.pt")  # resuming does not try again
    assert json.dumps(again.history) == json.dumps(run.history)  # (NaN-aware: the loss is nan)


def test_resuming_a_run_that_diverged_keeps_its_records(tmp_path):
    """The record of the step a diverged run refused (step 8, after its history's step 7) stays in metrics.jsonl
    when a job that holds the run is resumed: the file is left as the run left it."""
    train.train(make_run(tmp_path), Poisoned(8, "loss"), PLAN, tmp_path / "ckpt.pt")
    before = (tmp_path / "metrics.jsonl").read_bytes()
    assert runs.read_jsonl(tmp_path / "metrics.jsonl")[-1]["step"] == 8
    train.train(make_run(tmp_path), Regression(), PLAN, tmp_path / "ckpt.pt")
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


class StoppedWhileFinishing(Poisoned):
    """Ctrl-C while the run finishes (after the last step's check for a stop request), diverged at ``at`` or not."""

    def finish(self, run):
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("at", [math.inf, 8])
def test_a_stop_request_while_a_run_ends_still_stops(tmp_path, straight, at):
    """The request is not forgotten (and the next run of a job started): the run's outcome is saved, then
    ``Interrupted``; resuming returns the outcome as the uninterrupted run left it."""
    with pytest.raises(train.Interrupted):
        train.train(make_run(tmp_path), StoppedWhileFinishing(at, "loss"), PLAN, tmp_path / "ckpt.pt")
    ended = train.load(tmp_path / "ckpt.pt", "reg")["history"]["status"]
    assert ended == ("ok" if at == math.inf else "diverged")
    if at == math.inf:
        resumed = make_run(tmp_path)
        train.train(resumed, Regression(), PLAN, tmp_path / "ckpt.pt")
        assert_same(straight[0], resumed, straight[1], tmp_path)


def test_a_run_whose_weights_overflow_in_its_last_step_is_finished_once(tmp_path):
    """``Task.finish`` is called once, with the outcome: an infinite learning rate in the last step leaves
    non-finite weights (no monitor here to see them first), so the run diverged, its step-10 checkpoint kept."""
    calls = []

    class Blown(Regression):
        def batch(self, step, data):
            if step == STEPS:
                run.optimizer.param_groups[0]["lr"] = math.inf
            return super().batch(step, data)

        def finish(self, run):
            calls.append(run.history["status"])

    run = make_run(tmp_path)
    run.monitor = None
    train.train(run, Blown(), PLAN, tmp_path / "ckpt.pt")
    assert calls == ["diverged"] and "non-finite weights after step 12" in run.history["divergence"]["reason"]
    assert train.load(tmp_path / "ckpt.pt", "reg")["step"] == 10


def test_divergence_before_the_first_checkpoint_keeps_the_outcome_only(tmp_path):
    run = make_run(tmp_path)
    train.train(run, Poisoned(2, "loss"), PLAN, tmp_path / "ckpt.pt")
    saved = train.load(tmp_path / "ckpt.pt", "reg")
    assert saved["training"] is None and saved["history"]["divergence"]["checkpoint_step"] is None


def test_the_guard_trips_after_a_step_that_blew_the_loss_up(tmp_path):
    run = make_run(tmp_path)
    run.monitor.guard = DivergenceGuard(factor=2, warmup=0, window=1)  # each step judged: a short plan
    run.optimizer.param_groups[0]["lr"] = 50.0  # a certain divergence on any machine
    run.scheduler = None
    train.train(run, Regression(), PLAN, tmp_path / "ckpt.pt")
    assert run.history["status"] == "diverged" and "lowest value" in run.history["divergence"]["reason"]


def test_a_record_at_the_step_the_guard_trips_reaches_the_history(tmp_path):
    """The monitor writes the measured step's record and then raises: the run's history and the task see it too."""
    seen = []

    class Watching(Regression):
        def on_record(self, run, record):
            seen.append(record["step"])

    run = make_run(tmp_path)
    run.monitor.every = 1
    run.monitor.guard = DivergenceGuard(factor=2, warmup=0, window=1)  # each step judged: a short plan
    run.optimizer.param_groups[0]["lr"] = 50.0
    run.scheduler = None
    train.train(run, Watching(), PLAN, tmp_path / "ckpt.pt")
    step = run.history["divergence"]["step"]
    measured = [r["step"] for r in runs.read_jsonl(tmp_path / "metrics.jsonl") if not r.get("diverged")]
    assert measured[-1] == step and seen == measured == run.history["train"]["step"]


def test_records_hold_the_gradient_norm_before_clipping_beside_the_clipped_one(tmp_path):
    class Plain(Regression):  # a loss that draws nothing from torch's global generator
        def loss(self, net, batch):
            return nn.functional.mse_loss(net(batch[0]).squeeze(-1), batch[1])

    run = make_run(tmp_path)
    twin = make_run(tmp_path / "twin")  # the same model, optimizer and data: torch's own clipping as the oracle
    clip = 1e-3  # far below any gradient here: every step clips
    train.train(run, Plain(), train.Plan(1, clip=clip), tmp_path / "ckpt.pt")
    (record,) = runs.read_jsonl(tmp_path / "metrics.jsonl")
    twin.optimizer.zero_grad()
    Plain().loss(twin.model, Plain().batch(1, twin.data)).backward()
    expected = float(torch.nn.utils.clip_grad_norm_(twin.model.parameters(), clip))
    assert record["grad_norm_before_clip"] == pytest.approx(expected, rel=1e-5)
    assert record["grad_norm"] == pytest.approx(clip, rel=1e-4)


def without(path, *keys):
    """The checkpoint at ``path`` with the entry ``keys`` (a path into it) removed: a file damaged by hand."""
    state = torch.load(path, weights_only=False)
    holder = state
    for key in keys[:-1]:
        holder = holder[key]
    del holder[keys[-1]]
    torch.save(state, path)


def reshaped(path, name, shape):
    """The checkpoint at ``path`` as a run of another width (``shape``) or architecture (None: no ``name``) left
    it under the same run name."""
    state = torch.load(path, weights_only=False)
    model = state["training"]["model"]
    if shape is None:
        del model[name]
    else:
        model[name] = torch.zeros(shape)
    torch.save(state, path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:200]), "is not a readable checkpoint"),
        (lambda p: torch.save({"model": {}}, p), "is not an optiscope training checkpoint"),
        (lambda p: torch.save({"format": FORMAT, "label": "other"}, p), "is the checkpoint of run 'other'"),
        (
            lambda p: reshaped(p, "0.weight", (16, 4)),
            r"is not a checkpoint of this run \(its 0.weight is \(16, 4\), this run's \(8, 4\)\)",
        ),
        (lambda p: reshaped(p, "2.bias", None), r"not a checkpoint of this run \(its model lacks '2.bias'\)"),
        (lambda p: without(p, "history"), r"is damaged: it lacks history; delete it"),
        (lambda p: without(p, "training", "optimizer"), r"is damaged: it lacks training.optimizer; delete it"),
    ],
)
def test_a_bad_checkpoint_is_refused_by_name_and_left_alone(tmp_path, damage, message):
    path = tmp_path / "ckpt.pt"
    finished(tmp_path)
    damage(path)
    before = path.read_bytes()
    with pytest.raises(runs.CheckpointError, match=message) as error:
        train.train(make_run(tmp_path), Regression(), PLAN, path)
    assert str(path) in str(error.value) and path.read_bytes() == before


def test_an_interruption_crosses_a_process_boundary_as_it_was():
    """A sweep's pool worker stopped by SIGTERM raises Interrupted, which the pool pickles back: it could not be
    unpickled (its __init__ takes the label and step), so the pool was reported broken."""
    import pickle

    sent = train.Interrupted("sgd@0.1", 7)
    back = pickle.loads(pickle.dumps(sent))
    assert type(back) is train.Interrupted and (back.label, back.step, str(back)) == ("sgd@0.1", 7, str(sent))


def test_a_schedule_free_optimizer_is_evaluated_at_its_average_and_trains_unchanged(tmp_path):
    """The oracle is a hand-written loop with pytorch-optimizer's ScheduleFreeAdamW: its evaluations call the
    optimizer's own ``eval()`` (the averaged weights x) and its training never does."""
    schedule_free = pytest.importorskip("pytorch_optimizer").ScheduleFreeAdamW
    task = Regression()

    def new(label):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        optimizer = schedule_free(model.parameters(), lr=0.05)
        return train.Run(label, model, optimizer, torch.Generator().manual_seed(1), history=new_history(evals=[]))

    run = new("sf")
    train.train(run, task, train.Plan(steps=STEPS, eval_every=4, eval_at_start=False))

    hand = new("hand")
    evals = []
    for step in range(1, STEPS + 1):
        hand.optimizer.zero_grad()
        task.loss(hand.model, task.batch(step, hand.data)).backward()
        hand.optimizer.step()
        if step % 4 == 0:
            hand.optimizer.eval()
            with torch.no_grad():
                evals.append(float(nn.functional.mse_loss(hand.model(task.x_eval).squeeze(-1), task.x_eval @ task.w)))
            hand.optimizer.train()
    assert [s for s, _ in run.history["evals"]] == [4, 8, 12]
    assert [v for _, v in run.history["evals"]] == pytest.approx(evals, rel=1e-5)
    for p, q in zip(run.model.parameters(), hand.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # at y, where it trains, the loss differs: the switch is what the evaluation measured
    with torch.no_grad():
        at_y = float(nn.functional.mse_loss(run.model(task.x_eval).squeeze(-1), task.x_eval @ task.w))
    assert abs(at_y - evals[-1]) > 1e-4
