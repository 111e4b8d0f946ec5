"""OptiscopeCallback in a real Lightning Trainer: u against the parameter change seen by an independent callback."""

from __future__ import annotations

import copy
import json
import logging
import math

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")

import lightning  # noqa: E402

import optiscope.optim  # noqa: E402
from optiscope.integrations.lightning import OptiscopeCallback  # noqa: E402
from optiscope.monitor import DivergenceGuard, EarlyWarning  # noqa: E402

ACCUMULATE, CLIP = 2, 0.05


class Regression(lightning.LightningModule):
    """A two-layer regression; in manual mode it accumulates and clips by itself, as Lightning's docs show."""

    def __init__(self, automatic):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.automatic_optimization = automatic
        self.losses = []  # every micro-batch's loss, as training_step computed it

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        self.manual_backward(loss / ACCUMULATE)
        if (batch_idx + 1) % ACCUMULATE == 0:
            self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
        return loss

    def configure_optimizers(self):
        return optiscope.optim.Adam(self.parameters(), lr=1e-2)


class ParameterChange(lightning.Callback):
    """The oracle: ‖Δθ‖ of the watched weight over each batch in which an optimizer step happened."""

    def __init__(self):
        self.u = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before, self.step = pl_module.net[0].weight.detach().clone(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > self.step:
            self.u.append(float((pl_module.net[0].weight.detach() - self.before).norm()))


def quiet_trainer(tmp_path, max_steps, callbacks, **options):
    """A CPU Trainer without logger, progress bar or summary, and without checkpoints unless ``callbacks``
    hold a ``ModelCheckpoint``."""
    saves = any(isinstance(c, lightning.pytorch.callbacks.ModelCheckpoint) for c in callbacks)
    return lightning.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=saves,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **options,
    )


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_u_is_the_real_update_after_accumulation_and_clipping(automatic, tmp_path):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module, oracle = Regression(automatic), ParameterChange()
    options = {"accumulate_grad_batches": ACCUMULATE, "gradient_clip_val": CLIP} if automatic else {}
    trainer = quiet_trainer(tmp_path, 2, [OptiscopeCallback(out_dir=tmp_path, every=1), oracle], **options)
    trainer.fit(module, data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["params"]["net.0.weight"]["u"] for r in records] == pytest.approx(oracle.u, rel=1e-5)
    assert records[0]["grad_norm"] == pytest.approx(CLIP, rel=1e-4)  # clipped before the step
    micro = torch.tensor(module.losses).view(2, ACCUMULATE).mean(1)
    assert [r["loss"] for r in records] == pytest.approx(micro.tolist(), rel=1e-5)


def test_the_loss_of_an_epochs_short_last_window_is_its_mean(tmp_path):
    """Five batches an epoch with accumulate_grad_batches=2: the third step takes the epoch's last batch alone,
    and Lightning divides its loss by 2 all the same; the record gives each step the mean of its batches'
    losses as training_step computed them (the oracle), not half the short window's."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module = Regression(True)
    trainer = quiet_trainer(tmp_path, 3, [OptiscopeCallback(out_dir=tmp_path, every=1)], accumulate_grad_batches=2)
    trainer.fit(module, data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [module.losses[0:2], module.losses[2:4], module.losses[4:5]]
    assert [r["step"] for r in records] == [1, 2, 3] and len(module.losses) == 5
    assert [r["loss"] for r in records] == pytest.approx([sum(w) / len(w) for w in windows], rel=1e-5)


class TwoStepsPerBatch(Regression):
    """Manual optimisation that steps the optimizer twice in every training_step."""

    def __init__(self):
        super().__init__(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        for _ in range(2):
            loss = nn.functional.mse_loss(self.net(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss


class StepUpdates(lightning.Callback):
    """The oracle: ‖Δθ‖ of the watched weight at every optimizer step, from the optimizer's own hooks."""

    def __init__(self):
        self.u = []

    def on_train_start(self, trainer, pl_module):
        weight, opt = pl_module.net[0].weight, trainer.optimizers[0]
        opt.register_step_pre_hook(lambda *_: setattr(self, "before", weight.detach().clone()))
        opt.register_step_post_hook(lambda *_: self.u.append(float((weight.detach() - self.before).norm())))


def test_several_steps_in_one_batch_are_never_recorded_under_another_steps_number(tmp_path, caplog):
    """Two optimizer steps per batch, measured at steps 1, 3, 6 (every=3), the callback called after steps 2, 4,
    6, 8: steps 1 and 3 were once written as steps 2 and 4 with their numbers. Now a record holds its own step's
    numbers (u against the optimizer's own hooks) or is not written, and the callback says why, once."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    oracle = StepUpdates()
    trainer = quiet_trainer(tmp_path, 8, [OptiscopeCallback(out_dir=tmp_path, every=3), oracle], max_epochs=1)
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.fit(TwoStepsPerBatch(), data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(oracle.u) == 8 and [r["step"] for r in records] == [6]
    assert records[0]["params"]["net.0.weight"]["u"] == pytest.approx(oracle.u[5], rel=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "optimizer steps in one batch" in r.getMessage()]
    assert len(warnings) == 1 and "2 optimizer steps" in warnings[0]


def test_a_diverging_run_stops_cleanly(tmp_path):
    class Exploding(Regression):
        def configure_optimizers(self):
            return optiscope.optim.SGD(self.parameters(), lr=1e30)

    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    trainer = lightning.Trainer(
        max_steps=10,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )
    trainer.fit(Exploding(automatic=True), data)
    assert callback.diverged is not None
    assert trainer.global_step == callback.diverged["step"] < 10
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["diverged"]


def test_an_early_warning_reaches_the_records_and_reduce_lr_the_trainers_optimizer(tmp_path):
    """A lag threshold every Adam step passes: warned at step 2 (the first with Adam's moments), once within the
    cooldown, read at step 5 (measured) and the learning rate halved from step 6 in the optimizer Lightning steps,
    both in metrics.jsonl."""
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    warning = EarlyWarning(loss=None, lag=1e-12, edge=None, cooldown=100)
    callback = OptiscopeCallback(out_dir=tmp_path, every=5, early_warning=warning, on_warning="reduce_lr")
    trainer = quiet_trainer(tmp_path, 10, [callback])
    trainer.fit(Regression(automatic=True), data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    warned = [w for r in records for w in r["warnings"]]
    assert [(w["step"], w["signal"], w["action"], w["lr"]) for w in warned] == [(2, "lag", "reduce_lr", [5e-3])]
    assert [r["lr"] for r in records] == [[1e-2], [1e-2], [5e-3]]  # the lr steps 1, 5 and 10 took
    assert trainer.optimizers[0].param_groups[0]["lr"] == 5e-3


def test_the_last_steps_are_judged_at_the_end_of_training(tmp_path):
    """Measured at step 1 only and read every 10 steps, the run above diverges at step 2 and ends at step 4
    before any reading: the end of training reads it, and the callback's state (what a checkpoint saves) holds
    no loss unread."""

    class Exploding(Regression):
        def configure_optimizers(self):
            return optiscope.optim.SGD(self.parameters(), lr=1e30)

    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback = OptiscopeCallback(out_dir=tmp_path, every=100)
    trainer = quiet_trainer(tmp_path, 4, [callback])
    trainer.fit(Exploding(automatic=True), data)
    assert callback.diverged is not None and callback.diverged["step"] == 2 and trainer.global_step == 4
    assert callback.state_dict()["monitor"]["unread"] == []


def test_without_a_guard_a_diverging_run_trains_to_the_end_and_every_step_is_recorded(tmp_path):
    """``guard=None``: the run above is not stopped (Lightning's own step count reaches ``max_steps``) and each
    step has its record, with the loss ``training_step`` returned, non-finite ones too."""

    class Exploding(Regression):
        def configure_optimizers(self):
            return optiscope.optim.SGD(self.parameters(), lr=1e30)

    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback, module = OptiscopeCallback(out_dir=tmp_path, every=1, guard=None), Exploding(automatic=True)
    trainer = quiet_trainer(tmp_path, 10, [callback])
    trainer.fit(module, data)
    assert trainer.global_step == 10 and callback.diverged is None
    assert not all(math.isfinite(x) for x in module.losses)  # the run did diverge
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11)) and not any(r.get("diverged") for r in records)
    assert [r["loss"] for r in records] == pytest.approx(module.losses, rel=1e-6, nan_ok=True)


class NaNAtStep(Regression):
    """Its loss is NaN at step ``nan_step`` (so are its gradients and, after that step, its weights)."""

    def __init__(self, nan_step):
        super().__init__(automatic=True)
        self.nan_step = nan_step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.global_step + 1 == self.nan_step else loss


def saved_checkpoints(folder):
    """{file name: its global step} of the checkpoints in ``folder``, having checked that each one's weights are
    finite and that a ``last.ckpt`` link leads to one."""
    saved = {p.name: torch.load(p, weights_only=False) for p in folder.glob("*.ckpt")}
    assert all(w.isfinite().all() for c in saved.values() for w in c["state_dict"].values())
    return {name: c["global_step"] for name, c in saved.items()}


@pytest.mark.parametrize(
    "saving, nan_step, min_steps, kept",
    [
        ({"every_n_train_steps": 1, "save_last": True}, 4, None, {"epoch=0-step=3.ckpt": 3, "last.ckpt": 3}),
        ({}, 5, None, {"epoch=0-step=3.ckpt": 3}),  # at each epoch's end: the first ends at step 3, the NaN in the 2nd
        ({"every_n_train_steps": 1, "save_last": "link"}, 1, None, {}),  # diverged at the first step: nothing to keep
        # Lightning trains on to min_steps after should_stop: none of those steps is saved either
        ({"every_n_train_steps": 1, "save_last": True}, 2, 6, {"epoch=0-step=1.ckpt": 1, "last.ckpt": 1}),
        ({"every_n_train_steps": 100, "save_last": "link"}, 2, 6, {}),
    ],
    ids=["every-step-and-last", "every-epoch", "before-any", "min-steps", "min-steps-link"],
)
def test_a_diverged_model_is_not_checkpointed_over_the_good_one(tmp_path, saving, nan_step, min_steps, kept):
    """Lightning's ModelCheckpoint saves after ``should_stop`` too: with its default ``save_top_k=1`` the
    diverged model replaced the last good checkpoint and ``last.ckpt``. The oracle is what is on disk: the
    checkpoints of the steps before the divergence, each with finite weights, and none of the diverged step."""
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))  # three batches an epoch
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", **saving)
    trainer = quiet_trainer(tmp_path, 8, [callback, checkpoints], min_steps=min_steps)
    trainer.fit(NaNAtStep(nan_step), data)
    assert callback.diverged["step"] == nan_step and trainer.global_step == (min_steps or nan_step)
    assert saved_checkpoints(tmp_path / "checkpoints") == kept


def test_the_next_fit_on_the_same_trainer_checkpoints_as_usual(tmp_path):
    """After a fit that diverged at its first step (nothing saved), the same Trainer fits a healthy module:
    its checkpoints are saved as without optiscope, ``last.ckpt`` a link to the last one (the divergence's
    hold on the ModelCheckpoint ended with its fit)."""
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback = OptiscopeCallback(out_dir=tmp_path, every=1)
    saving = {"every_n_train_steps": 2, "save_last": "link", "save_top_k": -1}
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", **saving)
    trainer = quiet_trainer(tmp_path, 1, [callback, checkpoints])
    trainer.fit(NaNAtStep(1), data)
    assert callback.diverged["step"] == 1 and saved_checkpoints(tmp_path / "checkpoints") == {}
    trainer.fit_loop.epoch_loop.max_steps = 5
    trainer.fit(NaNAtStep(None), data)
    assert callback.diverged is None and trainer.global_step == 5
    assert saved_checkpoints(tmp_path / "checkpoints") == {
        "epoch=1-step=2.ckpt": 2,
        "epoch=1-step=4.ckpt": 4,
        "last.ckpt": 4,
    }
    assert (tmp_path / "checkpoints" / "last.ckpt").readlink().name == "epoch=1-step=4.ckpt"


BETA, LR, CURVATURE_EVERY = 0.9, 0.05, 2
CURVATURE_KEYS = ("sharpness", "threshold", "sharpness/threshold", "curvature/update", "curvature/gradient")


class HeavyBall(Regression):
    """The regression under torch's SGD with heavy-ball momentum β, whose threshold is (2 + 2β)/η."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=BETA)


def regression_loss(module, batch):
    x, y = batch
    return nn.functional.mse_loss(module.net(x), y)


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).double()


def exact_hessian_and_gradient(module, batch):
    """H and ∇L of ``regression_loss`` on ``batch`` in float64, H formed entry by entry (49 × 49)."""
    names = [n for n, _ in module.net.named_parameters()]
    shapes = [p.shape for p in module.net.parameters()]
    sizes = [s.numel() for s in shapes]
    x, y = (t.double() for t in batch)
    net = copy.deepcopy(module.net).double()

    def loss(theta):
        params = {n: t.view(s) for n, t, s in zip(names, theta.split(sizes), shapes, strict=True)}
        return nn.functional.mse_loss(torch.func.functional_call(net, params, (x,)), y)

    theta = flat(module.net)
    return torch.func.hessian(loss)(theta), torch.func.grad(loss)(theta)


def rayleigh(hessian, d):
    return float(d @ hessian @ d / (d @ d))


class ExactCurvature(lightning.Callback):
    """The oracle: after every ``every``-th optimizer step, from the exact Hessian of the loss on ``batch``
    at the parameters the step left, λ₁(H) and dᵀHd/dᵀd along that step's parameter change and along
    ∇L(batch); ``scale`` is max |λ(H)|."""

    def __init__(self, batch, every):
        self.batch, self.every, self.seen = batch, every, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before, self.step = flat(pl_module), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step > self.step and step % self.every == 0:
            hessian, gradient = exact_hessian_and_gradient(pl_module, self.batch)
            eigenvalues = torch.linalg.eigvalsh(hessian)
            self.seen[step] = {
                "sharpness": float(eigenvalues[-1]),
                "scale": float(eigenvalues.abs().max()),
                "curvature/update": rayleigh(hessian, flat(pl_module) - self.before),
                "curvature/gradient": rayleigh(hessian, gradient),
            }


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_curvature_reaches_the_monitor_with_the_trainers_optimizer_state(automatic, tmp_path):
    """Curvature(...) through the callback, every 2 of 4 steps (manual: with the module's own accumulation
    and clipping): the threshold against (2 + 2β)/η; the sharpness and the curvatures along the update
    and the gradient against the exact float64 Hessian right after each measured step; the last
    sharpness against a direct measurement on the model and optimizer the trainer ends with."""
    from optiscope.curvature import sharpness
    from optiscope.monitor import Curvature

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    fixed_x = torch.randn(8, 4, generator=generator)
    fixed = (fixed_x, fixed_x.sum(1, keepdim=True))
    curvature = Curvature(
        fixed, regression_loss, every=CURVATURE_EVERY, tol=1e-6, max_hvps=100, directions=("update", "gradient")
    )
    module, oracle = HeavyBall(automatic), ExactCurvature(fixed, CURVATURE_EVERY)
    trainer = quiet_trainer(tmp_path, 4, [OptiscopeCallback(out_dir=tmp_path, every=1, curvature=curvature), oracle])
    trainer.fit(module, data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    measured = {r["step"]: r for r in records if any(key in r for key in CURVATURE_KEYS)}
    assert sorted(measured) == sorted(oracle.seen) == [2, 4]
    for step, r in measured.items():
        exact = oracle.seen[step]
        assert all(r[key] is not None for key in CURVATURE_KEYS), step
        assert r["threshold"] == pytest.approx((2 + 2 * BETA) / LR, rel=1e-12)
        assert r["sharpness/threshold"] == pytest.approx(r["sharpness"] / r["threshold"], rel=1e-12)
        assert r["sharpness"] == pytest.approx(exact["sharpness"], rel=1e-4), step
        # a Rayleigh quotient can be small beside the spectrum: float32 products are good to ~1e-6 of its scale
        for key in ("curvature/update", "curvature/gradient"):
            assert r[key] == pytest.approx(exact[key], rel=1e-4, abs=1e-5 * exact["scale"]), (step, key)

    direct = sharpness(module, regression_loss, fixed, trainer.optimizers[0], tol=1e-6, max_hvps=200)
    assert not direct["preconditioned"]
    assert direct["threshold"] == pytest.approx((2 + 2 * BETA) / LR, rel=1e-12)
    assert measured[4]["sharpness"] == pytest.approx(direct["eigenvalues"][0], rel=1e-4)


class MicroBatchGradients(lightning.Callback):
    """The oracle: each micro-batch's own gradient at the parameters it meets, keyed by the optimizer step
    it belongs to, computed apart (``torch.func``, so neither ``.grad`` nor any hook is touched)."""

    def __init__(self):
        self.passes = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        params = {n: p.detach() for n, p in pl_module.net.named_parameters()}

        def loss(theta):
            x, y = batch
            return nn.functional.mse_loss(torch.func.functional_call(pl_module.net, theta, (x,)), y)

        grads = torch.func.grad(loss)(params)
        self.passes.setdefault(trainer.global_step + 1, []).append(list(grads.values()))


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_noise_scale_from_the_accumulated_micro_batches(automatic, tmp_path):
    """Curvature(accumulation_batch_size=4) through the callback, with Lightning's accumulate_grad_batches
    and clipping (manual: the module's own): B_simple, |G|² and tr Σ of each measured step against the
    estimators written out on the micro-batches' own gradients, computed apart; training is untouched."""
    from curvature_support import assert_accumulated_noise_scale
    from optiscope.monitor import Curvature

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    y = x.sum(1, keepdim=True) + 3.0  # an offset the fresh model has not fitted: a signal above the noise
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    curvature = Curvature((x[:8], y[:8]), regression_loss, every=2, directions=(), accumulation_batch_size=4)
    options = {"accumulate_grad_batches": ACCUMULATE, "gradient_clip_val": CLIP} if automatic else {}
    module, oracle = Regression(automatic), MicroBatchGradients()
    trainer = quiet_trainer(
        tmp_path, 4, [OptiscopeCallback(out_dir=tmp_path, every=1, curvature=curvature), oracle], **options
    )
    trainer.fit(module, data)
    records = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert [len(oracle.passes[step]) for step in (2, 4)] == [ACCUMULATE, ACCUMULATE]
    assert_accumulated_noise_scale(records, oracle.passes, (2, 4), 4)
    plain = Regression(automatic)
    quiet_trainer(tmp_path / "plain", 4, [], **options).fit(plain, data)
    for a, b in zip(module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_noise_scale_over_ranks_is_refused_with_advice_a_user_can_follow():
    """Lightning gives its callbacks the module, not its DDP wrapper: Curvature(rank_batch_size=...) cannot
    work there, and the refusal names what does (the Monitor's own advice, to wrap the model, cannot be
    followed inside Lightning), when the callback is built."""
    from optiscope.monitor import Curvature

    x, y = torch.randn(16, 4), torch.randn(16, 1)
    curvature = Curvature((x[:8], y[:8]), regression_loss, every=2, rank_batch_size=4)
    with pytest.raises(ValueError, match=r"rank_batch_size=4\) needs the DDP-wrapped model.*micro_batches"):
        OptiscopeCallback(every=1, curvature=curvature)


def test_a_resumed_run_continues_the_monitor_as_if_it_had_not_stopped(tmp_path, caplog):
    """The uninterrupted run is the oracle: a run resumed from its end-of-epoch checkpoint at step 3 (a fresh
    Trainer, module and callback; ``fit(ckpt_path=...)``) writes the same records for steps 4–6, curvature
    included (its warm start from step 2's eigenvector), and ends with the same monitor state: the guard's
    reference losses, the sharpness history from before the stop. From a checkpoint without the callback's
    state the monitor starts afresh and says so. Every batch is the same: Lightning 2.6, resumed from a
    checkpoint written at an epoch's end, serves that epoch's first batch once more before the next epoch."""
    from optiscope.monitor import Curvature
    from support import assert_monitor_resumed

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, generator=generator).repeat(3, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    fixed_x = torch.randn(8, 4, generator=generator)
    fixed = (fixed_x, fixed_x.sum(1, keepdim=True))

    def train(out, ckpt_path):
        callback = OptiscopeCallback(
            out_dir=out, every=1, curvature=Curvature(fixed, regression_loss, every=2, directions=())
        )
        saving = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_top_k=-1)
        trainer = quiet_trainer(out, 6, [callback, saving])
        trainer.fit(HeavyBall(automatic=True), data, ckpt_path=ckpt_path)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return callback.monitor.state_dict(), [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]

    whole, records = train(tmp_path / "whole", None)
    saved = tmp_path / "whole" / "checkpoints" / "epoch=0-step=3.ckpt"
    stateless = tmp_path / "stateless.ckpt"
    checkpoint = torch.load(saved, weights_only=False)
    checkpoint["callbacks"] = {k: v for k, v in checkpoint["callbacks"].items() if "OptiscopeCallback" not in k}
    torch.save(checkpoint, stateless)
    for path in (saved, stateless):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="optiscope"):
            state, resumed = train(tmp_path / path.stem, path)
        assert [r["step"] for r in resumed] == [4, 5, 6]
        warned = "resuming at step 3 without the monitor's state" in caplog.text
        assert_monitor_resumed(state, whole, resumed, records[3:], path == saved, warned)


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_a_step_the_grad_scaler_skips_has_no_record_and_keeps_its_number(automatic, tmp_path):
    """Lightning's own mixed-precision plugin ("16-mixed", on the CPU, with its GradScaler) and a first batch
    holding an inf: the first step's gradients are NaN and the scaler skips it (the oracle: no parameter change
    across it); the next two go through. Lightning counts the skipped step: the records are steps 2 and 3,
    with the real updates and each one's own loss (manual mode: the mean of its two batches), none of the
    skipped step's NaN carried into the next (it would trip the guard)."""
    from lightning.pytorch.plugins import MixedPrecision

    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))  # steps 1–3 in the first epoch, both modes
    x[0, 0] = math.inf
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    module, oracle = Regression(automatic), ParameterChange()
    plugins = [MixedPrecision("16-mixed", "cpu", scaler)]
    trainer = quiet_trainer(tmp_path, 3, [OptiscopeCallback(out_dir=tmp_path, every=1), oracle], plugins=plugins)
    trainer.fit(module, data)
    assert trainer.global_step == 3 and oracle.u[0] == 0 and all(u > 0 for u in oracle.u[1:])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]
    assert [r["params"]["net.0.weight"]["u"] for r in records] == pytest.approx(oracle.u[1:], rel=1e-5)
    per_step = torch.tensor(module.losses).view(3, -1).mean(1)  # manual mode: two batches a step
    assert not per_step[0].isfinite() and [r["loss"] for r in records] == pytest.approx(per_step[1:].tolist(), rel=1e-6)


@pytest.mark.parametrize(
    ("min_steps", "skipped"), [(None, None), (36, None), (None, 4)], ids=["default", "min-steps", "guard-skipped-4"]
)
def test_a_run_whose_grad_scaler_skips_every_step_stops_diverged(tmp_path, min_steps, skipped):
    """Every batch holds an inf, so the GradScaler of "16-mixed" skips every step (the oracles: no parameter
    change at any step, the scale halved at each). Lightning would count skipped steps to ``max_steps``; the
    callback stops it at the guard's 32nd skipped step in a row, or at the ``skipped``-th of a guard the user
    gives (with ``min_steps``, Lightning trains on to them, and the monitor's step count keeps up with
    Lightning's)."""
    from lightning.pytorch.plugins import MixedPrecision

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))  # short epochs: min_steps, not epochs
    x[:, 0] = math.inf
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    scaler = torch.amp.GradScaler("cpu")
    guard = {} if skipped is None else {"guard": DivergenceGuard(skipped=skipped)}
    callback, oracle = OptiscopeCallback(out_dir=tmp_path, every=1, **guard), ParameterChange()
    plugins = [MixedPrecision("16-mixed", "cpu", scaler)]
    trainer = quiet_trainer(tmp_path, 40, [callback, oracle], plugins=plugins, min_steps=min_steps)
    trainer.fit(Regression(True), data)
    stop = skipped or 32
    steps = min_steps or stop
    assert trainer.global_step == callback.monitor.step_count == steps and oracle.u == [0.0] * steps
    assert scaler.get_scale() == 2.0**16 / 2**steps
    assert callback.diverged["step"] == stop and f"{stop} steps in a row skipped" in callback.diverged["reason"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["reason"] == callback.diverged["reason"]


class FrozenAtFirst(Regression):
    """A module whose own ``optimizer_step`` leaves the optimizer alone for its first 40 steps (statistics only)."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        if self.trainer.global_step < 40:
            optimizer_closure()
        else:
            optimizer.step(closure=optimizer_closure)


def test_steps_a_module_leaves_out_without_a_grad_scaler_are_no_divergence(tmp_path):
    """Lightning counts them and the optimizer does not take them, as with a GradScaler's skips, but no scaler
    is at work: the run had been stopped at step 32 'for non-finite gradients'. The oracle: the parameter
    change, 0 for the first 40 steps, then the recorded u."""
    # batches large enough that the frozen model's losses do not differ by the guard's factor from batch to batch
    x = torch.randn(512, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=128)
    callback, oracle = OptiscopeCallback(out_dir=tmp_path, every=1), ParameterChange()
    trainer = quiet_trainer(tmp_path, 50, [callback, oracle])
    trainer.fit(FrozenAtFirst(True), data)
    assert callback.diverged is None and trainer.global_step == callback.monitor.step_count == 50
    assert oracle.u[:40] == [0.0] * 40 and all(u > 0 for u in oracle.u[40:])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(41, 51))


class RaisesAtStep(Regression):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("the module's own bug")
        return super().training_step(batch, batch_idx)


def test_a_fit_that_raises_leaves_no_hook_on_the_optimizer(tmp_path):
    """It reaches neither on_train_end nor on_fit_end: the monitor's step hooks stayed on the optimizer (the
    oracle: torch's own hook tables) and its sinks open."""
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    module, callback = RaisesAtStep(True), OptiscopeCallback(out_dir=tmp_path, every=1)
    trainer = quiet_trainer(tmp_path, 10, [callback])
    with pytest.raises(RuntimeError, match="the module's own bug"):
        trainer.fit(module, data)
    (optimizer,) = trainer.optimizers
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert callback.attachment.closed and callback.monitor.optimizer is None  # and let go of it


def reachable(start):
    """What ``start`` holds, followed through optiscope's own objects and Python's containers, functions, cells
    and methods (not into other libraries' objects, which are reached but not followed)."""
    import gc
    import types

    seen, todo, found = set(), [start], []
    through = (dict, list, tuple, set, types.FunctionType, types.MethodType, types.CellType)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, through) or type(obj).__module__.startswith("optiscope"):
            todo.extend(gc.get_referents(obj))
    return found


def test_after_fit_the_callback_holds_neither_the_model_nor_the_trainer(tmp_path):
    """The monitor is closed at the end of training and lets go of the module, its optimizer and its sinks (the
    logger sink's function held the Trainer, which holds the module): what the callback keeps (its records, the
    monitor's state) reaches none of them, so a run's model is freed with the Trainer, not by the collector."""
    from lightning.pytorch.loggers import CSVLogger

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module, callback = Regression(True), OptiscopeCallback(every=2)
    trainer = lightning.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )
    trainer.fit(module, data)
    # Lightning gives every callback the module's own logging methods (``callback.log``): those are its references
    ours = [value for name, value in vars(callback).items() if name not in ("log", "log_dict")]
    held = {id(obj) for obj in reachable(ours)}
    run = [module, trainer, *trainer.optimizers, *module.parameters()]
    assert callback.monitor.last_record["step"] == 4 and not [obj for obj in run if id(obj) in held]


def test_fit_again_on_the_same_trainer_goes_on_with_the_monitor(tmp_path, caplog):
    """A second ``fit`` on the same Trainer and callback continues at its global step: the monitor goes on
    from the first fit's state (the guard's first loss, the records so far), without a warning."""
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback, module = OptiscopeCallback(out_dir=tmp_path, every=1), Regression(automatic=True)
    trainer = quiet_trainer(tmp_path, 3, [callback])
    trainer.fit(module, data)
    first = callback.monitor.state_dict()
    trainer.fit_loop.epoch_loop.max_steps = 6
    with caplog.at_level(logging.WARNING, logger="optiscope"):
        trainer.fit(module, data)
    assert trainer.global_step == 6 and "without the monitor's state" not in caplog.text
    assert callback.monitor.state_dict()["first_loss"] == first["first_loss"] == module.losses[0]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]


class ClippingOracle(Regression):
    """Records the gradients' total norm, computed apart in float64, where Lightning clips them, then clips."""

    def __init__(self):
        super().__init__(automatic=True)
        self.norms = []

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        grads = torch.cat([p.grad.double().flatten() for p in self.parameters()])
        self.norms.append(float(grads.norm()))
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


@pytest.mark.parametrize("clip", [CLIP, None], ids=["clipping", "no-clipping"])
def test_the_norm_before_clipping_is_recorded_beside_the_clipped_one(clip, tmp_path):
    """With ``gradient_clip_val`` each record holds ``grad_norm_before_clip``, the accumulated gradients' norm
    where Lightning clips them, beside the clipped ``grad_norm`` the optimizer used; without clipping there is
    nothing before it, and no such field."""
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module = ClippingOracle()
    options = {"accumulate_grad_batches": ACCUMULATE, "gradient_clip_val": clip}
    quiet_trainer(tmp_path, 2, [OptiscopeCallback(out_dir=tmp_path, every=1)], **options).fit(module, data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == len(module.norms) == 2
    if clip:
        assert [r["grad_norm_before_clip"] for r in records] == pytest.approx(module.norms, rel=1e-5)
        assert [r["grad_norm"] for r in records] == pytest.approx([CLIP] * 2, rel=1e-4)
        assert min(module.norms) > CLIP  # clipping was active
    else:
        assert not any("grad_norm_before_clip" in r for r in records)
        assert [r["grad_norm"] for r in records] == pytest.approx(module.norms, rel=1e-5)


def test_a_run_diverging_from_its_first_steps_stops_at_the_first_judged_step(tmp_path):
    """Adam at η = 10 on the regression: the loss ``training_step`` returns runs up at once and stays finite. The
    default guard judges from the 9th step, where the median of the 9 losses is above 4x the first (computed here
    from the module's own losses), and the fit stops there, long before its 20 steps (a 20-step warm-up let it
    run to the end)."""
    import statistics

    class Exploding(Regression):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=10.0)

    x = torch.randn(80, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback, module = OptiscopeCallback(out_dir=tmp_path, every=1), Exploding(automatic=True)
    trainer = quiet_trainer(tmp_path, 20, [callback])
    trainer.fit(module, data)
    assert trainer.global_step == callback.diverged["step"] == len(module.losses) == 9
    assert statistics.median(module.losses) > 4 * module.losses[0] and all(map(math.isfinite, module.losses))


def test_a_module_with_two_optimizers_is_refused_in_one_line(tmp_path):
    """A GAN-style module (manual optimisation, one optimizer per network) is refused when training starts, in
    one line that names the count, and the optimizers keep no hook of the monitor's."""

    class TwoOptimizers(Regression):
        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[2].parameters(), lr=0.1),
            ]

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    trainer = quiet_trainer(tmp_path, 2, [OptiscopeCallback(out_dir=tmp_path, every=1)])
    with pytest.raises(ValueError, match=r"^OptiscopeCallback: the module has 2 optimizers; it monitors exactly one$"):
        trainer.fit(TwoOptimizers(automatic=False), data)
    assert not any(opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks for opt in trainer.optimizers)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("precision", ["64-true", "bf16-true"])
def test_curvature_under_a_true_precision_measures_on_the_batch_as_lightning_converts_it(precision, tmp_path):
    """``precision="64-true"`` (or "bf16-true") casts the module's weights, and Lightning casts each training batch
    to match (``precision_plugin.convert_input``): a Curvature batch given as the data comes, in float32, is
    measured as Lightning would feed it, rather than failing the fit when the monitor is built. The oracle: the
    exact Hessian of the loss on the batch at the weights each measured step left, in float64 (for bfloat16
    weights and batch, whose products round to 3 significant digits, within 1 %; 4e-4 seen)."""
    from optiscope.monitor import Curvature

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    fixed_x = torch.randn(8, 4, generator=generator)
    fixed = (fixed_x, fixed_x.sum(1, keepdim=True))
    curvature = Curvature(fixed, regression_loss, every=CURVATURE_EVERY, tol=1e-6, max_hvps=100, directions=())
    oracle = ExactCurvature(fixed, CURVATURE_EVERY)
    trainer = quiet_trainer(
        tmp_path, 4, [OptiscopeCallback(out_dir=tmp_path, every=1, curvature=curvature), oracle], precision=precision
    )
    trainer.fit(HeavyBall(automatic=True), data)
    assert fixed[0].dtype == torch.float32  # the user's batch is left as it was
    records = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    rel = 1e-6 if precision == "64-true" else 1e-2
    for step in (2, 4):
        assert records[step]["threshold"] == pytest.approx((2 + 2 * BETA) / LR, rel=1e-12)
        assert records[step]["sharpness"] == pytest.approx(oracle.seen[step]["sharpness"], rel=rel), step


def test_a_noise_scale_from_accumulation_without_accumulation_is_refused_in_one_line(tmp_path):
    """``Curvature(accumulation_batch_size=4)`` in automatic optimisation without ``accumulate_grad_batches``:
    every step takes one backward pass, so every record would silently lack the noise scale; refused in one line
    naming both settings, and the optimizer keeps no hook of the monitor's."""
    from optiscope.monitor import Curvature

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    curvature = Curvature((x[:8], x[:8].sum(1, keepdim=True)), regression_loss, every=2, accumulation_batch_size=4)
    trainer = quiet_trainer(tmp_path, 2, [OptiscopeCallback(out_dir=tmp_path, every=1, curvature=curvature)])
    with pytest.raises(
        ValueError,
        match=r"^OptiscopeCallback: Curvature\(accumulation_batch_size=4\).*"
        r"accumulate_grad_batches=1 takes one per step[^\n]*$",
    ):
        trainer.fit(Regression(automatic=True), data)
    assert not any(opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks for opt in trainer.optimizers)
    assert not (tmp_path / "metrics.jsonl").exists()
