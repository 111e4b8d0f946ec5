"""The monitor's numbers against independent computations, for our optimizers and torch's."""

import copy
import json
import math
import pickle
import re
import warnings

import pytest
import torch
from torch import nn

from optiscope.monitor import (
    ConsoleSink,
    Curvature,
    Diverged,
    DivergenceGuard,
    JSONLSink,
    Monitor,
    TensorBoardSink,
)
from optiscope.monitor.curvature import DIRECTIONS
from optiscope.monitor.divergence import safe_perplexity
from optiscope.monitor.monitor import RECORD_FIELDS
from optiscope.optim import SGD, Adam, AdamW, Lion, RMSprop


class Recorder:
    """A sink that keeps what it is given."""

    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)

    def close(self):
        pass


def tiny_lm(vocab=12, width=8, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Embedding(vocab, width), nn.Flatten(), nn.Linear(3 * width, 16), nn.GELU(), nn.Linear(16, vocab)
    )
    data = torch.randint(0, vocab, (32, 3)), torch.randint(0, vocab, (32,))
    return model, data


def train_step(model, opt, data, scale=1.0):
    x, y = data
    opt.zero_grad()
    loss = nn.functional.cross_entropy(scale * model(x), y)
    loss.backward()
    return loss


OPTIMIZERS = {
    "ours-sgd": lambda ps: SGD(ps, lr=0.1, momentum=0.9),
    "ours-adam": lambda ps: Adam(ps, lr=1e-2),
    "torch-adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "torch-rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_norms_and_update_match_an_independent_computation(name):
    model, data = tiny_lm()
    opt = OPTIMIZERS[name](model.parameters())
    rec = Recorder()
    monitor = Monitor(model, opt, every=3, sinks=[rec])
    for step in range(1, 8):
        loss = train_step(model, opt, data)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        record = monitor.step(loss)
        assert (record is not None) == (step in (1, 3, 6))
        if record is None:
            continue
        assert record["step"] == step and record["loss"] == pytest.approx(loss.item())
        for n, p in model.named_parameters():
            e = record["params"][n]
            delta = p.detach() - before[n]
            assert e["g"] == pytest.approx(torch.linalg.vector_norm(grads[n]).item(), rel=1e-5)
            assert e["w"] == pytest.approx(torch.linalg.vector_norm(p.detach()).item(), rel=1e-5)
            assert e["u"] == pytest.approx(torch.linalg.vector_norm(delta).item(), rel=1e-4)
            cos = torch.nn.functional.cosine_similarity(delta.flatten(), -grads[n].flatten(), dim=0).item()
            assert e["cos"] == pytest.approx(cos, abs=1e-4)
            assert e["u_rms"] == pytest.approx(torch.sqrt(torch.mean(delta.double() ** 2)).item(), rel=1e-4)
        total_u = math.sqrt(sum(record["params"][n]["u"] ** 2 for n in record["params"]))
        assert record["total"]["u"] == pytest.approx(total_u, rel=1e-9)
        assert record["grad_norm"] == pytest.approx(
            torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()])).item(), rel=1e-5
        )


def test_plain_sgd_update_points_down_the_gradient():
    model, data = tiny_lm()
    opt = SGD(model.parameters(), lr=0.05)
    monitor = Monitor(model, opt, every=1)
    loss = train_step(model, opt, data)
    opt.step()
    record = monitor.step(loss)
    for e in record["params"].values():
        assert e["cos"] == pytest.approx(1.0, abs=1e-5)
        assert e["u"] == pytest.approx(0.05 * e["g"], rel=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: Adam(ps, lr=3e-3, betas=(0.8, 0.95), eps=1e-6),
        lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.8, 0.95), eps=1e-6),
    ],
)
def test_effective_lr_is_computed_from_the_state_by_hand(make):
    model, data = tiny_lm()
    opt = make(model.parameters())
    monitor = Monitor(model, opt, every=4)
    for _ in range(4):
        loss = train_step(model, opt, data)
        opt.step()
        record = monitor.step(loss)
    for n, p in model.named_parameters():
        state = opt.state[p]
        t = float(state["step"])
        by_hand = 3e-3 / (torch.sqrt(state["exp_avg_sq"] / (1 - 0.95**t)) + 1e-6)
        got = record["params"][n]["eff_lr"]
        assert got["min"] == pytest.approx(by_hand.min().item(), rel=1e-6)
        assert got["max"] == pytest.approx(by_hand.max().item(), rel=1e-6)
        assert got["median"] == pytest.approx(by_hand.median().item(), rel=1e-6)  # torch's: the lower middle value


def test_no_parameter_copy_outside_measured_steps():
    model, data = tiny_lm()
    opt = SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=5)
    seen = []
    opt.register_step_post_hook(lambda *a: seen.append(monitor._snapshot is not None))
    for _ in range(10):
        loss = train_step(model, opt, data)
        # the pre-hook runs inside step(); just before it, no copy may exist
        assert monitor._snapshot is None
        opt.step()
        monitor.step(loss)
    assert monitor._snapshot is None


def test_param_groups_aggregate_and_names_survive_wrappers():
    model, data = tiny_lm()
    emb, rest = list(model[0].parameters()), [p for p in model.parameters() if p is not model[0].weight]
    opt = AdamW([{"params": emb, "lr": 1e-2}, {"params": rest, "lr": 1e-3}])
    compiled = torch.compile(model, backend="eager")
    monitor = Monitor(compiled, opt, every=1)
    loss = train_step(compiled, opt, data)
    opt.step()
    record = monitor.step(loss)
    assert set(record["params"]) == {n for n, _ in model.named_parameters()}
    assert record["lr"] == [1e-2, 1e-3]
    group0 = record["groups"][0]
    assert group0["u"] == pytest.approx(record["params"]["0.weight"]["u"]) and group0["n"] == 1


@pytest.mark.parametrize("cls", [AdamW, torch.optim.AdamW])
def test_named_parameters_given_to_the_optimizer_name_the_records(cls, tmp_path):
    """torch.optim keeps the names of named parameters in ``param_names``; records and sinks use them,
    also where they differ from the model's (here: a submodule's names, and one chosen by hand)."""
    model, data = tiny_lm()
    head = model[4]
    groups = [
        {"params": list(model[2].named_parameters()), "lr": 1e-3},  # "weight", "bias": names within model[2]
        {"params": [("embedding", model[0].weight), *head.named_parameters(prefix="head")], "lr": 1e-2},
    ]
    opt = cls(groups)
    names = [n for g in opt.state_dict()["param_groups"] for n in g["param_names"]]
    monitor = Monitor(model, opt, every=1, sinks=[JSONLSink(tmp_path / "m.jsonl")], embedding="embedding")
    loss = train_step(model, opt, data)
    opt.step()
    record = monitor.step(loss)
    assert monitor.embedding is model[0].weight
    monitor.close()
    assert list(record["params"]) == names == ["weight", "bias", "embedding", "head.weight", "head.bias"]
    assert list(json.loads((tmp_path / "m.jsonl").read_text())["params"]) == names


def test_a_name_given_twice_falls_back_to_the_models_names():
    model, data = tiny_lm()
    opt = SGD([{"params": list(model[2].named_parameters())}, {"params": list(model[4].named_parameters())}], lr=0.1)
    monitor = Monitor(model, opt, every=1)
    loss = train_step(model, opt, data)
    opt.step()
    assert set(monitor.step(loss)["params"]) == {"2.weight", "2.bias", "4.weight", "4.bias"}


def test_zero_gradient_fraction_and_embedding_rows_follow_frequency():
    """Rows of tokens that never appear get no gradient; Adam moves the rare rows as much as the common."""
    vocab = 10
    model, _ = tiny_lm(vocab=vocab)
    counts = torch.tensor([500, 300, 100, 50, 20, 10, 5, 2, 1, 0])
    g = torch.Generator().manual_seed(0)
    opt = SGD(model.parameters(), lr=0.5)
    monitor = Monitor(model, opt, every=1, embedding="0.weight", token_counts=counts)
    for _ in range(20):
        x = torch.multinomial(counts.float(), 3 * 32, replacement=True, generator=g).view(32, 3)
        loss = train_step(model, opt, (x, torch.randint(0, vocab, (32,), generator=g)))
        opt.step()
        record = monitor.step(loss)
    assert record["params"]["0.weight"]["zero_grad"] > 0  # row 9 never appears
    rows = monitor.row_updates()
    assert rows[9] == 0 and rows[0] > rows[8]
    assert record["embedding"]["spearman_count_vs_update"] > 0.8  # SGD: update size follows frequency


def test_divergence_raises_with_step_and_culprits():
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=5.0)  # far too large
    rec = Recorder()
    monitor = Monitor(model, opt, every=2, sinks=[rec], guard=DivergenceGuard(factor=2.0, warmup=3))
    with pytest.raises(Diverged) as info:
        for _ in range(200):
            loss = train_step(model, opt, data, scale=10.0)
            opt.step()
            monitor.step(loss)
    record = info.value.record
    # the step it tripped at, read (and raised) at the next measured step (every=2) with the losses before it
    assert monitor.step_count == record["step"] + record["step"] % 2 and record["diverged"] is True
    assert rec.records[-1] is record and f"diverged at step {record['step']}" in str(info.value)
    # a culprit is named only where its u/w exploded; the others are ranked by growth over the recorded u/w
    assert all(row["first_step"] is not None for row in record["exploded_first"])
    assert record["exploded_first"] or record["grew_most"]
    measured = [r for r in rec.records if "params" in r]
    for row in record["grew_most"]:
        ratios = [r["params"][row["name"]]["u_over_w"] for r in measured]
        assert row["first_step"] is None and row["growth"] == pytest.approx(ratios[-1] / sorted(ratios[:3])[1])
    growths = [row["growth"] for row in record["grew_most"]]
    assert growths == sorted(growths, reverse=True)


def test_divergence_record_mode_and_nonfinite_weights():
    model, data = tiny_lm()
    opt = SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1, on_divergence="record")
    loss = train_step(model, opt, data)
    with torch.no_grad():
        model[4].bias[0] = math.nan
    opt.step()
    monitor.step(1.0)  # a finite loss: the weights give it away
    assert monitor.diverged["reason"].startswith("non-finite weights in 4.bias")
    assert loss is not None


def word_mlp_lm(seed=0, vocab=2000, width=64, context=8, hidden=256):
    """A word-level MLP language model in the style of Bengio et al. (2003): tanh, no normalisation."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Embedding(vocab, width),
        nn.Flatten(),
        nn.Linear(context * width, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, vocab),
    )


def train_word_mlp_lm(lr, steps, vocab=2000, context=8, batch=1024):
    """Steps of Adam on Zipf-distributed words whose target is a function of the context; returns the
    steps taken (raises Diverged when the guard trips)."""
    torch.set_num_threads(1)  # this model is small enough to be fastest, and steadiest, on one thread
    model = word_mlp_lm()
    zipf = 1 / torch.arange(1, vocab + 1, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    opt = Adam(model.parameters(), lr=lr)
    monitor = Monitor(model, opt, every=10)  # the default guard
    for _ in range(steps):
        x = torch.multinomial(zipf, batch * context, replacement=True, generator=g).view(batch, context)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), 7 * x.sum(1) % vocab)
        loss.backward()
        opt.step()
        monitor.step(loss)
    return monitor.step_count


def test_adam_at_sgds_learning_rate_trips_the_default_guard_on_a_word_level_lm():
    """Seed 003: Adam at SGD's lr = 0.05 blew up a word-level LM. On this small one the loss climbs
    from ln(2000) ≈ 7.6 past 4x that, and the default guard stops it; lr = 1e-3 trains calmly."""
    threads = torch.get_num_threads()
    try:
        assert train_word_mlp_lm(lr=1e-3, steps=100) == 100
        with pytest.raises(Diverged) as info:
            train_word_mlp_lm(lr=0.05, steps=150)
    finally:
        torch.set_num_threads(threads)
    record = info.value.record
    assert 20 < record["step"] < 150 and record["loss"] > 4 * math.log(2000)
    assert "4 x its lowest value" in record["reason"] and record["grew_most"], record


def nan_at(step, monitor, model, opt, x, y, steps=30):
    """Trains ``model`` on (x, y) with a NaN loss at ``step``; returns the Diverged record."""
    with pytest.raises(Diverged) as info:
        for i in range(1, steps + 1):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y) * (math.nan if i == step else 1.0)
            loss.backward()
            opt.step()
            monitor.step(loss)
    return info.value.record


def test_a_large_first_update_that_settles_is_no_explosion():
    """u/w of a linear regression under SGD falls from its first step on (read from the records): no parameter
    is named as having exploded, although the first step's u/w is far above the later ones' median."""
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rec = Recorder()
    monitor = Monitor(model, opt, every=10, sinks=[rec])
    x = torch.randn(256, 16)
    record = nan_at(25, monitor, model, opt, x, x @ torch.randn(16, 1))
    ratios = [r["params"]["weight"]["u_over_w"] for r in rec.records if "params" in r]
    assert ratios[0] > 10 * ratios[1] > 100 * ratios[2]  # the premise: u/w falls steeply
    assert record["exploded_first"] == [] and {row["name"] for row in record["grew_most"]} == {"weight", "bias"}
    assert "no parameter's u/w exploded" in str(Diverged(record))


def test_an_update_ratio_that_jumps_at_the_third_measurement_exploded_there():
    """Early measurements are judged against those before them: a learning rate raised 100-fold for the third
    step makes u/w jump about 100-fold there (the measured records are the oracle)."""
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    rec = Recorder()
    monitor = Monitor(model, opt, every=1, sinks=[rec], on_divergence="record")
    x = torch.randn(64, 16)
    y = x @ torch.randn(16, 1)
    for step in range(1, 4):
        if step == 3:
            opt.param_groups[0]["lr"] = 1e-2
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        monitor.step(loss)
    ratios = [r["params"]["weight"]["u_over_w"] for r in rec.records]
    assert ratios[2] > 10 * max(ratios[:2])
    monitor.diverge(3, 1.0, "by hand")
    assert {r["name"]: r["first_step"] for r in monitor.diverged["exploded_first"]} == {"weight": 3, "bias": 3}


def test_a_float64_loss_below_float32s_range_keeps_the_guard_working():
    """GD on ½w² at η = 0.9 shrinks the loss by 0.01 a step, to 1e-59 (0 in float32); at η = 3.5 = 1.75 × 2/λ
    it then grows 6.25-fold a step. The guard trips once the loss is 4 × its lowest and above the first
    loss, which the float64 losses themselves (the oracle) first are at the step computed here."""
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.9)
    monitor = Monitor(model, opt, every=1000, guard=DivergenceGuard(window=1))  # each step's loss, as the oracle
    x = torch.ones(1, 1, dtype=torch.float64)
    losses = []
    with pytest.raises(Diverged) as info:
        for step in range(1, 400):
            if step == 31:
                opt.param_groups[0]["lr"] = 3.5
            opt.zero_grad()
            loss = 0.5 * (model(x) ** 2).sum()
            losses.append(loss.item())
            loss.backward()
            opt.step()
            monitor.step(loss)
    expected = next(
        i + 1 for i, v in enumerate(losses) if i + 1 > 20 and v > 4 * min(losses[: i + 1]) and v > losses[0]
    )
    assert min(losses) < 1e-50 and info.value.record["step"] == expected
    assert "4 x its lowest value" in info.value.record["reason"]


def test_guard_ignores_noise_near_zero_loss():
    guard = DivergenceGuard(factor=4.0, warmup=0)
    assert guard.reason(100, 4e-4, 4e-4, lowest=1e-5, first=2.3) is None  # spiky but far better than the start
    assert guard.reason(100, 5.0, 5.0, lowest=1.0, first=4.2) is not None
    assert guard.reason(1, math.nan, None, lowest=math.inf, first=math.nan) == "loss is nan"
    assert guard.reason(100, 5.0, 5.0, lowest=0.0, first=4.2) is not None  # a loss that reached 0 is still guarded
    assert guard.reason(100, 4.0, 4.0, lowest=0.0, first=4.2) is None
    with pytest.raises(ValueError, match="factor='4' must be a number > 1"):
        DivergenceGuard(factor="4")


def test_every_field_a_record_can_hold_is_one_a_context_may_not_take():
    """RECORD_FIELDS (what a context may not reuse) against the records themselves, with every optional part on:
    curvature along both directions, its trace and noise scale, tokens/s, the embedding, a divergence."""
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    curvature = Curvature(data, loss_fn, every=1, directions=DIRECTIONS, trace_probes=2, micro_batches=2)
    context = {"run": "a", "seed": 1}
    monitor = Monitor(
        model,
        opt,
        every=1,
        batch_tokens=96,
        histograms=True,
        embedding="0.weight",
        context=context,
        curvature=curvature,
        on_divergence="record",
    )
    records = []
    for _ in range(2):
        loss = train_step(model, opt, data)
        opt.step()
        records.append(monitor.step(loss))
    monitor.diverge(2, 1.0, "by hand")
    written = set().union(*records, monitor.diverged) - context.keys()
    assert {"tokens_per_s", "embedding", "noise_scale", "curvature/gradient", "curvature_diagnosis"} <= written
    assert written <= RECORD_FIELDS, written - RECORD_FIELDS


def test_alarm_growth_and_context_are_checked_when_the_monitor_is_built():
    model, _ = tiny_lm()
    with pytest.raises(ValueError, match=r"context names \['lr'\], fields of the monitor's own records"):
        Monitor(model, SGD(model.parameters(), lr=0.1), context={"run": "a", "lr": 0.1})
    with pytest.raises(ValueError, match="alarm_growth='10' must be a number > 1"):
        Monitor(model, SGD(model.parameters(), lr=0.1), alarm_growth="10")


def test_a_scalar_may_not_overwrite_a_record_or_context_field():
    model, _ = tiny_lm()
    monitor = Monitor(model, SGD(model.parameters(), lr=0.1), context={"run": "a", "eta": 0.1})
    for name in ("grad_norm", "eta"):
        with pytest.raises(ValueError, match=rf"scalars \['{name}'\] would overwrite"):
            monitor.step(1.0, **{name: 2.0})
    assert monitor.step_count == 0  # refused before anything was counted
    for value in ("0.5", [0.5], torch.ones(2), None):
        with pytest.raises(TypeError, match=r"Monitor.step: acc=.* must be a number or a one-element tensor"):
            monitor.step(1.0, acc=value)
    assert monitor.step_count == 0


def test_rewinding_the_sinks_takes_a_checkpoints_step():
    model, _ = tiny_lm()
    monitor = Monitor(model, SGD(model.parameters(), lr=0.1))
    for step, error in (("3", TypeError), (2.0, TypeError), (True, TypeError), (-1, ValueError)):
        with pytest.raises(error, match=rf"rewind_sinks: step={step!r} must be an integer >= 0"):
            monitor.rewind_sinks(step)


def test_safe_perplexity_never_raises():
    assert safe_perplexity(0.0) == 1.0
    assert safe_perplexity(1e6) == math.inf  # math.exp would raise OverflowError here
    assert math.isnan(safe_perplexity(math.nan))
    with pytest.raises(OverflowError):
        math.exp(1e6)


def test_works_with_lion_and_any_optimizer_without_state():
    model, data = tiny_lm()
    opt = Lion(model.parameters(), lr=1e-3)
    monitor = Monitor(model, opt, every=1)
    loss = train_step(model, opt, data)
    opt.step()
    record = monitor.step(loss)
    for n, _ in model.named_parameters():
        # Lion moves every coordinate with a non-zero momentum by exactly lr
        assert record["params"][n]["u_rms"] <= 1e-3 * (1 + 1e-4)  # float32 differences of θ
        assert "eff_lr" not in record["params"][n]


def test_bad_arguments_are_named():
    model, _ = tiny_lm()
    opt = SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="every=0 must be an integer >= 1"):
        Monitor(model, opt, every=0)
    with pytest.raises(ValueError, match="on_divergence='stop' must be 'raise' or 'record'"):
        Monitor(model, opt, on_divergence="stop")
    with pytest.raises(ValueError, match="token_counts has 3 entries but the embedding has 12 rows"):
        Monitor(model, opt, embedding="0.weight", token_counts=[1, 2, 3])
    with pytest.raises(ValueError, match="embedding='emb' is not a parameter name"):
        Monitor(model, opt, embedding="emb")
    # a config of the wrong type is said when the monitor is built, not as an AttributeError at a later step
    with pytest.raises(TypeError, match=r"guard=4 must be a DivergenceGuard\(factor=\.\.\., .*\) or None"):
        Monitor(model, opt, guard=4)
    with pytest.raises(TypeError, match=r"curvature='x' must be a Curvature\(batch, loss_fn, every=\.\.\.\) or None"):
        Monitor(model, opt, curvature="x")


def test_console_line_reads_like_the_seed_log():
    line = ConsoleSink.line(
        "embedding.weight", {"g": 3.1e-5, "w": 1.0, "u": 1.6e-6, "u_over_w": 1.6e-6, "cos": 0.98}, 20
    )
    assert line.startswith("embedding.weight      g=3.1e-05 w=1.0e+00 u=1.6e-06 u/w=1.6e-06 cos=+0.98")


def test_console_collapses_long_tables(capsys):
    from rich.console import Console

    record = {
        "step": 3,
        "loss": 1.0,
        "lr": [0.1],
        "grad_norm": 1.0,
        "total": {"u_over_w": 0.1},
        "params": {f"p{i}": {"g": 1.0, "w": 1.0, "u": i, "u_over_w": float(i), "cos": 1.0} for i in range(20)},
    }
    console = Console(width=200)
    ConsoleSink(console, max_rows=4).write(record)
    out = capsys.readouterr().out
    assert "p19" in out and "p0 " in out and "p10" not in out and "16 more" in out
    ConsoleSink(console, full=True).write(record)
    assert "p10" in capsys.readouterr().out


def test_resumed_monitor_continues_exactly():
    """A monitor restored from state_dict() produces the records an uninterrupted one would."""
    import copy

    def run(split):
        model, data = tiny_lm()
        opt = Adam(model.parameters(), lr=1e-2)
        monitor = Monitor(model, opt, every=2, embedding="0.weight", context={"run": "a"})
        out = []
        for step in range(1, 9):
            if step == split:
                saved = copy.deepcopy(monitor.state_dict())
                monitor.close()
                monitor = Monitor(model, opt, every=2, embedding="0.weight", context={"run": "a"})
                monitor.load_state_dict(saved)
            loss = train_step(model, opt, data)
            opt.step()
            record = monitor.step(loss)
            if record:
                record.pop("tokens_per_s", None)
                out.append(record)
        return out

    straight, resumed = run(split=None), run(split=5)
    assert straight == resumed and straight[-1]["run"] == "a" and straight[-1]["embedding"]["measured_steps"] == 5


def test_an_optimizer_stepped_with_a_closure_is_measured():
    """A closure computes the gradients inside step(), after the pre-hook (Lightning's automatic optimisation)."""
    model, (x, y) = tiny_lm()
    opt = SGD(model.parameters(), lr=0.1)
    recorder = Recorder()
    monitor = Monitor(model, opt, every=1, sinks=[recorder])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    monitor.step(opt.step(closure))
    params = recorder.records[0]["params"]
    assert set(params) == set(before)
    for name, p in model.named_parameters():
        assert params[name]["u"] == pytest.approx(float((p.detach() - before[name]).norm()), rel=1e-6)


def test_the_divergence_message_names_only_parameters_whose_update_ratio_exploded():
    """A parameter whose u/w stayed at its early level is no culprit, and the curvature diagnosis (a sentence
    of its own, starting with the step) does not repeat the step."""
    calm = [
        {"name": "0.weight", "first_step": None, "growth": 1.0},
        {"name": "0.bias", "first_step": None, "growth": 0.9},
    ]
    record = {
        "step": 23,
        "loss": 2.8,
        "reason": "loss 2.8 > 4 x its lowest value",
        "exploded_first": [],
        "grew_most": calm,
        "curvature_diagnosis": "diverged at step 23; sharpness 1.1× its 3.8/η threshold since step 20",
    }
    message = str(Diverged(record))
    assert message.count("diverged at step 23") == 1 and "sharpness 1.1× its 3.8/η threshold since step 20" in message
    assert "no parameter's u/w exploded (the most: 0.weight, 1x)" in message and "exploded first in" not in message
    record["exploded_first"] = [{"name": "2.weight", "first_step": 18, "growth": 40.0}]
    assert "u/w exploded first in: 2.weight;" in str(Diverged(record))
    record["exploded_first"], record["grew_most"] = [], []
    assert "u/w: none measured" in str(Diverged(record))


def plain(value):
    """``value`` with tensors as lists and tuples as lists: comparable with ==."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def test_a_state_dict_does_not_change_as_training_goes_on():
    """A state kept in memory (a best checkpoint, a callback's) must still resume from where it was taken."""
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, embedding="0.weight")
    for _ in range(3):
        loss = train_step(model, opt, data)
        opt.step()
        monitor.step(loss)
    saved = monitor.state_dict()
    taken = plain(saved)
    for _ in range(3):
        loss = train_step(model, opt, data)
        opt.step()
        monitor.step(loss)
    assert plain(saved) == taken and taken["step_count"] == 3


def test_a_measured_step_without_gradients_moves_nothing_and_breaks_nothing():
    """optimizer.step() before any backward is a no-op for torch.optim: the monitor's hook must not fail it."""
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    loss = train_step(model, opt, data)
    opt.step()
    record = monitor.step(loss)
    assert record is not None and record["step"] == 2 and record["grad_norm"] > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": "adam"}, "Monitor: optimizer='adam' is not an optimizer; give a torch.optim.Optimizer"),
        ({"sinks": 5}, "Monitor: sinks=5 must be a list of sinks"),
        ({"sinks": "metrics.jsonl"}, "Monitor: sinks='metrics.jsonl' must be a list of sinks"),
        (
            {"sinks": ["metrics.jsonl"]},
            r"Monitor: sinks\[0\]='metrics.jsonl' is not a sink; a sink has write\(record\)",
        ),
        ({"model": None}, "Monitor: model=None is not an nn.Module; give the model the optimizer trains"),
    ],
)
def test_a_wrong_kind_of_argument_is_named(kwargs, message):
    model, _ = tiny_lm()
    arguments = {"model": model, "optimizer": Adam(model.parameters(), lr=1e-2), **kwargs}
    with pytest.raises(TypeError, match=message):
        Monitor(**arguments)


@pytest.mark.parametrize("loss", ["1.0", True, [1.0]])
def test_a_loss_that_is_not_a_number_or_tensor_is_named(loss):
    """A string or a bool was recorded as the number it converts to; a list failed inside float()."""
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=[])
    train_step(model, opt, data)
    opt.step()
    with pytest.raises(TypeError, match=rf"Monitor.step: loss={re.escape(repr(loss))} must be a number or a tensor"):
        monitor.step(loss)


def test_sinks_given_as_an_iterator_all_receive_the_records(tmp_path):
    """A generator of sinks is checked and kept: checking it must not use it up."""
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, sinks=(JSONLSink(tmp_path / f"{i}.jsonl") for i in range(2)))
    loss = train_step(model, opt, data)
    opt.step()
    monitor.step(loss)
    monitor.close()
    assert [len((tmp_path / f"{i}.jsonl").read_text().splitlines()) for i in range(2)] == [1, 1]


def test_the_guard_within_a_run_cuts_its_warm_up_to_a_tenth_of_a_short_run():
    guard = DivergenceGuard(factor=3.0, first_factor=2.0)
    assert guard.within(1000) == guard  # a long run keeps the 20-step warm-up
    short = guard.within(50)
    assert (short.warmup, short.factor, short.first_factor) == (5, 3.0, 2.0)
    assert guard.reason(6, 10.0, 10.0, 1.0, 1.0) is None and short.reason(6, 10.0, 10.0, 1.0, 1.0) is not None


def test_a_sparse_embeddings_gradient_is_measured_as_its_dense_twins():
    """``nn.Embedding(sparse=True)``: the same g and u as the model with a dense embedding (the oracle, trained
    alike), where torch's foreach norms, which have no sparse kernel, had failed at the first step."""
    ids, y = torch.randint(0, 10, (16, 3), generator=torch.Generator().manual_seed(1)), torch.randn(16, 1)
    records = []
    for sparse in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(10, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        monitor = Monitor(model, opt, every=1, sinks=[])
        for _ in range(2):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(ids), y)
            loss.backward()
            opt.step()
            record = monitor.step(loss)
        records.append(record["params"]["0.weight"])
    for key in ("g", "u", "w"):
        assert records[0][key] == pytest.approx(records[1][key], rel=1e-5), key  # float32, two kernels


@pytest.mark.parametrize("fused", [True, False], ids=["torch-fused-adamw", "optiscope-adamw"])
def test_a_step_a_grad_scaler_skips_is_not_a_step(fused):
    """A GradScaler skips the first step, whose input holds an inf (its gradients are NaN), and lets the next
    two through. torch's fused AdamW is still called, with the scaler's found_inf, and skips inside its kernel,
    leaving a state at t = 0; optiscope's AdamW is not called. Either way ``monitor.step(loss)`` after the
    skipped step uses up its number without judging its NaN loss, the two steps taken are recorded as steps 2
    and 3 with their real updates (the oracle: the parameter change), and no effective learning rate is read
    from the t = 0 state."""
    model, (x, y) = tiny_lm()
    model = nn.Sequential(nn.Linear(3, 3), nn.Flatten(), *list(model)[2:])  # float inputs, which can hold an inf
    x = torch.randn(32, 8, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True) if fused else AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    monitor = Monitor(model, opt, every=1)
    weight = model[2].weight
    records, changes = [], []
    for i in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x if i else x.index_fill(0, torch.tensor([0]), math.inf)), y)
        scaler.scale(loss).backward()
        before = weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        changes.append(float((weight.detach() - before).norm()))
        records.append(monitor.step(loss))
    assert changes[0] == 0 and all(c > 0 for c in changes[1:])
    assert records[0] is None and [r["step"] for r in records[1:]] == [2, 3]  # the loop's own step numbers
    assert [r["params"]["2.weight"]["u"] for r in records[1:]] == pytest.approx(changes[1:], rel=1e-5)
    assert all(math.isfinite(r["params"]["2.weight"]["eff_lr"]["max"]) for r in records[1:])
    assert monitor.diverged is None  # the skipped step's NaN loss is the scaler's to deal with


def _scaled_loop(monitor, model, opt, scaler, inf_at, steps):
    """``steps`` GradScaler steps of ``model`` whose gradients are inf at the steps in ``inf_at`` (1-based);
    returns each step's parameter change (the oracle for which steps the scaler skipped)."""
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    changes = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss * (math.inf if step in inf_at else 1.0)).backward()
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        changes.append(float((model.weight.detach() - before).norm()))
        monitor.step(loss)
    return changes


@pytest.mark.parametrize("fused", [True, False], ids=["torch-fused-adamw", "optiscope-adamw"])
def test_a_run_whose_scaler_skips_every_step_diverges_at_the_guards_count(fused):
    """Gradients that are never finite: the GradScaler skips every step (the oracles: no parameter ever moves,
    and the scaler's scale fell by 2 at each of the 32 steps), and the guard calls the run diverged at the
    32nd skipped step in a row, where it would otherwise skip steps for ever without a word."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True) if fused else AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    monitor = Monitor(model, opt, every=1)
    start = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(Diverged, match=r"diverged at step 32: 32 steps in a row skipped for non-finite gradients"):
        _scaled_loop(monitor, model, opt, scaler, inf_at=range(1, 100), steps=40)
    assert scaler.get_scale() == 2.0**16 / 2**32
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), start, strict=True))
    assert monitor.diverged["step"] == 32 and math.isfinite(monitor.diverged["loss"])
    assert not model.weight.grad.isfinite().any()  # what the scaler saw


def test_a_healthy_start_that_skips_fewer_steps_in_a_row_goes_on():
    """Two streaks of 31 skipped steps, with a step taken between them (the oracle: the parameter change), do
    not add up: the count is of steps skipped since the last step the optimizer took."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = AdamW(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, guard=DivergenceGuard(skipped=31))
    inf_at = set(range(1, 31)) | set(range(32, 62))
    changes = _scaled_loop(monitor, model, opt, torch.amp.GradScaler("cpu", init_scale=1.0), inf_at, steps=65)
    assert [i + 1 for i, c in enumerate(changes) if c > 0] == [31, 62, 63, 64, 65]
    assert monitor.diverged is None and monitor.step_count == 65


def test_the_count_of_skipped_steps_survives_a_resume():
    """A monitor resumed from ``state_dict`` 20 steps into a streak trips where the uninterrupted one does."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    first = Monitor(model, opt, every=1, on_divergence="record")
    _scaled_loop(first, model, opt, scaler, inf_at=range(1, 100), steps=20)
    first.close()
    resumed = Monitor(model, opt, every=1, on_divergence="record")
    resumed.load_state_dict(first.state_dict())
    _scaled_loop(resumed, model, opt, scaler, inf_at=range(1, 100), steps=15)
    assert resumed.diverged["step"] == 32 and first.diverged is None


def test_a_guard_takes_a_count_of_skipped_steps_of_at_least_one():
    with pytest.raises(ValueError, match=r"skipped=0 must be an integer >= 1"):
        DivergenceGuard(skipped=0)


# ---------------------------------------------- frozen and added parameters, precision, copies, arguments
def mlp(seed=0, width=7):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 3))


def by_hand(model, before):
    """g, w, u of every parameter holding a gradient, in float64 from the tensors themselves."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        w = p.detach().double()
        out[name] = {
            "g": p.grad.double().norm().item(),
            "w": w.norm().item(),
            "u": (w - before[name]).norm().item(),
        }
    return out


def snapshot(model):
    return {n: p.detach().double().clone() for n, p in model.named_parameters()}


def train(model, opt, monitor, steps, on_step=None, seed=1):
    torch.manual_seed(seed)
    out = []
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        if on_step is not None:
            on_step(s)
        loss = model(torch.randn(16, 6)).square().mean()
        loss.backward()
        before = snapshot(model)
        opt.step()
        out.append((monitor.step(loss), by_hand(model, before)))
    return out


def test_a_parameter_frozen_with_a_zeroed_grad_is_measured_as_adamw_still_moves_it():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=1, guard=None)

    def freeze_first_layer(s):
        if s == 2:
            model[0].requires_grad_(False)

    for record, oracle in train(model, opt, monitor, 4, freeze_first_layer)[2:]:
        assert oracle["0.weight"]["u"] > 0  # momentum and decay move it
        assert set(record["params"]) == set(oracle)
        for name, expected in oracle.items():
            assert record["params"][name]["u"] == pytest.approx(expected["u"], rel=1e-5)
        total_u = math.sqrt(sum(e["u"] ** 2 for e in oracle.values()))
        assert record["total"]["u"] == pytest.approx(total_u, rel=1e-5)


def test_parameters_added_with_add_param_group_keep_the_models_names():
    model = mlp()
    opt = torch.optim.Adam(model[2].parameters(), lr=1e-2)
    model[0].requires_grad_(False)
    monitor = Monitor(model, opt, every=1, guard=None)
    outside = nn.Parameter(torch.ones(3))  # not the model's: named by its place in the groups

    def unfreeze(s):
        if s == 2:
            model[0].requires_grad_(True)
            opt.add_param_group({"params": list(model[0].parameters()), "lr": 1e-3})
            opt.add_param_group({"params": [outside]})

    def with_outside(s):
        unfreeze(s)
        outside.grad = torch.full((3,), float(s + 1))

    for s, (record, oracle) in enumerate(train(model, opt, monitor, 5, with_outside)[2:], start=2):
        assert set(record["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias", "group2.param0"}
        for name, expected in oracle.items():
            assert record["params"][name]["g"] == pytest.approx(expected["g"], rel=1e-6)
        assert record["params"]["group2.param0"]["g"] == pytest.approx(math.sqrt(3) * (s + 1), rel=1e-6)
        assert len(record["groups"]) == 3


def test_an_added_tensors_name_does_not_depend_on_which_tensors_have_gradients():
    torch.manual_seed(0)
    model = nn.ModuleDict({k: nn.Linear(3, 1) for k in "abc"})
    opt = torch.optim.SGD([*model["a"].parameters(), *model["b"].parameters()], lr=0.1)
    monitor = Monitor(model, opt, every=1, guard=None)
    opt.add_param_group({"params": list(model["c"].parameters())})
    for s in range(2):
        opt.zero_grad(set_to_none=True)
        x = torch.randn(4, 3)
        loss = (model["c"](5 * x) + (model["a"](x) if s == 0 else 0) + model["b"](x)).sum()
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        assert record["params"]["c.weight"]["g"] == pytest.approx(model["c"].weight.grad.norm().item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_norms_agree_with_float64(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 300), nn.Tanh(), nn.Linear(300, 3)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1, guard=None)
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(16, 300, dtype=dtype)).float().square().mean()
        loss.backward()
        before = snapshot(model)
        opt.step()
        oracle, record = by_hand(model, before), monitor.step(loss)
        for name, expected in oracle.items():
            got = record["params"][name]
            assert got["g"] == pytest.approx(expected["g"], rel=2e-5)
            assert got["w"] == pytest.approx(expected["w"], rel=2e-5)
            # u: θ − θ′ is itself rounded to the parameter's dtype
            assert got["u"] == pytest.approx(expected["u"], rel=5e-4)


def test_an_fp16_weight_whose_norm_exceeds_fp16s_range_has_a_finite_norm():
    layer = nn.Linear(1000, 1000).half()
    nn.init.constant_(layer.weight, 100.0)
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    monitor = Monitor(layer, opt, every=1, guard=None)
    layer(torch.randn(2, 1000).half()).float().sum().backward()
    opt.step()
    entry = monitor.step(1.0)["params"]["weight"]
    # the true norm is 100 · 1000; float32 accumulation of a million equal squares is good to ~1e-3
    assert entry["w"] == pytest.approx(layer.weight.double().norm().item(), rel=2e-3)
    assert entry["nonfinite_w"] == 0
    assert entry["u_over_w"] == 0.0


def test_finite_float32_weights_whose_norm_overflows_float32_are_measured_in_float64():
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=1e22)
    monitor = Monitor(layer, opt, every=1, guard=None)
    opt.zero_grad()
    layer(torch.randn(16, 8)).square().mean().backward()
    before = layer.weight.detach().double().clone()
    opt.step()
    entry = monitor.step(1.0)["params"]["weight"]
    w = layer.weight.detach().double()
    assert torch.isfinite(layer.weight).all() and w.norm() > 3.4e38**0.5  # its squares overflow float32
    assert entry["w"] == pytest.approx(w.norm().item(), rel=1e-6)
    assert entry["u"] == pytest.approx((w - before).norm().item(), rel=1e-6)
    assert entry["u_over_w"] == pytest.approx(((w - before).norm() / w.norm()).item(), rel=1e-6)
    assert entry["nonfinite_w"] == 0


def test_a_divergence_diagnosis_says_which_measured_steps_its_growth_spans():
    """Measured every 25 steps: a NaN at step 20 comes after one measured step, which leaves no growth to compare;
    one at step 27 after two, whose steps the sentence names (the oracle: the steps of the records written)."""

    def run(nan_step):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        recorder = Recorder()
        monitor = Monitor(model, opt, every=25, sinks=[recorder])
        record = nan_at(nan_step, monitor, model, opt, torch.randn(32, 4), torch.randn(32, 1))
        return [r["step"] for r in recorder.records if not r.get("diverged")], record

    steps, record = run(20)
    assert steps == [1] and record["exploded_first"] == []
    assert str(Diverged(record)).endswith("no parameter's u/w exploded: only step 1 was measured, no growth to compare")
    steps, record = run(27)
    assert steps == [1, 25] and record["exploded_first"] == []
    assert "no parameter's u/w exploded between the measured steps 1 and 25 (the most: " in str(Diverged(record))


def test_embedding_summary_before_any_row_was_measured_is_none():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert Monitor(model, opt).embedding_summary() is None  # no embedding tracked (it raised TypeError)
    assert Monitor(model, opt, embedding="0.weight").embedding_summary() is None  # tracked, nothing measured yet


def test_a_cosine_whose_dot_product_overflows_float32_is_measured_in_float64():
    """Finite gradients and updates near 1e19: ⟨u, −g⟩ overflows float32 (it read +inf) but is a cosine."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    monitor = Monitor(layer, opt, every=1, guard=None)
    opt.zero_grad()
    (1e19 * layer(torch.randn(16, 8)).sum()).backward()
    g = layer.weight.grad.double().clone()
    before = layer.weight.detach().double().clone()
    opt.step()
    entry = monitor.step(1.0)["params"]["weight"]
    u = layer.weight.detach().double() - before
    assert torch.dot(g.float().reshape(-1), g.float().reshape(-1)).isinf()  # float32 products overflow here
    assert entry["cos"] == pytest.approx(float(torch.dot(u.reshape(-1), -g.reshape(-1)) / (u.norm() * g.norm())))


def test_a_resume_after_the_last_measured_step_keeps_it_in_the_divergence_record():
    def run(resume_at=None):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sink = Recorder()
        monitor = Monitor(model, opt, every=4, sinks=[sink], guard=None, on_divergence="record")

        def maybe_resume(s):
            nonlocal monitor
            if s == resume_at:
                state = monitor.state_dict()
                monitor.close()
                monitor = Monitor(model, opt, every=4, sinks=[sink], guard=None, on_divergence="record")
                monitor.load_state_dict(state)

        torch.manual_seed(1)
        for s in range(26):
            maybe_resume(s)
            opt.zero_grad()
            loss = model(torch.randn(16, 6)).square().mean()
            loss.backward()
            opt.step()
            monitor.step(loss)
        monitor.diverge(monitor.step_count, None, "stopped by the loop")
        return monitor.diverged

    uninterrupted = run()
    assert uninterrupted["last_measured_step"] == 24
    assert run(resume_at=25)["last_measured_step"] == uninterrupted["last_measured_step"]


def test_pickling_or_copying_a_monitor_is_refused_with_what_to_save_instead():
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    monitor = Monitor(model, opt, every=1)
    for copier in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match=r"state_dict\(\)") as info:
            copier((model, opt, monitor))
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match=r"state_dict\(\)") as info:
        copy.copy(monitor)
        assert "\n" not in str(info.value)


def test_record_mode_keeps_the_first_divergence_and_writes_it_once():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Recorder()
    monitor = Monitor(model, opt, every=5, sinks=[sink], on_divergence="record")
    torch.manual_seed(1)
    losses = [1.0, 1.0, math.inf, math.nan, math.inf, math.inf, 1.0]
    for loss in losses:
        opt.zero_grad()
        model(torch.randn(4, 6)).sum().backward()
        opt.step()
        monitor.step(loss)
    assert monitor.diverged["step"] == 3
    assert [r["step"] for r in sink.records if r.get("diverged")] == [3]


def test_step_scalars_reach_tensorboard_as_numbers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1, sinks=[TensorBoardSink(tmp_path)], context={"run": "a", "eta": 0.1})
    given = []
    for s in range(3):
        opt.zero_grad()
        model(torch.randn(2, 6)).sum().backward()
        before = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)  # a tensor, as a loop has it
        opt.step()
        given.append((float(before), 0.5 + s / 10))
        monitor.step(1.0, grad_norm_before_clip=before, val_acc=0.5 + s / 10)
    monitor.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    for tag, column in (("grad_norm_before_clip", 0), ("val_acc", 1)):
        read = [(e.step, e.value) for e in events.Scalars(tag)]
        assert read == [(s + 1, pytest.approx(g[column], rel=1e-6)) for s, g in enumerate(given)]
    assert "eta" not in events.Tags()["scalars"]  # the context is the run's label, not a series


def test_a_scalar_that_requires_grad_is_recorded_without_a_warning():
    """The report guide passes ``mae=(model(x) - y).abs().mean()``, a tensor in the autograd graph: its number is
    recorded (oracle: the same mean without a graph) and torch's warning about a scalar that requires grad, once
    raised on every measured step, is not."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1)
    x = torch.randn(4, 6)
    opt.zero_grad()
    out = model(x)
    out.sum().backward()
    opt.step()
    with torch.no_grad():
        expected = float(out.abs().mean())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record = monitor.step(1.0, mae=out.abs().mean())
    monitor.close()
    assert record["mae"] == pytest.approx(expected, rel=1e-6)


def test_an_optimizer_that_sets_its_own_step_size_is_watched(tmp_path, capsys):
    """🤗 Adafactor's relative step keeps lr=None in its groups: the monitor crashed on float(None). Its records
    now say lr None, every sink takes them, and u/w is the update it really made (oracle: the weights before and
    after each step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers.optimization import Adafactor

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = Adafactor(model.parameters())
    assert opt.param_groups[0]["lr"] is None  # the case at hand
    sinks = [ConsoleSink(), JSONLSink(tmp_path / "m.jsonl"), TensorBoardSink(tmp_path / "tb")]
    monitor = Monitor(model, opt, every=1, sinks=sinks, guard=None)
    for _ in range(3):
        before = model.weight.detach().clone()
        opt.zero_grad()
        loss = model(torch.randn(4, 3)).square().mean()
        loss.backward()
        opt.step()
        record = monitor.step(loss)
        after = model.weight.detach()
        moved = (after - before).norm() / after.norm()  # w: the weights the step left
        assert record["lr"] == [None]
        assert record["params"]["weight"]["u_over_w"] == pytest.approx(float(moved), rel=1e-5)
    monitor.close()
    assert "lr relative" in capsys.readouterr().out
    assert [json.loads(line)["lr"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [[None]] * 3
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "loss" in events.Tags()["scalars"] and not any(t.startswith("lr/") for t in events.Tags()["scalars"])


def linear():
    return nn.Linear(3, 2)


BAD = {
    "start_step=-5": (lambda m, o, tmp: Monitor(m, o, start_step=-5), "start_step=-5"),
    "start_step=2.5": (lambda m, o, tmp: Monitor(m, o, start_step=2.5), "start_step=2.5"),
    "start_step='3'": (lambda m, o, tmp: Monitor(m, o, start_step="3"), "start_step='3'"),
    "embedding='bias'": (lambda m, o, tmp: Monitor(m, o, embedding="bias"), r"2-D matrix, got shape \(2,\)"),
    "ConsoleSink(every=0)": (lambda m, o, tmp: ConsoleSink(every=0), "every=0"),
    "ConsoleSink(max_rows=1)": (lambda m, o, tmp: ConsoleSink(max_rows=1), "max_rows=1"),
    "ConsoleSink(console='x')": (lambda m, o, tmp: ConsoleSink(console="x"), "console='x'"),
    "context=['run']": (lambda m, o, tmp: Monitor(m, o, context=["run"]), r"context=\['run'\]"),
    "context={1: 'x'}": (lambda m, o, tmp: Monitor(m, o, context={1: "x"}), r"context=\{1: 'x'\}"),
    "histograms='no'": (lambda m, o, tmp: Monitor(m, o, histograms="no"), "histograms='no'"),
    "token_counts without embedding": (lambda m, o, tmp: Monitor(m, o, token_counts=[1, 2]), "without embedding"),
    "negative token_counts": (lambda m, o, tmp: Monitor(m, o, embedding="weight", token_counts=[-1, 2]), "-1"),
    "alarm_growth=inf": (lambda m, o, tmp: Monitor(m, o, alarm_growth=math.inf), "alarm_growth=inf"),
    "JSONLSink(directory)": (lambda m, o, tmp: JSONLSink(tmp), "is a directory"),
    "load_state_dict({})": (lambda m, o, tmp: Monitor(m, o).load_state_dict({}), "lacks .*step_count"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_argument_is_named_when_the_object_is_built(case, tmp_path):
    make, message = BAD[case]
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises((TypeError, ValueError), match=message) as info:
        make(model, opt, tmp_path)
    assert "\n" not in str(info.value)


def test_an_empty_loss_is_named_not_judged_a_divergence():
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, opt, every=1, on_divergence="record")
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="empty tensor"):
        monitor.step(torch.tensor([]))
    assert monitor.diverged is None


def lower_median(t):
    flat = t.flatten().sort().values
    return flat[(flat.numel() - 1) // 2].item()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_adam_effective_lr_median_is_torchs_median_of_the_tensor(amsgrad):
    torch.manual_seed(0)
    layer = nn.Linear(3, 2, bias=False)  # 6 entries: the two middle ones differ
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2, amsgrad=amsgrad)
    monitor = Monitor(layer, opt, every=1, guard=None)
    for _ in range(2):
        opt.zero_grad()
        layer(torch.randn(8, 3)).square().mean().backward()
        opt.step()
        record = monitor.step(1.0)
    state, group = opt.state[layer.weight], opt.param_groups[0]
    v = (state["max_exp_avg_sq"] if amsgrad else state["exp_avg_sq"]).double()
    eff = group["lr"] / ((v / (1 - group["betas"][1] ** float(state["step"]))).sqrt() + group["eps"])
    assert record["params"]["weight"]["eff_lr"]["median"] == pytest.approx(lower_median(eff), rel=1e-6)
    assert lower_median(eff) != pytest.approx(eff.flatten().sort().values[3].item(), rel=1e-3)  # a real test


@pytest.mark.parametrize("make", [lambda ps: Adam(ps, lr=1e-2), lambda ps: RMSprop(ps, lr=1e-2)])
def test_our_optimizers_effective_lr_median_is_torchs_median_of_their_effective_lr(make):
    torch.manual_seed(0)
    layer = nn.Linear(3, 2, bias=False)
    opt = make(layer.parameters())
    monitor = Monitor(layer, opt, every=1, guard=None)
    layer(torch.randn(8, 3)).square().mean().backward()
    opt.step()
    record = monitor.step(1.0)
    expected = lower_median(opt.effective_lr(layer.weight).double())
    assert record["params"]["weight"]["eff_lr"]["median"] == pytest.approx(expected, rel=1e-5)


def test_accelerates_optimizer_wrapper_is_measured_through_the_optimizer_it_wraps():
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    try:
        accelerator = accelerate.Accelerator(cpu=True)
        model = mlp()
        model, opt = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-2))
        assert type(opt).__name__ == "AcceleratedOptimizer" and not hasattr(opt, "_optimizer_step_pre_hooks")
        monitor = Monitor(model, opt, every=1, guard=None)
        torch.manual_seed(1)
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(16, 6)).square().mean()
            accelerator.backward(loss)
            before = snapshot(model)
            opt.step()
            oracle, record = by_hand(model, before), monitor.step(loss)
            assert set(record["params"]) == set(oracle)
            for name, expected in oracle.items():
                for key in ("g", "w", "u"):
                    assert record["params"][name][key] == pytest.approx(expected[key], rel=1e-5)
        assert monitor.step_count == int(opt.optimizer.state[model[0].weight]["step"]) == 3
        monitor.close()
    finally:  # the accelerator's state is global: leave none for other tests
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
