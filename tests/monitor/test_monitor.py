"""The monitor's numbers against independent computations, for our optimizers and torch's."""

import json
import math
import re

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
    safe_perplexity,
)
from optiscope.monitor.curvature import DIRECTIONS
from optiscope.monitor.monitor import RECORD_FIELDS
from optiscope.optim import SGD, Adam, AdamW, Lion


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
        # the median is the effective lr at v's median (torch.median: the lower middle value)
        v_median = state["exp_avg_sq"].flatten().median()
        assert got["median"] == pytest.approx((3e-3 / (torch.sqrt(v_median / (1 - 0.95**t)) + 1e-6)).item(), rel=1e-6)


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
    monitor.close()
    assert list(record["params"]) == names == ["weight", "bias", "embedding", "head.weight", "head.bias"]
    assert list(json.loads((tmp_path / "m.jsonl").read_text())["params"]) == names
    assert monitor.embedding is model[0].weight


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
    assert record["step"] == monitor.step_count and record["diverged"] is True
    assert record["exploded_first"] and {"name", "first_step", "growth"} <= set(record["exploded_first"][0])
    assert rec.records[-1] is record and f"diverged at step {record['step']}" in str(info.value)


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
    assert "4 x its lowest value" in record["reason"] and record["exploded_first"]


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
    assert all(row["first_step"] is None for row in record["exploded_first"])
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
    monitor = Monitor(model, opt, every=1000)
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
    assert guard.reason(100, 4e-4, lowest=1e-5, first=2.3) is None  # spiky but far better than the start
    assert guard.reason(100, 5.0, lowest=1.0, first=4.2) is not None
    assert guard.reason(1, math.nan, lowest=math.inf, first=math.nan) == "loss is nan"
    assert guard.reason(100, 5.0, lowest=0.0, first=4.2) is not None  # a loss that reached 0 is still guarded
    assert guard.reason(100, 4.0, lowest=0.0, first=4.2) is None
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
        "exploded_first": calm,
        "curvature_diagnosis": "diverged at step 23; sharpness 1.1× its 3.8/η threshold since step 20",
    }
    message = str(Diverged(record))
    assert message.count("diverged at step 23") == 1 and "sharpness 1.1× its 3.8/η threshold since step 20" in message
    assert "no parameter's u/w exploded (the most: 0.weight, 1x)" in message and "exploded first in" not in message
    record["exploded_first"] = [{"name": "2.weight", "first_step": 18, "growth": 40.0}, *calm]
    assert "u/w exploded first in: 2.weight;" in str(Diverged(record))


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
    assert guard.reason(6, 10.0, 1.0, 1.0) is None and short.reason(6, 10.0, 1.0, 1.0) is not None


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
