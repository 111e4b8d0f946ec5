"""OptiscopeCallback in a real 🤗 Trainer: u against the parameter change seen by an independent callback."""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("transformers")

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

import optiscope.optim  # noqa: E402
import tiny_hf  # noqa: E402
from optiscope.integrations.transformers import OptiscopeCallback  # noqa: E402

WATCHED = {"gpt2": "transformer.h.0.mlp.c_fc.weight", "qwen2": "model.layers.0.mlp.up_proj.weight"}


class ParameterChange(TrainerCallback):
    """The oracle: the watched weight and its gradient right before each optimizer step, and ‖Δθ‖ after it."""

    def __init__(self, name):
        self.name, self.before, self.u, self.g = name, None, [], []

    def _param(self, model):
        return dict(model.named_parameters())[self.name]

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        p = self._param(model)
        self.before = p.detach().clone()
        self.g.append(float(p.grad.norm()))

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.u.append(float((self._param(model).detach() - self.before).norm()))


def dataset(n=8, length=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, tiny_hf.VOCAB, (n, length), generator=generator)
    return [{"input_ids": x, "labels": x.clone()} for x in ids]


def arguments(out, **overrides):
    options = dict(
        output_dir=str(out),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=1,
        logging_nan_inf_filter=False,
        max_grad_norm=0.05,  # small enough that clipping is active: u must be the clipped step
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    return TrainingArguments(**{**options, **overrides})


def read_records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["gpt2", "qwen2"])
def test_u_is_the_real_update_after_accumulation_and_clipping(kind, tmp_path):
    model = tiny_hf.model(kind)
    oracle = ParameterChange(WATCHED[kind])
    callbacks = [OptiscopeCallback(every=1), oracle]
    if kind == "gpt2":  # both ways of handing the Trainer an optiscope optimizer
        extra = {"optimizers": (optiscope.optim.AdamW(model.parameters(), lr=1e-2), None)}
    else:
        extra = {"optimizer_cls_and_kwargs": (optiscope.optim.AdamW, {"lr": 1e-2})}
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=dataset(), callbacks=callbacks, **extra)
    assert isinstance(trainer.create_optimizer(), optiscope.optim.AdamW)
    trainer.train()
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]  # one record per update step, none per micro-batch
    assert len(oracle.u) == 2
    for record, u, g in zip(records, oracle.u, oracle.g, strict=True):
        entry = record["params"][WATCHED[kind]]
        assert entry["u"] == pytest.approx(u, rel=1e-5)
        assert entry["g"] == pytest.approx(g, rel=1e-5)
    assert records[0]["grad_norm"] == pytest.approx(0.05, rel=1e-4)  # the clipped total gradient norm
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in records] == pytest.approx(logged, rel=1e-5)


def test_nan_loss_stops_training_with_the_diagnosis(tmp_path, caplog):
    model = tiny_hf.model("gpt2")
    callback = OptiscopeCallback(every=1)
    optimizer = optiscope.optim.SGD(model.parameters(), lr=1e30)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=6, gradient_accumulation_steps=1, max_grad_norm=0.0),
        train_dataset=dataset(n=12),
        callbacks=[callback],
        optimizers=(optimizer, None),
    )
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.train()
    assert callback.diverged is not None
    assert trainer.state.global_step == callback.diverged["step"] < 6
    assert any("diverged" in r.getMessage() and "training stops" in r.getMessage() for r in caplog.records)
    last = read_records(tmp_path)[-1]
    assert last["diverged"] and last["reason"] == callback.diverged["reason"]


def test_curvature_reaches_the_monitor_with_the_trainers_optimizer_state(tmp_path):
    """Curvature(...) through the callback: the preconditioned sharpness of the model and AdamW state the
    Trainer ends with, against the threshold formula (2 + 2β₁)/((1 − β₁)η) and a direct measurement."""
    from optiscope.curvature import sharpness
    from optiscope.monitor import Curvature

    def loss_fn(model, batch):
        return model(**batch).loss

    model = tiny_hf.model("gpt2")
    fixed = {key: torch.stack([row[key] for row in dataset(n=4, seed=1)]) for key in ("input_ids", "labels")}
    callback = OptiscopeCallback(every=1, curvature=Curvature(fixed, loss_fn, every=2, directions=(), tol=1e-6))
    optimizer = optiscope.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.999))
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, lr_scheduler_type="constant", max_grad_norm=0.0),
        train_dataset=dataset(),
        callbacks=[callback],
        optimizers=(optimizer, None),
    )
    trainer.train()
    first, second = read_records(tmp_path)
    assert "sharpness" not in first  # every=2: measured on update step 2 only
    assert second["threshold"] == pytest.approx((2 + 2 * 0.8) / ((1 - 0.8) * 1e-2), rel=1e-12)
    model.eval()
    direct = sharpness(model, loss_fn, fixed, optimizer, tol=1e-6, max_hvps=200)
    assert direct["preconditioned"]
    assert second["sharpness"] == pytest.approx(direct["eigenvalues"][0], rel=1e-4)
    assert second["sharpness/threshold"] == pytest.approx(second["sharpness"] / second["threshold"], rel=1e-12)
