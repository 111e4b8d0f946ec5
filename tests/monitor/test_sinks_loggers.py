"""LoggerSink into real loggers (a SummaryWriter, MLflow's file store, W&B offline), read back with their own
readers against the monitor's records; and the console's word on an effective learning rate it cannot give."""

import math

import pytest
import torch
from rich.console import Console
from test_monitor import tiny_lm, train_step

from integrations.loggers import mlflow_metrics, tensorboard_scalars, wandb_history
from optiscope.monitor import ConsoleSink, LoggerSink, Monitor, flat_metrics


def _train(sinks, steps=4, every=2, optimizer=None):
    model, data = tiny_lm()
    opt = optimizer(model.parameters()) if optimizer else torch.optim.Adam(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, every=every, sinks=sinks)
    records = []
    for _ in range(steps):
        loss = train_step(model, opt, data)
        opt.step()
        if record := monitor.step(loss):
            records.append(record)
    monitor.close()
    return records


def _assert_logged(logged, records, prefix="optiscope/", **flat_options):
    """Every flat metric of every record, at the record's step, and no other key of ours."""
    expected = {}
    for record in records:
        for key, value in flat_metrics(record, **flat_options).items():
            expected.setdefault(prefix + key.split("/", 1)[1], {})[record["step"]] = value
    ours = {key: steps for key, steps in logged.items() if key.startswith(prefix)}
    assert ours.keys() == expected.keys()
    for key, steps in expected.items():
        assert ours[key].keys() == steps.keys(), key
        assert list(ours[key].values()) == pytest.approx(list(steps.values()), rel=1e-6, nan_ok=True), key


def test_a_summary_writer_with_a_one_line_lambda(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb")
    sink = LoggerSink(lambda metrics, step: [writer.add_scalar(k, v, step) for k, v in metrics.items()])
    records = _train([sink])
    writer.close()
    assert [r["step"] for r in records] == [1, 2, 4]
    _assert_logged(tensorboard_scalars(tmp_path / "tb"), records)


def test_mlflow_log_metrics_into_a_local_file_store(tmp_path, monkeypatch):
    import mlflow

    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run():
        records = _train([LoggerSink(mlflow.log_metrics, per_parameter="*.bias")])
    _assert_logged(mlflow_metrics(uri), records, per_parameter="*.bias")
    assert "optiscope/u_over_w/4.bias" in flat_metrics(records[0], per_parameter="*.bias")


def test_wandb_log_offline(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # dir= and a teardown: wandb keeps its first run's settings for the process, a Trainer's test's included
    run = wandb.init(project="optiscope-test", dir=str(tmp_path), mode="offline")
    try:
        records = _train([LoggerSink(wandb.log, prefix="probe")])
    finally:
        run.finish()
        wandb.teardown()
    _assert_logged(wandb_history(tmp_path), records, prefix="probe/")


def test_a_bad_log_or_option_is_refused_when_the_sink_is_built():
    with pytest.raises(TypeError, match=r"^LoggerSink: log='wandb' must be a function called as log\(metrics, step\)"):
        LoggerSink("wandb")
    with pytest.raises(ValueError, match=r"^LoggerSink: prefix='my run' must be a name"):
        LoggerSink(print, prefix="my run")
    with pytest.raises(ValueError, match=r"^LoggerSink: per_parameter=0 must be True, False"):
        LoggerSink(print, per_parameter=0)


class PlainSGD(torch.optim.Optimizer):
    """An optimizer optiscope does not know: its effective learning rate cannot be read."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_the_console_says_once_why_an_effective_learning_rate_is_unknown():
    console = Console(width=200, record=True, color_system=None)
    records = _train([ConsoleSink(console)], optimizer=lambda ps: PlainSGD(ps, lr=0.1))
    text = console.export_text()
    why = records[0]["params"]["0.weight"]["no_eff_lr"]
    assert "PlainSGD" in why and text.count(f"no lr_eff: {why}") == 1
    assert len(records) == 3 and "lr_eff=" not in text
    assert not math.isnan(records[0]["total"]["u_over_w"])
