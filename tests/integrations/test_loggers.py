"""optiscope's records in the user's own loggers, through the 🤗 Trainer's ``report_to`` and Lightning's
``trainer.loggers``, read back from each logger's own files with its own reader; and optiscope's files only where
the user wants them."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("lightning")

import lightning  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import tiny_hf  # noqa: E402
from integrations.loggers import mlflow_metrics, tensorboard_scalars, wandb_history  # noqa: E402
from optiscope.integrations import lightning as optiscope_lightning  # noqa: E402
from optiscope.integrations import transformers as optiscope_transformers  # noqa: E402
from optiscope.monitor import flat_metrics  # noqa: E402

MAX_GRAD_NORM = 0.05


def read_records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def expected(records, rename=lambda key: key, **flat_options):
    """``{key: {step: value}}`` that a logger should hold: each record's flat metrics at its step."""
    out = {}
    for record in records:
        for key, value in flat_metrics(record, **flat_options).items():
            out.setdefault(rename(key), {})[record["step"]] = value
    return out


def assert_holds(logged, wanted, step_shift=0, prefix="optiscope"):
    """``logged``'s keys with ``prefix`` are exactly ``wanted``'s, each at its steps (plus ``step_shift``), with
    its values."""
    ours = {key: steps for key, steps in logged.items() if key.split("/")[int(key.startswith("train/"))] == prefix}
    assert ours.keys() == wanted.keys()
    for key, steps in wanted.items():
        assert sorted(ours[key]) == [step + step_shift for step in sorted(steps)], key
        got = [ours[key][step + step_shift] for step in sorted(steps)]
        assert got == pytest.approx([steps[step] for step in sorted(steps)], rel=1e-6), key


# --- 🤗 Trainer -------------------------------------------------------------------------------------------------


def dataset(n=8, length=12):
    ids = torch.randint(3, tiny_hf.VOCAB, (n, length), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": x, "labels": x.clone()} for x in ids]


def hf_trainer(report_to, callbacks, output_dir=None, max_steps=3):
    args = TrainingArguments(
        output_dir=None if output_dir is None else str(output_dir),
        per_device_train_batch_size=2,
        max_steps=max_steps,
        logging_steps=1,
        max_grad_norm=MAX_GRAD_NORM,
        save_strategy="no",
        report_to=report_to,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return Trainer(model=tiny_hf.model("gpt2"), args=args, train_dataset=dataset(), callbacks=callbacks)


@pytest.mark.parametrize("report_to", ["tensorboard", "mlflow", "wandb"])
def test_the_trainers_report_to_gets_the_metrics_at_its_step(report_to, tmp_path, monkeypatch):
    """What the integration stored, read back with its own reader, holds each record's flat metrics at the
    Trainer's step (the records: ``output_dir/optiscope/metrics.jsonl``); the Trainer's own log of every step
    is still there; its ``grad_norm`` (before clipping) is ours ``grad_norm_before_clip``, not the clipped one."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    trainer = hf_trainer(report_to, [optiscope_transformers.OptiscopeCallback(every=1)], out)
    trainer.train()
    if report_to == "tensorboard":
        logged = tensorboard_scalars(out / "runs")
    elif report_to == "mlflow":
        logged = mlflow_metrics(f"file:{tmp_path / 'mlruns'}")
    else:
        import wandb

        wandb.finish()
        wandb.teardown()  # the next test's wandb.init starts from its own settings
        logged = wandb_history(tmp_path, step_key="train/global_step")
    records = read_records(out / "optiscope")
    assert [r["step"] for r in records] == [1, 2, 3]
    # 🤗's TensorBoard and W&B integrations put train/ before every key of a training log, theirs and ours
    rename = (lambda key: key) if report_to == "mlflow" else (lambda key: f"train/{key}")
    assert_holds(logged, expected(records, rename))
    history = trainer.state.log_history
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3]  # the Trainer's own log of each step
    before = [h["grad_norm"] for h in history if "grad_norm" in h]
    ours = [h["optiscope/grad_norm_before_clip"] for h in history if "optiscope/grad_norm_before_clip" in h]
    assert ours == pytest.approx(before, rel=1e-5) and min(before) > 2 * MAX_GRAD_NORM
    after = [h["optiscope/grad_norm_after_clip/total"] for h in history if "optiscope/loss" in h]
    assert after == pytest.approx([MAX_GRAD_NORM] * 3, rel=1e-4)
    assert not list((out / "runs").rglob("metrics.jsonl")) if report_to == "tensorboard" else True


def test_report_to_none_leaves_no_file_of_ours(tmp_path, monkeypatch):
    """No logger and no ``out_dir``: the monitor measures (``callback.monitor.last_record``), and nothing of ours is
    written anywhere under the working directory, where the Trainer's default ``output_dir`` is."""
    monkeypatch.chdir(tmp_path)
    callback = optiscope_transformers.OptiscopeCallback(every=1)
    hf_trainer("none", [callback]).train()
    assert callback.monitor.last_record["step"] == 3
    assert not [p for p in tmp_path.rglob("*") if "optiscope" in p.name or p.name in {"metrics.jsonl", "tensorboard"}]


def test_two_callbacks_in_one_trainer_each_under_its_own_prefix(tmp_path):
    """Each callback's records reach the Trainer's log under its own prefix (totals for one, per parameter for the
    other), each into its own default folder; two with one prefix are refused in one line."""
    totals = optiscope_transformers.OptiscopeCallback(every=1)
    embedding = optiscope_transformers.OptiscopeCallback(every=2, per_parameter="*.wte.*", prefix="embedding")
    trainer = hf_trainer("tensorboard", [totals, embedding], tmp_path)
    trainer.train()
    logged = {}
    for h in trainer.state.log_history:
        for key, value in h.items():
            logged.setdefault(key, {})[h["step"]] = value
    assert_holds(logged, expected(read_records(tmp_path / "optiscope")))
    wanted = expected(read_records(tmp_path / "embedding"), per_parameter="*.wte.*", prefix="embedding")
    assert "embedding/u_over_w/transformer.wte.weight" in wanted and sorted(wanted["embedding/loss"]) == [1, 2]
    assert_holds(logged, wanted, prefix="embedding")
    twice = [optiscope_transformers.OptiscopeCallback(), optiscope_transformers.OptiscopeCallback(every=2)]
    with pytest.raises(ValueError, match=r"^OptiscopeCallback: two callbacks in one Trainer with prefix='optiscope'"):
        hf_trainer("none", twice, tmp_path / "twice").train()


def test_a_second_run_into_a_folder_with_records_is_refused(tmp_path):
    """A new run into the folder of an earlier run's records would mix them (or drop them): refused in one line
    naming the folder, the earlier records untouched. The same callback trained again (🤗 restarts after
    running out of memory with ``auto_find_batch_size``) is the same run: it goes on there."""
    first = optiscope_transformers.OptiscopeCallback(out_dir=tmp_path / "records", every=1)
    hf_trainer("none", [first], tmp_path / "a", max_steps=2).train()
    kept = (tmp_path / "records" / "metrics.jsonl").read_text()
    again = optiscope_transformers.OptiscopeCallback(out_dir=tmp_path / "records", every=1)
    said = re.escape(repr(str(tmp_path / "records"))) + r" holds the records of an earlier run \(metrics.jsonl\)"
    with pytest.raises(ValueError, match=rf"^OptiscopeCallback: {said}; give out_dir= a folder of its own[^\n]*$"):
        hf_trainer("none", [again], tmp_path / "b", max_steps=2).train()
    assert (tmp_path / "records" / "metrics.jsonl").read_text() == kept
    hf_trainer("none", [first], tmp_path / "a", max_steps=3).train()
    assert [r["step"] for r in read_records(tmp_path / "records")] == [1, 2, 3]


# --- Lightning --------------------------------------------------------------------------------------------------


class Logged(lightning.LightningModule):
    """A regression that logs its loss at every step, as a user's module does: the logger's own curve."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def regression_data():
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def lightning_trainer(root, callbacks, logger, max_steps=4, **options):
    return lightning.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=callbacks,
        **{"enable_checkpointing": False, **options},
    )


def csv_metrics(path):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value != "":
                    out.setdefault(key, {})[int(row["step"])] = float(value)
    return out


@pytest.mark.parametrize("kind", ["csv", "tensorboard", "mlflow"])
def test_every_lightning_logger_gets_the_metrics_at_lightnings_step(kind, tmp_path, monkeypatch):
    """Each logger's files hold each record's flat metrics at the step Lightning logs the same batch's
    ``self.log`` at (the oracle: our loss there is the module's own logged loss), with the values in the records
    (``default_root_dir/optiscope/metrics.jsonl``); nothing of ours inside the logger's store."""
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = {
        "csv": lambda: CSVLogger(tmp_path),
        "tensorboard": lambda: TensorBoardLogger(tmp_path),
        "mlflow": lambda: MLFlowLogger(tracking_uri=uri),
    }[kind]()
    callback = optiscope_lightning.OptiscopeCallback(every=1)
    lightning_trainer(tmp_path, [callback], logger).fit(Logged(), regression_data())
    if kind == "csv":
        logged = csv_metrics(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    elif kind == "tensorboard":
        logged = tensorboard_scalars(tmp_path / "lightning_logs")
    else:
        logged = mlflow_metrics(uri)
    records = read_records(tmp_path / "optiscope")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # Lightning's step for a batch counts the optimizer steps before it; a record's step counts its own too
    assert_holds(logged, expected(records), step_shift=-1)
    assert logged["optiscope/loss"] == pytest.approx(logged["train_loss"], rel=1e-6)
    assert [p for p in tmp_path.rglob("metrics.jsonl")] == [tmp_path / "optiscope" / "metrics.jsonl"]


def test_logger_false_leaves_no_file_of_ours(tmp_path, monkeypatch):
    """No logger and no ``out_dir``: the monitor measures, and nothing of ours is written under the working
    directory, Lightning's default root."""
    monkeypatch.chdir(tmp_path)
    callback = optiscope_lightning.OptiscopeCallback(every=1)
    lightning_trainer(None, [callback], False).fit(Logged(), regression_data())
    assert callback.monitor.last_record["step"] == 4
    assert not [p for p in tmp_path.rglob("*") if "optiscope" in p.name or p.name in {"metrics.jsonl", "tensorboard"}]


def test_two_lightning_callbacks_in_one_trainer(tmp_path):
    """Two callbacks (their ``state_key`` told apart by the prefix) each log under their own prefix, keep their
    own folder and their own state in the checkpoint; two with one prefix (or one twice) are refused as the Trainer
    is built, by optiscope's one line naming ``prefix=`` before Lightning's own error, which names nothing a user
    can change ("Found more than one stateful callback …")."""
    from lightning.pytorch.loggers import CSVLogger

    totals = optiscope_lightning.OptiscopeCallback(every=1)
    layers = optiscope_lightning.OptiscopeCallback(every=2, per_parameter=True, prefix="layers")
    trainer = lightning_trainer(tmp_path, [totals, layers], CSVLogger(tmp_path), enable_checkpointing=True)
    trainer.fit(Logged(), regression_data())
    logged = csv_metrics(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    assert_holds(logged, expected(read_records(tmp_path / "optiscope")), step_shift=-1)
    wanted = expected(read_records(tmp_path / "layers"), per_parameter=True, prefix="layers")
    assert "layers/u_over_w/net.2.weight" in wanted and sorted(wanted["layers/loss"]) == [1, 2, 4]
    assert_holds(logged, wanted, step_shift=-1, prefix="layers")
    (saved,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    states = torch.load(saved, weights_only=False)["callbacks"]
    assert states["OptiscopeCallback"]["monitor"]["step_count"] == 4
    assert states["OptiscopeCallback{'prefix': 'layers'}"]["monitor"]["step_count"] == 4
    once = optiscope_lightning.OptiscopeCallback()
    for pair in ([once, optiscope_lightning.OptiscopeCallback(every=5)], [once, once]):
        with pytest.raises(
            ValueError, match=r"^OptiscopeCallback: two callbacks in one Trainer with prefix='optiscope'"
        ):
            lightning_trainer(tmp_path, pair, False)
    with pytest.raises(ValueError, match=r"prefix='layers'; give each its own prefix=") as info:
        lightning_trainer(tmp_path, [layers, optiscope_lightning.OptiscopeCallback(prefix="layers")], False)
    assert "\n" not in str(info.value)


def test_a_second_lightning_run_into_the_default_folder_is_refused(tmp_path):
    """A new run with a logger into the same ``default_root_dir`` would mix its records into the first run's
    ``optiscope/metrics.jsonl``: refused in one line before anything is written."""
    from lightning.pytorch.loggers import CSVLogger

    lightning_trainer(tmp_path, [optiscope_lightning.OptiscopeCallback(every=1)], CSVLogger(tmp_path)).fit(
        Logged(), regression_data()
    )
    again = lightning_trainer(tmp_path, [optiscope_lightning.OptiscopeCallback(every=1)], CSVLogger(tmp_path))
    with pytest.raises(ValueError, match=r"^OptiscopeCallback: '.*optiscope' holds the records of an earlier run"):
        again.fit(Logged(), regression_data())
    assert [r["step"] for r in read_records(tmp_path / "optiscope")] == [1, 2, 3, 4]
