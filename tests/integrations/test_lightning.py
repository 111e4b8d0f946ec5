"""OptiscopeCallback in a real Lightning Trainer: u against the parameter change seen by an independent callback."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")

import lightning  # noqa: E402

import optiscope.optim  # noqa: E402
from optiscope.integrations.lightning import OptiscopeCallback  # noqa: E402

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


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_u_is_the_real_update_after_accumulation_and_clipping(automatic, tmp_path):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    module, oracle = Regression(automatic), ParameterChange()
    options = {"accumulate_grad_batches": ACCUMULATE, "gradient_clip_val": CLIP} if automatic else {}
    trainer = lightning.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[OptiscopeCallback(every=1), oracle],
        **options,
    )
    trainer.fit(module, data)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["params"]["net.0.weight"]["u"] for r in records] == pytest.approx(oracle.u, rel=1e-5)
    assert records[0]["grad_norm"] == pytest.approx(CLIP, rel=1e-4)  # clipped before the step
    micro = torch.tensor(module.losses).view(2, ACCUMULATE).mean(1)
    assert [r["loss"] for r in records] == pytest.approx(micro.tolist(), rel=1e-5)


def test_a_diverging_run_stops_cleanly(tmp_path):
    class Exploding(Regression):
        def configure_optimizers(self):
            return optiscope.optim.SGD(self.parameters(), lr=1e30)

    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    callback = OptiscopeCallback(every=1)
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
