"""The Lightning and 🤗 callbacks under the libraries' FSDP strategies, in real two-process gloo jobs on the CPU:
every number the callback records (rank 0's ``metrics.jsonl``, each rank's ``callback.monitor.last_record``)
against an unsharded one-process run of the same model, batches and optimizer (run here, in the test's own
process), named as the user's model names them.

What runs on the CPU (Lightning 2.6, transformers 5, accelerate 1.15, torch 2.13): Lightning's
``ModelParallelStrategy`` (FSDP2 through the module's ``configure_model``). Lightning's ``FSDPStrategy`` is
refused with ``accelerator="cpu"``, and would hand torch's FSDP no device; it is tested here with its device
made the CPU (``_fsdp_on_cpu``), and as it comes, skipped while Lightning refuses it. 🤗's
``fsdp="full_shard"`` with ``use_cpu=True`` trains as DDP (accelerate turns FSDP on for accelerator devices
only), and with FSDP1's default ``sync_module_states`` it is refused when the Trainer is built: what such a
run records is compared all the same, and the test that the Trainer shards skips with the library's message.
"""

import json
import os
import socket

import pytest
import torch
import torch.distributed.nn  # noqa: F401 (before any process group: see train.distributed._import_before_joining)
import torch.multiprocessing as mp
from torch import nn

from optiscope.train.distributed import leave_job
from support import assert_sharded_close

WORLD, STEPS, EVERY, ROWS = 2, 4, 2, 16
MEASURED = [1, 2, 4]  # the first step and every EVERY-th


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, port: int) -> None:
    """This spawned process as rank ``rank`` of a job the libraries find in the environment (as torchrun sets it),
    so that neither launches processes of its own."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0"
    )
    os.environ.update(WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))


def _timeless(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "tokens_per_s"}  # a wall-clock rate


def _outcome(callback, folder) -> dict:
    """What the callback wrote to ``folder`` (on rank 0; nothing on the others), and the monitor's last record."""
    from optiscope import runs

    path = folder / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    last = runs.to_jsonable(callback.monitor.last_record)
    return {"records": [_timeless(r) for r in records], "last": _timeless(last)}


def _rank(rank: int, tmp: str, port: int, worker) -> None:
    """Rank ``rank`` of the job: what ``worker(tmp)`` returns, written to ``tmp/rank<rank>.json``."""
    _join(rank, port)
    out = worker(tmp)
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    leave_job()  # the libraries' wrappers, in reference cycles, collected first


def _run_job(worker, tmp) -> list[dict]:
    mp.spawn(_rank, args=(str(tmp), _free_port(), worker), nprocs=WORLD, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _compare(ranks: list[dict], unsharded: dict, job: str, names: set[str]) -> None:
    first = ranks[0][job]
    assert [r["step"] for r in first["records"]] == MEASURED
    assert set(first["records"][0]["params"]) == names
    assert_sharded_close(first["records"], unsharded["records"], f"rank0.{job}.metrics.jsonl")
    for rank, out in enumerate(ranks):
        assert_sharded_close(out[job]["last"], unsharded["last"], f"rank{rank}.{job}.last_record")
    assert ranks[1][job]["last"] == first["last"]  # not only close: the same numbers on both ranks


# --- Lightning -------------------------------------------------------------------------------------------------


def _lightning_module():
    import lightning
    from lightning.pytorch.strategies import ModelParallelStrategy

    class Regression(lightning.LightningModule):
        """A score from 9 features through a layer of 31 units, which FSDP shards unevenly over 2 ranks."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.wide = nn.Linear(9, 31)
            self.head = nn.Linear(31, 1)

        def configure_model(self) -> None:
            if isinstance(self.trainer.strategy, ModelParallelStrategy):  # FSDP2, as Lightning's docs shard
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                for module in (self.wide, self.head, self):
                    fully_shard(module, mesh=mesh)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.head(torch.tanh(self.wide(x))), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return Regression()


def _lightning_fit(folder, strategy, devices: int, clip: float | None) -> dict:
    """STEPS Adam steps on global batches of 8 rows in order (each of ``devices`` ranks takes every
    ``devices``-th row), the gradients clipped to norm ``clip`` (None: not clipped; active at 0.5),
    measured every EVERY steps, written to ``folder``."""
    import lightning

    from optiscope.integrations.lightning import OptiscopeCallback

    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(ROWS, 9, generator=g), torch.randn(ROWS, 1, generator=g)
    rows = torch.utils.data.TensorDataset(x, y)
    # in order: the distributed sampler Lightning puts in (use_distributed_sampler) shuffles training rows
    order = torch.utils.data.DistributedSampler(rows, devices, int(os.environ.get("RANK", 0)), shuffle=False)
    data = torch.utils.data.DataLoader(rows, batch_size=8 // devices, sampler=order)
    callback = OptiscopeCallback(out_dir=folder, every=EVERY)
    trainer = lightning.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        default_root_dir=folder,
        use_distributed_sampler=False,
        gradient_clip_val=clip,
    )
    trainer.fit(_lightning_module(), data)
    return _outcome(callback, folder)


def _fsdp_on_cpu(**kwargs):
    """Lightning's ``FSDPStrategy`` with the one change that reaches the CPU: its wrapping passes
    ``device_id=cpu`` to torch's FSDP (Lightning passes the root device's index, None on the CPU, which torch's
    FSDP refuses without an accelerator: "FSDP needs a non-CPU accelerator device"). Being a subclass also lets
    it past Lightning's check of ``accelerator="cpu"`` (made for the class itself)."""
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    class FSDPOnCPU(FSDPStrategy):
        def _setup_model(self, model: nn.Module) -> nn.Module:
            return FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )

    return FSDPOnCPU(process_group_backend="gloo", auto_wrap_policy={nn.Linear}, **kwargs)


def _lightning_worker(tmp: str) -> dict:
    from pathlib import Path

    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    out = {}
    try:  # Lightning's FSDPPrecision refuses gradient_clip_algorithm="norm": FSDP1 runs unclipped
        out["fsdp"] = _lightning_fit(Path(tmp) / "fsdp", FSDPStrategy(process_group_backend="gloo"), WORLD, None)
    except (ValueError, RuntimeError) as error:
        out["fsdp"] = {"refused": str(error)}
    for orig in (True, False):
        job = "fsdp_on_cpu" + ("_orig" if orig else "")
        out[job] = _lightning_fit(Path(tmp) / job, _fsdp_on_cpu(use_orig_params=orig), WORLD, None)
    strategy = ModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1)
    out["model_parallel"] = _lightning_fit(Path(tmp) / "model_parallel", strategy, WORLD, 0.5)
    return out


@pytest.fixture(scope="module")
def lightning_ranks(tmp_path_factory):
    return _run_job(_lightning_worker, tmp_path_factory.mktemp("lightning_fsdp"))


@pytest.fixture(scope="module")
def clipped(tmp_path_factory):
    """The one-process run, clipped as under ``ModelParallelStrategy``."""
    return _lightning_fit(tmp_path_factory.mktemp("lightning_clipped"), "auto", 1, 0.5)


@pytest.fixture(scope="module")
def unclipped(tmp_path_factory):
    """The one-process run, unclipped as under ``FSDPStrategy``."""
    return _lightning_fit(tmp_path_factory.mktemp("lightning_unclipped"), "auto", 1, None)


LIGHTNING_NAMES = {"wide.weight", "wide.bias", "head.weight", "head.bias"}
LIGHTNING_JOBS = {"model_parallel": "clipped", "fsdp": "unclipped", "fsdp_on_cpu": "unclipped"}
LIGHTNING_JOBS["fsdp_on_cpu_orig"] = "unclipped"


@pytest.mark.parametrize("job", LIGHTNING_JOBS)
def test_lightning_records_are_the_unsharded_runs_on_every_rank(lightning_ranks, request, job):
    """FSDP2 through ``ModelParallelStrategy`` (``grad_norm_before_clip`` too), FSDP1 through ``FSDPStrategy``
    (both ``use_orig_params``; on the CPU only with its device made the CPU): the whole model's numbers."""
    refused = lightning_ranks[0][job].get("refused")
    if refused:
        pytest.skip(f"Lightning's FSDPStrategy does not run on the CPU (fsdp_on_cpu reaches it): {refused}")
    _compare(lightning_ranks, request.getfixturevalue(LIGHTNING_JOBS[job]), job, LIGHTNING_NAMES)


# --- 🤗 Trainer --------------------------------------------------------------------------------------------------


def _hf_trainer(folder, per_device: int, **sharding):
    """A Trainer of a tiny GPT-2 without dropout on 16 sequences in order, global batches of 4, with the
    callback writing to ``folder``, and the callback."""
    from transformers import Trainer, TrainingArguments

    import tiny_hf
    from optiscope.integrations.transformers import OptiscopeCallback

    g = torch.Generator().manual_seed(3)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, tiny_hf.VOCAB, (ROWS, 8), generator=g)]
    args = TrainingArguments(
        output_dir=str(folder),
        max_steps=STEPS,
        per_device_train_batch_size=per_device,
        train_sampling_strategy="sequential",  # rank r's batch is the r-th quarter of the one-process run's
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **sharding,
    )
    callback = OptiscopeCallback(out_dir=folder, every=EVERY)
    model = tiny_hf.model("gpt2")
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # each rank draws its own dropout masks: the runs would differ in more than sharding
    return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]), callback


def _hf_worker(tmp: str) -> dict:
    from pathlib import Path

    out = {}
    try:
        _hf_trainer(Path(tmp) / "fsdp1", 2, fsdp="full_shard", fsdp_config={"version": 1})
        out["fsdp1"] = {"refused": ""}
    except RuntimeError as error:
        out["fsdp1"] = {"refused": str(error)}
    trainer, callback = _hf_trainer(Path(tmp) / "fsdp", 2, fsdp="full_shard", fsdp_config={"version": 2})
    trainer.train()
    out["fsdp"] = {**_outcome(callback, Path(tmp) / "fsdp"), "sharded": trainer.is_fsdp_enabled}
    out["fsdp"]["how"] = str(trainer.accelerator.distributed_type)
    return out


@pytest.fixture(scope="module")
def hf_ranks(tmp_path_factory):
    return _run_job(_hf_worker, tmp_path_factory.mktemp("hf_fsdp"))


@pytest.fixture(scope="module")
def hf_unsharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_one")
    trainer, callback = _hf_trainer(folder, 2 * WORLD)
    trainer.train()
    return _outcome(callback, folder)


def test_hf_records_with_fsdp_full_shard_on_the_cpu_are_the_unsharded_runs(hf_ranks, hf_unsharded):
    """What a user who sets ``fsdp="full_shard"`` on the CPU gets: whatever accelerate makes of it, the numbers
    of the whole model."""
    import tiny_hf

    names = {name for name, _ in tiny_hf.model("gpt2").named_parameters()}
    _compare(hf_ranks, hf_unsharded, "fsdp", names)


def test_hf_trainer_shards_with_fsdp_on_the_cpu(hf_ranks):
    out = hf_ranks[0]
    if not out["fsdp"]["sharded"]:
        pytest.skip(
            f"🤗 fsdp='full_shard' with use_cpu=True trains as {out['fsdp']['how']} (accelerate turns FSDP on for "
            f"accelerator devices only); FSDP1's default config is refused: {out['fsdp1']['refused']}"
        )
    assert all(rank["fsdp"]["sharded"] for rank in hf_ranks)
