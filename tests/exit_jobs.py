"""The torchrun guide's DDP and FSDP scripts as 2-process gloo jobs, for the test and the benchmark of a clean exit.

The scripts are the guide's own (``docs/guides/torchrun.md``), ending as it shows them: ``monitor.close()`` and
``dist.destroy_process_group()``, no ``del``, no ``gc.collect()``. The FSDP1 jobs are the FSDP2 script with its
``fully_shard`` lines replaced by one ``FullyShardedDataParallel``. A job runs its two ranks as ``torchrun``
would start them (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set), without torchrun's agent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "torchrun.md"

#: the FSDP2 script's sharding, as the guide writes it
FULLY_SHARD = """for layer in (model[0], model[2]):
    fully_shard(layer)  # each layer's parameters in shards: rows 0-15 of the first on rank 0, ...
fully_shard(model)
"""


def _fsdp1(use_orig_params: bool) -> str:
    return (
        "from torch.distributed.fsdp import FullyShardedDataParallel\n\n"
        f"model = FullyShardedDataParallel(model, use_orig_params={use_orig_params}, device_id=torch.device('cpu'))\n"
    )


def guide_scripts() -> dict[str, str]:
    """The jobs by name: the guide's DDP and FSDP2 scripts, and FSDP1 with either ``use_orig_params``."""
    import re

    text = GUIDE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    ddp = next(b for b in blocks if "DistributedDataParallel(" in b)
    fsdp2 = next(b for b in blocks if "fully_shard(model)" in b)
    assert FULLY_SHARD in fsdp2, "the guide's FSDP2 script shards otherwise: update FULLY_SHARD"
    return {
        "DDP": ddp,
        "FSDP2": fsdp2,
        "FSDP1": fsdp2.replace(FULLY_SHARD, _fsdp1(False)),
        "FSDP1 use_orig_params": fsdp2.replace(FULLY_SHARD, _fsdp1(True)),
    }


def without_monitor(script: str) -> str:
    """The same job without the monitor: the script's lines that build, step, read or close it left out."""
    kept = [line for line in script.splitlines() if not any(w in line for w in ("onitor", "record"))]
    return "\n".join(kept) + "\n"


@dataclass(frozen=True)
class Job:
    """How a job ended: each rank's exit code and output (stdout and stderr together)."""

    codes: tuple[int, ...]
    outputs: tuple[str, ...]

    @property
    def aborted(self) -> bool:
        """A rank killed by SIGABRT (exit code −6), or one that said so ("terminate called ...")."""
        return any(c == -6 for c in self.codes) or any("terminate called" in out for out in self.outputs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(script: str, folder: Path, ranks: int = 2, timeout: float = 600.0) -> Job:
    """Run ``script`` in ``folder`` as a job of ``ranks`` processes of one thread each; a rank still running after
    ``timeout`` seconds is killed (exit code −9: failed, not aborted)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.py"
    path.write_text(script, encoding="utf-8")
    port = str(_free_port())
    processes = []
    for rank in range(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",  # as torchrun sets it
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, path.name], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outputs = []
    for p in processes:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out.decode(errors="replace"))
    return Job(tuple(p.returncode for p in processes), tuple(outputs))
