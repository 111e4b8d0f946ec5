"""Sinks: JSONL and TensorBoard event files round-trip what the monitor measured."""

import pytest
import torch
from test_monitor import tiny_lm, train_step

from optiscope import runs
from optiscope.monitor import Diverged, DivergenceGuard, JSONLSink, Monitor, TensorBoardSink
from optiscope.optim import Adam


def _train(tmp_path, steps=6, lr=1e-2, scale=1.0, **monitor_kwargs):
    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=lr)
    sinks = [JSONLSink(tmp_path / "metrics.jsonl"), TensorBoardSink(tmp_path / "tb")]
    monitor = Monitor(model, opt, every=2, sinks=sinks, **monitor_kwargs)
    records = []
    try:
        for _ in range(steps):
            loss = train_step(model, opt, data, scale=scale)
            opt.step()
            record = monitor.step(loss)
            if record:
                records.append(record)
    finally:
        monitor.close()
    return records


def test_jsonl_round_trip(tmp_path):
    records = _train(tmp_path)
    assert runs.read_jsonl(tmp_path / "metrics.jsonl") == [runs.to_jsonable(r) for r in records]
    assert [r["step"] for r in records] == [1, 2, 4, 6]


def test_tensorboard_round_trip(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _train(tmp_path)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"loss", "grad_norm", "lr/group0", "total/u_over_w", "u/0.weight", "eff_lr_median/4.bias"} <= set(tags)
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [r["step"] for r in records]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    u = events.Scalars("u/2.weight")
    assert [e.value for e in u] == pytest.approx([r["params"]["2.weight"]["u"] for r in records], rel=1e-6)


def test_divergence_reaches_every_sink(tmp_path):
    with pytest.raises(Diverged):
        _train(tmp_path, steps=300, lr=5.0, guard=DivergenceGuard(factor=2.0, warmup=3), scale=10.0)
    last = runs.read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert last["diverged"] is True and last["step"] > 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert "diverged/text_summary" in events.Tags()["tensors"]


def test_tensorboard_missing_is_a_clear_error(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "torch.utils.tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ImportError, match=r"pip install 'optiscope\[tensorboard\]'"):
        TensorBoardSink(tmp_path)
    assert torch is not None


def test_rewind_drops_what_was_logged_after_the_checkpoint(tmp_path):
    """A resumed run continues after its checkpoint's step: what the interrupted attempt logged later is
    gone from metrics.jsonl (other runs' records stay) and TensorBoard shows each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "metrics.jsonl"
    jsonl = JSONLSink(path)
    for step in (1, 2, 3, 4):
        jsonl.write({"run": "a", "step": step})
        jsonl.write({"run": "b", "step": step})
    jsonl.rewind(2, {"run": "a"})
    assert [(r["run"], r["step"]) for r in runs.read_jsonl(path)] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
        ("b", 2),
        ("b", 3),
        ("b", 4),
    ]

    board = TensorBoardSink(tmp_path / "tb")
    board.rewind(0, {})  # as every run starts: nothing to purge, and no empty events file left behind
    for step, loss in ((1, 5.0), (2, 4.0), (3, 9.0), (4, 9.0)):  # 3 and 4: the attempt that was interrupted
        board.write({"step": step, "loss": loss, "total": {}, "params": {}})
    board.rewind(2, {})
    for step, loss in ((3, 3.0), (4, 2.0)):
        board.write({"step": step, "loss": loss, "total": {}, "params": {}})
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0)]
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2  # the attempt and the resumed one


def _console():
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=250, color_system=None)


def _table_names(text):
    """The parameter names of each printed table, in the order printed."""
    import re

    tables = []
    for line in text.splitlines():
        if line.startswith("step "):
            tables.append([])
        elif found := re.match(r"^  (\S+)\s+g=", line):
            tables[-1].append(found[1])
    return tables


def test_the_console_keeps_the_models_parameter_order_also_when_it_collapses_a_long_table():
    """Ten parameter tensors whose u/w ranks differently at each step: every table lists them in the model's order
    (a layer can be followed from one table to the next), and a collapsed one lists the two largest and the two
    smallest movers, by u/w measured by hand around ``step()``, in that order too."""
    from optiscope.monitor import ConsoleSink

    torch.manual_seed(0)
    widths = [6, 12, 3, 9, 5, 1]
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)))
    order = [name for name, _ in model.named_parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    full, collapsed = _console(), _console()
    sinks = [ConsoleSink(full, full=True), ConsoleSink(collapsed, max_rows=4)]
    monitor = Monitor(model, opt, every=1, sinks=sinks)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    kept, rankings = [], set()
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        ratio = {n: float((p.detach() - before[n]).norm() / p.detach().norm()) for n, p in model.named_parameters()}
        monitor.step(loss)
        by_size = sorted(order, key=lambda n: -ratio[n])
        rankings.add(tuple(by_size))
        kept.append([n for n in order if n in {*by_size[:2], *by_size[-2:]}])
    monitor.close()
    assert any(ranking != tuple(order) for ranking in rankings)  # the case at hand: by u/w, the rows would move
    assert _table_names(full.file.getvalue()) == [order] * 3
    assert _table_names(collapsed.file.getvalue()) == kept
    assert collapsed.file.getvalue().count("⋯ 6 more") == 3


def test_the_scalars_given_to_step_are_on_the_consoles_header_line():
    """``monitor.step(loss, train_acc=0.8)``: the header says each given scalar with its value; the context's
    fields (the same at every step) are not repeated there."""
    from optiscope.monitor import ConsoleSink

    model, data = tiny_lm()
    opt = Adam(model.parameters(), lr=1e-2)
    console = _console()
    monitor = Monitor(model, opt, every=1, sinks=[ConsoleSink(console)], context={"run": "a", "eta": 0.01})
    loss = train_step(model, opt, data)
    opt.step()
    monitor.step(loss, train_acc=0.8, val_loss=torch.tensor(2.3456789), tokens=1024)
    monitor.close()
    (header,) = [line for line in console.file.getvalue().splitlines() if line.startswith("step ")]
    assert header.endswith(" │ train_acc 0.8 │ val_loss 2.346 │ tokens 1024"), header
    assert "eta" not in header and "run" not in header
