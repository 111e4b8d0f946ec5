"""The monitor with curvature: the agreed keys in records and sinks, values against an exact Hessian,
the divergence diagnosis, and exact resume of the warm start and history."""

import collections
import copy
import io
import itertools
import math

import pytest
import torch
from torch import nn

from curvature_support import (
    adam_scaling,
    assert_accumulated_noise_scale,
    exact_hessian,
    mlp_problem,
    noise_scale_by_formula,
)
from optiscope.monitor import ConsoleSink, Curvature, Diverged, DivergenceGuard, JSONLSink, Monitor, TensorBoardSink
from optiscope.monitor.curvature import DIRECTIONS, KEYS
from optiscope.monitor.divergence import curvature_diagnosis


def train(model, opt, monitor, loss_fn, batch, steps):
    records = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        if record is not None:
            records.append(record)
    return records


def test_records_carry_the_agreed_keys_and_the_exact_preconditioned_sharpness(tmp_path):
    model, loss_fn, batch = mlp_problem(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    config = Curvature(batch, loss_fn, every=3, tol=1e-9, directions=DIRECTIONS, trace_probes=4, micro_batches=4)
    sinks = [JSONLSink(tmp_path / "m.jsonl"), TensorBoardSink(tmp_path / "tb"), ConsoleSink()]
    monitor = Monitor(model, opt, every=100, sinks=sinks, curvature=config)
    records = train(model, opt, monitor, loss_fn, batch, 6)
    monitor.close()
    assert [r["step"] for r in records] == [1, 3, 6]  # the first (monitor) and the curvature steps
    assert "sharpness" not in records[0] and set(KEYS) <= set(records[-1])
    last = records[-1]
    H = exact_hessian(model, loss_fn, batch)
    d = adam_scaling(model, opt)
    exact = float(torch.linalg.eigvalsh(d[:, None] * H * d[None, :])[-1])
    assert last["sharpness"] == pytest.approx(exact, rel=1e-6)
    assert last["threshold"] == pytest.approx(38 / 0.02)
    assert last["sharpness/threshold"] == pytest.approx(exact / (38 / 0.02), rel=1e-6)
    assert last["curvature/update"] <= last["sharpness"] * (1 + 1e-9)  # a Rayleigh quotient of P⁻¹H
    assert abs(last["hessian_trace"] - float(torch.trace(H))) < 5 * last["curvature"]["trace_std_error"]
    assert last["curvature"]["label"] == "38/η" and len(last["curvature"]["snr"]) == 4
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"sharpness", "sharpness/threshold", "noise_scale"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("sharpness")] == [3, 6]


class Bowl(nn.Module):
    def __init__(self):
        super().__init__()
        self.theta = nn.Parameter(torch.ones(2, dtype=torch.float64))

    def forward(self, curv):
        return 0.5 * (curv * self.theta**2).sum()


def bowl_loss(model, curv):
    return model(curv)


def test_divergence_is_diagnosed_with_the_sharpness_ratio():
    model, curv = Bowl(), torch.tensor([4.0, 1.0], dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=1.5 * 2 / 4)  # 1.5 × beyond 2/η for λ₁ = 4
    monitor = Monitor(
        model, opt, every=1, guard=DivergenceGuard(warmup=0), curvature=Curvature(curv, bowl_loss, every=1)
    )
    with pytest.raises(Diverged) as info:
        train(model, opt, monitor, bowl_loss, curv, 50)
    assert "sharpness 1.5× its 2/η threshold since step 1" in str(info.value)
    assert info.value.record["curvature_diagnosis"].startswith(f"diverged at step {info.value.record['step']}; ")


def test_the_diagnosis_sentence():
    history = [(150, 0.9, "38/η", True), (180, 2.0, "38/η", True), (200, 3.1, "38/η", True)]
    assert curvature_diagnosis(212, history) == (
        "diverged at step 212; preconditioned sharpness 3.1× its 38/η threshold since step 180"
    )
    # the streak's highest, where the last measurement is lower (sgd@3 of edge-of-stability: 4.3e7× at its first)
    peaked = [(2, 0.5, "2/η", False), (4, 4.3e7, "2/η", False), (6, 3e3, "2/η", False), (8, 26.3, "2/η", False)]
    assert curvature_diagnosis(13, peaked) == (
        "diverged at step 13; sharpness 26.3× its 2/η threshold since step 4 (at most 4.3e+07× at step 4)"
    )
    calm = curvature_diagnosis(30, [(10, 0.5, "2/η", False), (20, 0.7, "2/η", False)])
    assert calm.startswith("diverged at step 30; sharpness stayed below its 2/η threshold")
    assert curvature_diagnosis(5, [(1, None, "", False)]) is None
    # above the threshold all along but below it at the last measurement (taken at parameters already blowing up)
    mostly_above = [(5, 0.69, "3.8/η", False), (10, 1.98, "3.8/η", False), (15, 5.57, "3.8/η", False)]
    assert curvature_diagnosis(20, [*mostly_above, (20, 0.808, "3.8/η", False)]) == (
        "diverged at step 20; sharpness above its 3.8/η threshold at 2 of 4 measurements "
        "(at most 5.57× at step 15; 0.808× at step 20)"
    )
    ended = curvature_diagnosis(5, [(1, 0.5, "2/η", False), (2, math.inf, "2/η", False)])
    assert ended.startswith("diverged at step 5; sharpness stayed below its 2/η threshold (0.5× at step 1")
    assert ended.endswith("; not finite at step 2")


def test_resume_continues_the_warm_start_and_history_exactly():
    model, loss_fn, batch = mlp_problem(2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    config = Curvature(batch, loss_fn, every=2, directions=DIRECTIONS)
    monitor = Monitor(model, opt, every=100, curvature=config)
    train(model, opt, monitor, loss_fn, batch, 4)
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), copy.deepcopy(monitor.state_dict()))
    straight = train(model, opt, monitor, loss_fn, batch, 2)[-1]
    model2, _, _ = mlp_problem(2)
    model2.load_state_dict(saved[0])
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.02)
    opt2.load_state_dict(saved[1])
    resumed_monitor = Monitor(model2, opt2, every=100, curvature=config)
    resumed_monitor.load_state_dict(saved[2])
    resumed = train(model2, opt2, resumed_monitor, loss_fn, batch, 2)[-1]
    assert resumed["step"] == straight["step"] == 6
    for key in ("sharpness", "curvature/update", "curvature/gradient"):
        assert resumed[key] == straight[key]
    assert resumed["curvature"]["hvps"] == straight["curvature"]["hvps"]
    assert resumed_monitor.state_dict()["curvature_history"] == monitor.state_dict()["curvature_history"]


def test_bad_configs_are_refused():
    _, loss_fn, batch = mlp_problem(0)
    with pytest.raises(ValueError, match="every=0"):
        Curvature(batch, loss_fn, every=0)
    with pytest.raises(ValueError, match="3 equal micro-batches"):
        Curvature(batch, loss_fn, micro_batches=3)
    for bad in (0, -4, 2.0, True, "16"):
        with pytest.raises(ValueError, match=rf"rank_batch_size={bad!r} must be a positive integer"):
            Curvature(batch, loss_fn, rank_batch_size=bad)
    with pytest.raises(ValueError, match="micro_batches=2 and rank_batch_size=16: each asks .* give one"):
        Curvature(batch, loss_fn, micro_batches=2, rank_batch_size=16)
    with pytest.raises(ValueError, match="rank_batch_size=4 and accumulation_batch_size=2: each asks"):
        Curvature(batch, loss_fn, rank_batch_size=4, accumulation_batch_size=2)
    with pytest.raises(ValueError, match=r"accumulation_batch_size=0 must be a positive integer \(training examples"):
        Curvature(batch, loss_fn, accumulation_batch_size=0)
    with pytest.raises(ValueError, match="micro_batches=2 and accumulation_batch_size=4: each asks"):
        Curvature(batch, loss_fn, micro_batches=2, accumulation_batch_size=4)
    # said when built, not at the first measurement `every` steps into training, in torch's words
    with pytest.raises(ValueError, match=r"seed='a' must be an integer from -2\*\*63 to 2\*\*64 - 1 \(a random seed\)"):
        Curvature(batch, loss_fn, seed="a")


def test_micro_batches_too_small_for_batch_norms_are_refused_at_construction():
    """One example per micro-batch: torch refuses a training BatchNorm1d's statistics over it, so the monitor
    says so when it is built, not at the first measurement, and the check leaves the model as it was; a
    model without batch norms, or micro-batches of two, measure."""
    _, loss_fn, batch = mlp_problem(0)
    torch.manual_seed(0)
    with_norm = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()
    before = copy.deepcopy(with_norm.state_dict())
    opt = torch.optim.SGD(with_norm.parameters(), lr=0.1)
    with pytest.raises(ValueError):  # the oracle: torch itself refuses one example
        copy.deepcopy(with_norm)(batch[0][:1])
    message = r"micro_batches=20 cuts the batch into micro-batches of 1 example\(s\), .* batch norm '1' \(BatchNorm1d"
    with pytest.raises(ValueError, match=message):
        Monitor(with_norm, opt, curvature=Curvature(batch, loss_fn, micro_batches=20))
    assert all(torch.equal(before[k], v) for k, v in with_norm.state_dict().items())
    for model, parts in ((with_norm, 10), (mlp_problem(0)[0], 20)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        monitor = Monitor(model, opt, curvature=Curvature(batch, loss_fn, every=1, micro_batches=parts))
        assert "noise_scale" in train(model, opt, monitor, loss_fn, batch, 1)[-1]


def test_a_batch_or_loss_the_products_cannot_take_fails_when_the_monitor_is_built():
    """Not at the first measurement, ``every`` steps into training: a float64 batch on a float32 model meets
    torch's own error (the oracle: the loss function called directly on the model), and a loss that is not a
    scalar our refusal, each with a note saying where; the model is left as it was, and a good batch builds."""
    model, loss_fn, batch = mlp_problem(0)
    model = model.float()
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError) as direct:
        loss_fn(model, batch)
    with pytest.raises(RuntimeError) as built:
        Monitor(model, opt, curvature=Curvature(batch, loss_fn, every=1000))
    assert str(built.value) == str(direct.value)
    assert any("when the monitor was built" in note for note in built.value.__notes__)

    def per_example(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean(1)

    floats = tuple(t.float() for t in batch)
    with pytest.raises(ValueError, match=r"loss_fn returned a tensor of shape \(20,\); it must return the scalar"):
        Monitor(model, opt, curvature=Curvature(floats, per_example, every=1000))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    monitor = Monitor(model, opt, curvature=Curvature(floats, loss_fn, every=1))
    assert "sharpness" in train(model, opt, monitor, loss_fn, floats, 1)[-1]


def test_one_image_per_micro_batch_is_measured_where_torch_accepts_it():
    """A BatchNorm2d normalises over the batch and the pixels: one image of 2 × 2 pixels has 4 values per
    channel, which torch accepts (the oracle), so micro-batches of one image are measured."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 1)).double()
    x, y = torch.randn(4, 1, 4, 4, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    model(x[:1])  # torch's own check passes

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, curvature=Curvature((x, y), loss_fn, every=1, micro_batches=4))
    assert "noise_scale" in train(model, opt, monitor, loss_fn, (x, y), 1)[-1]


def test_noise_over_ranks_needs_a_ddp_model():
    model, loss_fn, batch = mlp_problem(0)
    config = Curvature(batch, loss_fn, rank_batch_size=16)
    with pytest.raises(ValueError, match=r"rank_batch_size=16\).*the model is a Sequential.*micro_batches >= 2"):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), curvature=config)


def test_measuring_curvature_leaves_training_untouched():
    """Same weights, optimizer state and RNG stream with and without the instrument (dropout included, and a
    batch norm's running statistics, which measuring with its batch statistics must neither update nor stop)."""

    def trained(curvature):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 2))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        _, loss_fn, batch = mlp_problem(0)
        batch = tuple(t.float() for t in batch)
        config = Curvature(batch, loss_fn, every=2, trace_probes=2) if curvature else None
        monitor = Monitor(model, opt, every=2, curvature=config)
        train(model, opt, monitor, loss_fn, batch, 6)
        return model.state_dict(), opt.state_dict()["state"], torch.rand(3), model.training

    plain, measured = trained(False), trained(True)
    assert all(torch.equal(plain[0][k], measured[0][k]) for k in plain[0])
    assert all(torch.equal(plain[1][0][k], measured[1][0][k]) for k in plain[1][0])
    assert torch.equal(plain[2], measured[2]) and measured[3]  # RNG stream and train mode restored


def _accumulating_run(model, loss_fn, passes, curvature, clip=None):
    """Adam steps, each accumulating ``len(passes[t])`` backward passes of (loss / n), optionally clipped;
    returns the records and, per step, the passes' own gradients from a copy of the model (the oracle)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    monitor = Monitor(model, opt, every=100, curvature=curvature) if curvature is not None else None
    records, own = [], []
    for step_passes in passes:
        copy_ = copy.deepcopy(model)
        own.append([list(torch.autograd.grad(loss_fn(copy_, b), list(copy_.parameters()))) for b in step_passes])
        opt.zero_grad()
        for b in step_passes:
            (loss_fn(model, b) / len(step_passes)).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        record = monitor.step(0.0) if monitor is not None else None
        records.append(record)
    return records, own


def test_noise_over_the_passes_of_an_accumulated_step_matches_their_own_gradients():
    """``accumulation_batch_size``: the noise scale, |G|², tr(Σ) and the SNR from the passes of each
    measured step equal the estimators written out on those passes' gradients computed one by one; clipping
    after accumulation does not enter; a step of one pass has none; training is untouched."""
    model, loss_fn, (x, y) = mlp_problem(4)
    y = y + 3.0  # an offset the model has not fitted: a gradient signal above the noise, so B_simple > 0
    start = copy.deepcopy(model.state_dict())
    passes = [[(x[i : i + 5], y[i : i + 5]) for i in range(0, 20, 5)]] * 3 + [[(x, y)]] * 2  # 4 passes, then 1
    curvature = Curvature((x, y), loss_fn, every=2, directions=(), accumulation_batch_size=5)
    records, own = _accumulating_run(model, loss_fn, passes, curvature, clip=0.05)
    measured = {r["step"]: r for r in records if r is not None and "sharpness" in r}
    assert sorted(measured) == [2, 4]
    # step 2: the second step's four passes; step 4 took one pass, so no small batches to compare
    assert_accumulated_noise_scale(measured, {2: own[1]}, (2,), 5, rel=1e-9)
    want = noise_scale_by_formula(own[1], 5)
    assert list(measured[2]["curvature"]["snr"].values()) == pytest.approx(want["snr"], rel=1e-9)
    unmonitored = mlp_problem(4)[0]
    unmonitored.load_state_dict(start)
    _accumulating_run(unmonitored, loss_fn, passes, None, clip=0.05)
    for a, b in zip(model.parameters(), unmonitored.parameters(), strict=True):
        assert torch.equal(a, b)


class _Heads(nn.Module):
    """A trunk and three heads, the batch naming the one to use: passes of an accumulated step that differ in
    the parameters they reach (as an expert a micro-batch routed nothing to)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.first, self.second = nn.Linear(3, 6), nn.Linear(6, 2), nn.Linear(6, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x, head):
        return getattr(self, head)(torch.tanh(self.trunk(x)))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_accumulated_noise_counts_a_pass_that_missed_a_parameter_as_zero_and_a_skipped_step_not_at_all(set_to_none):
    """Four passes, the last alone reaching the second head and none the unused one: the noise scale, |G|²,
    tr Σ and SNR equal the estimators written out on the passes' own gradients, 0 where a pass did not reach
    (the oracle), where a NaN had spoilt them all; the unreached head's SNR is NaN. Passes whose optimizer
    step was skipped (a GradScaler's step with infinite gradients) do not leak into the next step's, whether
    ``zero_grad`` frees the gradients or zeroes them."""
    torch.manual_seed(0)
    model = _Heads().double()

    def loss_fn(m, b):
        return nn.functional.mse_loss(m(b[0], b[2]), b[1])

    _, _, (x, y) = mlp_problem(4)
    y = y + 3.0  # a signal above the noise
    passes = [(x[i : i + 5], y[i : i + 5], "first" if i < 15 else "second") for i in range(0, 20, 5)]
    skipped = [(2 * x_, -y_, head) for x_, y_, head in passes]
    copy_ = copy.deepcopy(model)
    params = list(copy_.parameters())
    grads = [torch.autograd.grad(loss_fn(copy_, b), params, allow_unused=True) for b in passes]
    own = [[torch.zeros_like(p) if g is None else g for g, p in zip(gs, params, strict=True)] for gs in grads]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    curvature = Curvature((x, y, "first"), loss_fn, every=1, directions=(), accumulation_batch_size=5)
    monitor = Monitor(model, opt, every=100, curvature=curvature)
    for batches, step in ((skipped, False), (passes, True)):
        opt.zero_grad(set_to_none=set_to_none)
        for b in batches:
            (loss_fn(model, b) / len(batches)).backward()
        if step:
            opt.step()
    record = monitor.step(0.0)
    assert_accumulated_noise_scale({1: record}, {1: own}, (1,), 5, rel=1e-9)
    names = [n for n, _ in model.named_parameters()]
    want = noise_scale_by_formula(own, 5)["snr"]
    snr = record["curvature"]["snr"]
    assert [snr[n] for n in names[:-2]] == pytest.approx(want[:-2], rel=1e-9)
    assert all(math.isnan(snr[n]) for n in names[-2:]) and all(math.isnan(v) for v in want[-2:])


def test_micro_batches_of_a_named_tuple_or_a_mapping_batch_keep_its_type():
    """The noise scale from slices of a namedtuple or a UserDict batch (a 🤗 BatchEncoding is one), or of a dict
    holding a 0-d loss weight too (it was refused as uncuttable), equals McCandlish et al.'s estimators written
    out on each slice's gradient, with the slices as the loss expects."""
    Pair = collections.namedtuple("Pair", "x y")
    model, _, (x, y) = mlp_problem(2)

    def loss_fn(m, b):
        x, y, weight = (b.x, b.y, 1.0) if isinstance(b, tuple) else (b["x"], b["y"], b.get("weight", 1.0))
        return nn.functional.mse_loss(m(x), y) * weight

    passes = []
    for i in range(4):
        model.zero_grad()
        loss_fn(model, Pair(x[5 * i : 5 * i + 5], y[5 * i : 5 * i + 5])).backward()
        passes.append([p.grad.clone() for p in model.parameters()])
    expected = noise_scale_by_formula(passes, 5)["noise_scale"]
    scalar = {"x": x, "y": y, "weight": torch.tensor(1.0, dtype=x.dtype)}  # a 0-d entry goes whole into each slice
    for batch in (Pair(x, y), collections.UserDict({"x": x, "y": y}), scalar):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every measurement at the same θ
        monitor = Monitor(model, opt, curvature=Curvature(batch, loss_fn, every=1, micro_batches=4, directions=()))
        record = train(model, opt, monitor, loss_fn, batch, 1)[-1]
        assert record["noise_scale"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match=r"dtype='float64'; give a floating torch.dtype"):
        Curvature((x, y), loss_fn, dtype="float64")


def test_the_console_header_shows_the_curvature_it_measured_with_or_without_a_threshold():
    """λ₁ against its threshold (Adam), λ₁ alone where the optimizer has none (Lion), tr H and B_simple."""
    from rich.console import Console

    from optiscope.optim import Lion

    model, loss_fn, batch = mlp_problem(0)
    for opt, against in ((torch.optim.Adam(model.parameters(), lr=0.02), "× 38/η"), (Lion(model.parameters()), "")):
        console = Console(file=io.StringIO(), width=400)
        config = Curvature(batch, loss_fn, every=1, trace_probes=2, micro_batches=4)
        monitor = Monitor(model, opt, every=100, sinks=[ConsoleSink(console=console)], curvature=config)
        train(model, opt, monitor, loss_fn, batch, 1)
        header = console.file.getvalue().splitlines()[0]
        assert "λ₁ " in header and "tr H " in header and "B_simple " in header
        assert (against in header) if against else ("×" not in header)


def test_lr_and_threshold_are_those_of_the_step_taken_wherever_the_scheduler_steps():
    """Step t uses lr 0.1/t: its record says 0.1/t and 2/(0.1/t) whether the loop steps the scheduler before
    monitor.step() (optiscope.train, Lightning) or after (the 🤗 callback's order), and the optimizer keeps
    the scheduler's lr; also for a tensor lr, which the scheduler sets in place."""
    for scheduler_first, as_tensor in itertools.product((True, False), (False, True)):
        model, loss_fn, batch = mlp_problem(0)
        opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1) if as_tensor else 0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1 / (epoch + 1))
        monitor = Monitor(model, opt, every=1, curvature=Curvature(batch, loss_fn, every=1, directions=()))
        for t in range(1, 4):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            if scheduler_first:
                schedule.step()
            record = monitor.step(loss)
            if not scheduler_first:
                schedule.step()
            assert record["lr"] == [pytest.approx(0.1 / t)]
            assert record["threshold"] == pytest.approx(2 / (0.1 / t))
            assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.1 / (t + 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_fn": "mse"}, "loss_fn='mse' must be a function"),
        ({"every": True}, "every=True must be an integer >= 1"),
        ({"k": 30, "max_hvps": 20}, "k=30 eigenvalues need max_hvps >= k"),
        ({"tol": "0.01"}, r"tol='0.01' must be a number in \(0, 1\)"),
    ],
)
def test_settings_are_checked_when_the_curvature_is_built(kwargs, message):
    _, loss_fn, batch = mlp_problem(0)
    with pytest.raises(ValueError, match=message):
        Curvature(batch, **{"loss_fn": loss_fn, **kwargs})
