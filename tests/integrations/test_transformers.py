"""OptiscopeCallback in a real 🤗 Trainer: u against the parameter change seen by an independent callback."""

from __future__ import annotations

import json
import logging
import math
import os
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

import optiscope.optim  # noqa: E402
import tiny_hf  # noqa: E402
from optiscope.integrations.transformers import OptiscopeCallback  # noqa: E402
from optiscope.monitor import ConsoleSink, DivergenceGuard  # noqa: E402

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
    callbacks = [OptiscopeCallback(out_dir=tmp_path, every=1), oracle]
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


class TupleOutput(torch.nn.Module):
    """A plain module returning (loss, logits), which the Trainer reads as the loss and the rest."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, labels=None):
        out = self.inner(input_ids=input_ids, labels=labels)
        return out.loss, out.logits


def test_a_loss_from_a_tuple_is_read_and_a_loss_the_trainer_computes_itself_is_said_missing(tmp_path, caplog):
    """A model returning a tuple: its first item, as the Trainer takes it (the oracle: the Trainer's logged
    loss). Label smoothing makes the Trainer compute the loss outside the model: records carry None, and a
    warning says so once rather than leaving the guard blind unannounced."""
    trainer = Trainer(
        model=TupleOutput(tiny_hf.model("gpt2")),
        args=arguments(tmp_path / "tuple"),
        train_dataset=dataset(),
        callbacks=[OptiscopeCallback(out_dir=tmp_path / "tuple", every=1)],
    )
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in read_records(tmp_path / "tuple")] == pytest.approx(logged, rel=1e-5)
    smoothed = Trainer(
        model=tiny_hf.model("gpt2"),
        args=arguments(tmp_path / "smoothed", label_smoothing_factor=0.1),
        train_dataset=dataset(),
        callbacks=[OptiscopeCallback(out_dir=tmp_path / "smoothed", every=1)],
    )
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        smoothed.train()
    assert [r["loss"] for r in read_records(tmp_path / "smoothed")] == [None, None]
    said = [r.getMessage() for r in caplog.records if "gave no loss" in r.getMessage()]
    assert len(said) == 1 and "label_smoothing_factor" in said[0]


class PenalisedTrainer(Trainer):
    """Trains on the model's loss plus 0.1·‖θ‖²: what it steps on is not what the model returns."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        loss = loss + 0.1 * sum(p.pow(2).sum() for p in model.parameters())
        return (loss, outputs) if return_outputs else loss


def test_an_overridden_compute_loss_is_said_to_differ_from_the_models_loss(tmp_path, caplog):
    """The model still returns its own loss, which the records carry, while the Trainer trains on and logs
    another (the oracle: the logged loss is the model's plus the penalty, far above it): a warning says so once,
    naming the Trainer's class."""
    trainer = PenalisedTrainer(
        model=tiny_hf.model("gpt2"),
        args=arguments(tmp_path / "penalised"),
        train_dataset=dataset(),
        callbacks=[OptiscopeCallback(out_dir=tmp_path / "penalised", every=1)],
    )
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    recorded = [r["loss"] for r in read_records(tmp_path / "penalised")]
    assert len(logged) == len(recorded) == 2 and all(r < 0.8 * t for r, t in zip(recorded, logged, strict=True))
    said = [r.getMessage() for r in caplog.records if "compute_loss" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("optiscope: PenalisedTrainer overrides the Trainer's compute_loss")


@pytest.mark.parametrize("save_strategy", ["no", "steps", "epoch"])
def test_nan_loss_stops_training_with_the_diagnosis_and_saves_no_diverged_model(save_strategy, tmp_path, caplog):
    """Also where the Trainer saves at every step or at the end of the epoch the stop cuts short (its flow
    callback asks for that save after the step's own was called off): no checkpoint of the diverged step."""
    model = tiny_hf.model("gpt2")
    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    optimizer = optiscope.optim.SGD(model.parameters(), lr=1e30)
    options = dict(max_steps=6, gradient_accumulation_steps=1, max_grad_norm=0.0, save_strategy=save_strategy)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, **options, **({"save_steps": 1} if save_strategy == "steps" else {})),
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
    saved = sorted(int(d.name.split("-")[1]) for d in tmp_path.glob("checkpoint-*"))
    assert all(step < callback.diverged["step"] for step in saved)
    if save_strategy == "steps":
        assert saved == list(range(1, callback.diverged["step"]))  # the good ones are kept


def test_a_divergence_not_read_yet_is_read_before_a_save_which_it_calls_off(tmp_path):
    """Measured at step 1 only and read every 10 steps, the loss that blew up after step 1 is read before the
    Trainer saves at step 3: that save is called off and training stops there, the record naming the step it
    happened at."""
    model = tiny_hf.model("gpt2")
    callback = OptiscopeCallback(out_dir=tmp_path, every=100)
    optimizer = optiscope.optim.SGD(model.parameters(), lr=1e30)
    options = dict(max_steps=6, gradient_accumulation_steps=1, max_grad_norm=0.0, save_strategy="steps", save_steps=3)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, **options),
        train_dataset=dataset(n=12),
        callbacks=[callback],
        optimizers=(optimizer, None),
    )
    trainer.train()
    assert callback.diverged is not None and 1 < callback.diverged["step"] < 3 == trainer.state.global_step
    assert not list(tmp_path.glob("checkpoint-*"))  # the one save, at step 3, called off


def test_curvature_reaches_the_monitor_with_the_trainers_optimizer_state(tmp_path):
    """Curvature(...) through the callback: the preconditioned sharpness of the model and AdamW state the
    Trainer ends with, against the threshold formula (2 + 2β₁)/((1 − β₁)η) and a direct measurement."""
    from optiscope.curvature import sharpness
    from optiscope.monitor import Curvature

    def loss_fn(model, batch):
        return model(**batch).loss

    model = tiny_hf.model("gpt2")
    fixed = {key: torch.stack([row[key] for row in dataset(n=4, seed=1)]) for key in ("input_ids", "labels")}
    callback = OptiscopeCallback(
        out_dir=tmp_path, every=1, curvature=Curvature(fixed, loss_fn, every=2, directions=(), tol=1e-6)
    )
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


class MicroBatchGradients(TrainerCallback):
    """The oracle: the micro-batches the model trains on (seen by a forward pre-hook) and, right before each
    optimizer step, each one's own mean-token-loss gradient at the step's parameters, computed apart
    (``torch.func``, so neither ``.grad`` nor any hook is touched); keyed by the optimizer step."""

    def __init__(self, model):
        self.model, self.seen, self.passes, self.busy = model, [], {}, False
        model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs):
        if module.training and not self.busy:
            self.seen.append({key: kwargs[key].clone() for key in ("input_ids", "labels")})

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        self.busy = True
        try:
            grads = [torch.func.grad(self.loss)(params, batch) for batch in self.seen]
        finally:
            self.busy = False
        self.passes[state.global_step + 1] = [list(g.values()) for g in grads]
        self.seen = []

    def loss(self, params, batch):
        return torch.func.functional_call(self.model, params, (), batch).loss


def test_noise_scale_from_the_accumulated_micro_batches(tmp_path):
    """Curvature(accumulation_batch_size=2) through the callback with gradient_accumulation_steps=2 and
    clipping: B_simple, |G|² and tr Σ of each measured step against the estimators written out on the
    micro-batches' own gradients. Every sequence has the same length and no ignored label, so the Trainer's
    division of each pass's token-sum loss by the tokens of the whole step is the division by 2 the noise
    scale assumes (with unequal token counts |G|² and tr Σ would be approximate; B_simple is a ratio)."""
    from curvature_support import assert_accumulated_noise_scale
    from optiscope.monitor import Curvature

    def loss_fn(model, batch):
        return model(**batch).loss

    model = tiny_hf.model("qwen2")  # no dropout: a micro-batch's gradient is a function of its tokens
    fixed = {key: torch.stack([row[key] for row in dataset(n=4, seed=1)]) for key in ("input_ids", "labels")}
    curvature = Curvature(fixed, loss_fn, every=2, directions=(), accumulation_batch_size=2)
    oracle = MicroBatchGradients(model)
    # tokens from a few ids only, which the fresh model has not learnt: a signal above the noise, so B_simple > 0
    few_tokens = torch.randint(3, 8, (16, 12), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=4, lr_scheduler_type="constant"),
        train_dataset=[{"input_ids": x, "labels": x.clone()} for x in few_tokens],
        callbacks=[OptiscopeCallback(out_dir=tmp_path, every=1, curvature=curvature), oracle],
        optimizers=(optiscope.optim.AdamW(model.parameters(), lr=1e-2), None),
    )
    trainer.train()
    records = {r["step"]: r for r in read_records(tmp_path)}
    assert [len(oracle.passes[step]) for step in (2, 4)] == [2, 2]
    assert_accumulated_noise_scale(records, oracle.passes, (2, 4), 2)


def test_a_resumed_run_continues_the_monitor_as_if_it_had_not_stopped(tmp_path, caplog):
    """The uninterrupted run is the oracle: a run resumed from its checkpoint-2 (a fresh Trainer, model and
    callback) writes the same records for steps 3–6, curvature included (its warm start from step 2's
    eigenvector), and ends with the same monitor state: the guard's reference losses, the sharpness history
    from before the stop; also from a checkpoint outside ``output_dir``, named by
    ``args.resume_from_checkpoint`` as the 🤗 example scripts do. Without the state beside the checkpoint the
    monitor starts afresh and says so."""
    import shutil

    from optiscope.monitor import Curvature
    from support import assert_monitor_resumed

    def loss_fn(model, batch):
        return model(**batch).loss

    fixed = {key: torch.stack([row[key] for row in dataset(n=4, seed=1)]) for key in ("input_ids", "labels")}

    def train(out, resume):
        callback = OptiscopeCallback(out_dir=out, every=1, curvature=Curvature(fixed, loss_fn, every=2, directions=()))
        options = dict(max_steps=6, save_strategy="steps", save_steps=2, lr_scheduler_type="constant")
        trainer = Trainer(
            model=tiny_hf.model("qwen2"),  # no dropout
            args=arguments(
                out, learning_rate=1e-2, resume_from_checkpoint=resume if isinstance(resume, str) else None, **options
            ),
            train_dataset=dataset(n=16),
            callbacks=[callback],
        )
        trainer.train(resume_from_checkpoint=resume)
        return callback.monitor.state_dict(), read_records(out)

    def comparable(record):
        return {k: v for k, v in record.items() if k != "tokens_per_s"}

    whole, records = train(tmp_path / "whole", None)
    assert (tmp_path / "whole" / "checkpoint-2" / "optiscope_monitor.pt").is_file()
    for keep, where in ((True, "checkpoint-2"), (False, "checkpoint-2"), (True, "elsewhere")):
        out = tmp_path / f"resumed-{keep}-{where}"
        copy = out / where if where == "checkpoint-2" else tmp_path / where / "step-2"
        shutil.copytree(tmp_path / "whole" / "checkpoint-2", copy)
        if not keep:
            (copy / "optiscope_monitor.pt").unlink()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="optiscope"):
            state, resumed = train(out, True if where == "checkpoint-2" else str(copy))
        assert [r["step"] for r in resumed] == [3, 4, 5, 6]
        warned = "resuming at step 2 without the monitor's state" in caplog.text
        assert_monitor_resumed(
            state, whole, [comparable(r) for r in resumed], [comparable(r) for r in records[2:]], keep, warned
        )


def test_a_stale_checkpoint_named_in_the_arguments_does_not_hide_the_one_resumed(tmp_path, caplog):
    """``args.resume_from_checkpoint`` names checkpoint-2 (left from an earlier launch) while the Trainer resumes
    from ``output_dir/checkpoint-4``: the monitor takes checkpoint-4's state, the one of the step resumed (the
    oracle: the guard's first loss is the first run's, and no warning)."""

    def train(max_steps, named, resume):
        callback = OptiscopeCallback(out_dir=tmp_path, every=1)
        options = dict(max_steps=max_steps, save_strategy="steps", save_steps=2, resume_from_checkpoint=named)
        trainer = Trainer(
            model=tiny_hf.model("qwen2"),
            args=arguments(tmp_path, **options),
            train_dataset=dataset(n=16),
            callbacks=[callback],
        )
        trainer.train(resume_from_checkpoint=resume)
        return callback.monitor

    first = train(4, None, None)
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        resumed = train(6, str(tmp_path / "checkpoint-2"), True)
    assert "without the monitor's state" not in caplog.text
    assert resumed.first_loss == first.first_loss and resumed.step_count == 6


@pytest.mark.parametrize("fused", [True, False], ids=["torch-fused-adamw", "optiscope-adamw"])
def test_a_step_the_grad_scaler_skips_has_no_record_and_keeps_its_number(fused, tmp_path):
    """The Trainer's own mixed-precision path (Accelerate's GradScaler, here on the CPU) and a first backward
    pass that makes one weight's gradient inf: the first step is skipped (the oracle: no parameter change
    across it); the next two go through. torch's fused AdamW (the Trainer's
    default) is called with the scaler's found_inf and skips inside its kernel, leaving a state at t = 0;
    optiscope's AdamW is not called at all. Either way the Trainer counts the step: the records are steps 2 and
    3, with the real updates and the Trainer's logged losses, none of the skipped step's inf carried over."""
    model = tiny_hf.model("qwen2")
    oracle = ParameterChange(WATCHED["qwen2"])
    extra = {} if fused else {"optimizers": (optiscope.optim.AdamW(model.parameters(), lr=1e-2), None)}
    passes = []

    def first_gradient_inf(grad):
        passes.append(1)
        return torch.full_like(grad, math.inf) if len(passes) == 1 else None

    dict(model.named_parameters())[WATCHED["qwen2"]].register_hook(first_gradient_inf)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=3, max_grad_norm=0.0, optim="adamw_torch_fused"),
        train_dataset=dataset(),
        callbacks=[OptiscopeCallback(out_dir=tmp_path, every=1), oracle],
        **extra,
    )
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    trainer.train()
    inner = trainer.optimizer.optimizer
    assert isinstance(inner, torch.optim.AdamW if fused else optiscope.optim.AdamW)
    assert oracle.u[0] == 0 and all(u > 0 for u in oracle.u[1:])
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [2, 3]
    assert [r["params"][WATCHED["qwen2"]]["u"] for r in records] == pytest.approx(oracle.u[1:], rel=1e-5)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in records] == pytest.approx(logged[1:], rel=1e-5)


@pytest.mark.parametrize("skipped", [None, 4], ids=["default-guard", "guard-skipped-4"])
def test_a_run_whose_grad_scaler_skips_every_step_stops_diverged(skipped, tmp_path):
    """Every backward pass makes one weight's gradient inf, so Accelerate's GradScaler skips every step (the
    oracles: no parameter change at any step, the scale halved at each). The Trainer would count skipped steps
    to ``max_steps`` without a word; the callback stops it at the guard's 32nd skipped step in a row, or at the
    ``skipped``-th of a guard the user gives."""
    model = tiny_hf.model("qwen2")
    oracle = ParameterChange(WATCHED["qwen2"])
    dict(model.named_parameters())[WATCHED["qwen2"]].register_hook(lambda grad: torch.full_like(grad, math.inf))
    callback = OptiscopeCallback(
        out_dir=tmp_path, every=1, **({} if skipped is None else {"guard": DivergenceGuard(skipped=skipped)})
    )
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=40, max_grad_norm=0.0, optim="adamw_torch_fused"),
        train_dataset=dataset(),
        callbacks=[callback, oracle],
    )
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    trainer.train()
    stop = skipped or 32
    assert trainer.state.global_step == stop and oracle.u == [0.0] * stop
    assert trainer.accelerator.scaler.get_scale() == 2.0**16 / 2**stop
    assert callback.diverged["step"] == stop and f"{stop} steps in a row skipped" in callback.diverged["reason"]
    assert read_records(tmp_path)[-1]["reason"] == callback.diverged["reason"]


def test_without_a_guard_a_diverging_run_trains_to_the_end_and_every_step_is_recorded(tmp_path, caplog):
    """``guard=None``: the run of the NaN-loss test above is not stopped (the Trainer's own step count reaches
    ``max_steps``) and each step has its record, with the loss the Trainer logged, non-finite ones too."""
    model = tiny_hf.model("gpt2")
    callback = OptiscopeCallback(out_dir=tmp_path, every=1, guard=None)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=6, gradient_accumulation_steps=1, max_grad_norm=0.0),
        train_dataset=dataset(n=12),
        callbacks=[callback],
        optimizers=(optiscope.optim.SGD(model.parameters(), lr=1e30), None),
    )
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.train()
    assert trainer.state.global_step == 6 and callback.diverged is None
    assert not any("diverged" in r.getMessage() for r in caplog.records)
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and not any(r.get("diverged") for r in records)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert not all(math.isfinite(x) for x in logged)  # the run did diverge
    assert [r["loss"] for r in records] == pytest.approx(logged, rel=1e-5, nan_ok=True)


def test_an_early_warning_reaches_on_warning_and_the_records_through_the_trainer(tmp_path):
    """A lag threshold every Adam step passes, with the Trainer's own AdamW: warned at step 2 (the first with
    Adam's moments), once within the cooldown, handed to ``on_warning`` and recorded at the next measured step
    (5), as with Lightning."""
    from optiscope.monitor import EarlyWarning

    heard = []
    warning = EarlyWarning(loss=None, lag=1e-12, edge=None, cooldown=100)
    callback = OptiscopeCallback(out_dir=tmp_path, every=5, early_warning=warning, on_warning=heard.append)
    trainer = Trainer(
        model=tiny_hf.model("gpt2"),
        args=arguments(tmp_path, max_steps=10, gradient_accumulation_steps=1),
        train_dataset=dataset(n=20),
        callbacks=[callback],
    )
    trainer.train()
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 5, 10]
    assert [(w["step"], w["signal"]) for w in heard] == [(2, "lag")]
    assert [[w["step"] for w in r["warnings"]] for r in records] == [[], [2], []]
    assert records[1]["warning_score"] > 1e-12


def test_the_callbacks_arguments_are_checked_when_it_is_built(tmp_path):
    """Said at once in one line, not when training starts (or, for a guard, as an AttributeError at a step)."""
    with pytest.raises(ValueError, match="OptiscopeCallback: every=0 must be an integer >= 1"):
        OptiscopeCallback(every=0)
    with pytest.raises(TypeError, match=r"OptiscopeCallback: guard=\{'skipped': 4\} must be a DivergenceGuard"):
        OptiscopeCallback(guard={"skipped": 4})
    with pytest.raises(TypeError, match=r"OptiscopeCallback: curvature=10 must be a Curvature\("):
        OptiscopeCallback(curvature=10)
    with pytest.raises(TypeError, match=r"OptiscopeCallback: sinks='metrics.jsonl' must be a list of sinks"):
        OptiscopeCallback(sinks="metrics.jsonl")
    with pytest.raises(TypeError, match=r"OptiscopeCallback: sinks\[0\] is the class ConsoleSink; give a sink"):
        OptiscopeCallback(sinks=[ConsoleSink])
    for folder in (123, ["runs"], "", " "):
        with pytest.raises(TypeError, match=rf"OptiscopeCallback: out_dir={re.escape(repr(folder))} must be a folder"):
            OptiscopeCallback(out_dir=folder)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"OptiscopeCallback: out_dir='.*afile' is a file; give a folder's path"):
        OptiscopeCallback(out_dir=tmp_path / "afile")
    with pytest.raises(TypeError, match=r"OptiscopeCallback: sinks\[1\]=<built-in function print> is not a sink"):
        OptiscopeCallback(sinks=iter([ConsoleSink(), print]))


class _RunsCode:
    """A pickle that would create ``path`` when unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


def test_a_foreign_monitor_state_runs_no_code_and_is_not_taken(tmp_path, caplog):
    """``checkpoint-N/optiscope_monitor.pt`` is read as the Trainer reads the rest of a checkpoint, with
    ``weights_only=True``: a pickle that runs code is refused (its code does not run), and the resume warns
    and starts the monitor afresh; so does a file holding something that is not a monitor's state."""
    from optiscope.integrations.attach import resume
    from optiscope.integrations.transformers import saved_state
    from optiscope.monitor import Monitor

    marker = tmp_path / "ran"
    torch.save({"step_count": 2, "payload": _RunsCode(marker)}, tmp_path / "foreign.pt")
    torch.save({"step_count": 2}, tmp_path / "partial.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    model = torch.nn.Linear(2, 1)
    # each says what it found: a file that is there is never "none was saved"
    found = {
        "foreign.pt": "what was found is not a monitor's state (UnpicklingError: ",
        "partial.pt": "what was found is not a monitor's state",
        "list.pt": "what was found is not a monitor's state",
        "garbage.pt": "what was found is not a monitor's state (",
        "missing.pt": "none was saved",
    }
    for name, why in found.items():
        caplog.clear()
        monitor = Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), sinks=[], start_step=2)
        with caplog.at_level(logging.WARNING, logger="optiscope"):
            resume(monitor, [saved_state(tmp_path / name)], 2, name, rank_zero=True)
        (said,) = caplog.messages
        assert "resuming at step 2 without the monitor's state" in said and f"({why}" in said, (name, said)
        assert monitor.step_count == 2 and math.isnan(monitor.first_loss)
    assert not marker.exists()


@pytest.mark.parametrize("max_grad_norm", [0.05, 0.0], ids=["clipping", "no-clipping"])
def test_the_norm_before_clipping_is_the_one_the_trainer_logs(max_grad_norm, tmp_path):
    """With clipping, each record holds ``grad_norm_before_clip``, the ``grad_norm`` the Trainer itself logs (the
    total norm before clipping), beside the clipped ``grad_norm`` the optimizer used; without clipping there is
    nothing before it, and no such field. The accelerator is left as it was."""
    model = tiny_hf.model("gpt2")
    args = arguments(tmp_path, max_steps=3, max_grad_norm=max_grad_norm)
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset(n=12), callbacks=[OptiscopeCallback(out_dir=tmp_path, every=1)]
    )
    trainer.train()
    records = read_records(tmp_path)
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(records) == len(logged) == 3
    if max_grad_norm:
        assert [r["grad_norm_before_clip"] for r in records] == pytest.approx(logged, rel=1e-5)
        assert [r["grad_norm"] for r in records] == pytest.approx([max_grad_norm] * 3, rel=1e-4)
        assert min(logged) > max_grad_norm  # clipping was active
    else:
        assert not any("grad_norm_before_clip" in r for r in records)
        assert [r["grad_norm"] for r in records] == pytest.approx(logged, rel=1e-5)
    assert "clip_grad_norm_" not in vars(trainer.accelerator)


def noisy_classification(n, seed, noise=0.3):
    """Sequences whose class is their first token mod 4, with a share ``noise`` of the labels drawn at random."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, tiny_hf.VOCAB, (n, 12), generator=generator)
    labels = torch.where(
        torch.rand(n, generator=generator) < noise, torch.randint(0, 4, (n,), generator=generator), ids[:, 0] % 4
    )
    return [{"input_ids": x, "labels": y} for x, y in zip(ids, labels, strict=True)]


def test_a_run_diverging_from_its_first_steps_stops_at_the_first_judged_step(tmp_path, caplog):
    """AdamW at η = 10 (the Trainer's own) on a tiny GPT-2: the loss the Trainer logs runs up from 4.5 at once. The
    default guard judges from the 9th step, where the median of the 9 logged losses is above 4x the lowest of the
    first loss and those medians (computed here from the Trainer's log); the run stops there, long before its 20
    steps (a 20-step warm-up let it run to the end)."""
    import statistics

    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    args = arguments(tmp_path, max_steps=20, gradient_accumulation_steps=1, max_grad_norm=1.0, learning_rate=10.0)
    trainer = Trainer(model=tiny_hf.model("gpt2"), args=args, train_dataset=dataset(n=40), callbacks=[callback])
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == callback.diverged["step"] == len(logged) == 9
    assert statistics.median(logged) > 4 * logged[0] and all(math.isfinite(x) for x in logged)
    assert "diverged at step 9" in caplog.text


def first_trip(losses, warmup, factor=4.0, window=9):
    """The step at which the median of the last ``window`` losses first exceeds ``factor`` times the lowest such
    median (the first loss counting as one) and the first loss, after ``warmup`` steps: the guard's rule as the
    README states it, written out over a list."""
    lowest = first = losses[0]
    for step in range(window, len(losses) + 1):
        level = float(np.median(losses[step - window : step]))
        lowest = min(lowest, level)
        if step > warmup and level > factor * lowest and level > first:
            return step
    return None


@pytest.mark.parametrize("seed", range(4))
def test_judging_from_the_ninth_step_stops_no_noisy_run_that_a_20_step_warm_up_would_let_run(seed, tmp_path):
    """A classifier on batches of one with 30 % random labels, at η = 3e-2: a batch's loss jumps from near 0 to
    more than 4x the lowest so far and above the first within the first 25 steps (a rule judging each step's loss
    would stop it there). The callbacks' guard, judging the median of 9 from the 9th step, stops a run exactly
    where the rule written out over the Trainer's logged losses says, and never where a 20-step warm-up would
    not have (one of these seeds, 3, is stopped at step 28 by either: the guard's own false alarm, not the
    warm-up's)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=tiny_hf.VOCAB, n_positions=64, n_embd=16, n_layer=1, n_head=2, num_labels=4)
    model = GPT2ForSequenceClassification(config)
    callback = OptiscopeCallback(out_dir=tmp_path, every=10)
    options = dict(max_steps=100, per_device_train_batch_size=1, gradient_accumulation_steps=1, learning_rate=3e-2)
    args = arguments(tmp_path, **options, max_grad_norm=1.0, seed=seed, data_seed=seed)
    trainer = Trainer(model=model, args=args, train_dataset=noisy_classification(100, seed), callbacks=[callback])
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    jumps = [i for i in range(1, 25) if logged[i] > 4 * min(logged[:i]) and logged[i] > logged[0]]
    assert jumps  # noisy enough that one step's loss looks like divergence, early on
    stopped = None if callback.diverged is None else callback.diverged["step"]
    assert stopped == first_trip(logged, warmup=0)
    assert stopped == first_trip(logged, warmup=20)
    assert stopped is None or stopped > 20


class OutOfMemoryOnce(torch.nn.Module):
    """A model whose forward raises the CPU allocator's out-of-memory error once, at the ``at``-th training call."""

    def __init__(self, model, at):
        super().__init__()
        self.model, self.at, self.calls = model, at, 0

    def forward(self, input_ids, labels, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes.")
        return self.model(input_ids=input_ids, labels=labels, **kwargs)


def test_training_started_again_after_running_out_of_memory_is_recorded(tmp_path):
    """``auto_find_batch_size``: 🤗 starts training again from step 0 with half the batch when it runs out of
    memory, here at the 4th forward pass (after 3 recorded steps). That new start is the run: its records are the
    steps and losses the Trainer logs for it, at the smaller batch."""
    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    args = arguments(tmp_path, max_steps=4, gradient_accumulation_steps=1, auto_find_batch_size=True)
    model = OutOfMemoryOnce(tiny_hf.model("gpt2"), at=4)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(n=16), callbacks=[callback])
    trainer.train()
    assert trainer.state.train_batch_size == 1 and model.calls == 8
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["loss"] for r in records] == pytest.approx(logged, rel=1e-5)


def test_two_callbacks_and_a_training_that_raised_leave_the_accelerator_as_they_found_it(tmp_path):
    """Two callbacks on one Trainer (the files and a console) are released in the order they were added, and a
    training that raised (🤗 tells no callback) is trained again: the accelerator's ``clip_grad_norm_`` is its
    class's own again each time, and each record's norm before clipping is the ``grad_norm`` the Trainer logs."""
    files = OptiscopeCallback(out_dir=tmp_path, every=1)
    console = OptiscopeCallback(every=1, sinks=[ConsoleSink(every=100)], prefix="console")
    args = arguments(tmp_path, max_steps=3, gradient_accumulation_steps=1)
    trainer = Trainer(model=tiny_hf.model("gpt2"), args=args, train_dataset=dataset(n=12), callbacks=[files, console])
    trainer.train()
    assert "clip_grad_norm_" not in vars(trainer.accelerator)
    model = OutOfMemoryOnce(tiny_hf.model("gpt2"), at=2)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(n=12), callbacks=[files])
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        trainer.train()
    assert "clip_grad_norm_" in vars(trainer.accelerator)  # the premise: nothing undid it
    trainer.train()
    assert "clip_grad_norm_" not in vars(trainer.accelerator)
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["grad_norm_before_clip"] for r in records] == pytest.approx(logged[-3:], rel=1e-5)


def test_a_noise_scale_from_accumulation_without_accumulation_is_refused_in_one_line(tmp_path):
    """``Curvature(accumulation_batch_size=2)`` takes the noise scale from the backward passes of each step; with
    ``gradient_accumulation_steps=1`` every step has one and every record would silently lack it: refused in one
    line naming both settings, before anything is hooked or written."""
    from optiscope.monitor import Curvature

    def loss_fn(model, batch):
        return model(**batch).loss

    fixed = {key: torch.stack([row[key] for row in dataset(n=4, seed=1)]) for key in ("input_ids", "labels")}
    callback = OptiscopeCallback(
        out_dir=tmp_path, every=1, curvature=Curvature(fixed, loss_fn, every=2, accumulation_batch_size=2)
    )
    trainer = Trainer(
        model=tiny_hf.model("qwen2"),
        args=arguments(tmp_path, gradient_accumulation_steps=1),
        train_dataset=dataset(),
        callbacks=[callback],
    )
    with pytest.raises(
        ValueError,
        match=r"^OptiscopeCallback: Curvature\(accumulation_batch_size=2\).*"
        r"gradient_accumulation_steps=1 takes one per step[^\n]*$",
    ):
        trainer.train()
    assert callback.monitor is None and not (tmp_path / "metrics.jsonl").exists()
