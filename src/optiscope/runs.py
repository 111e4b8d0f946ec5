"""Run directories and the I/O that must never lose results.

A run directory holds::

    DIR/config.json        the experiment's name and full configuration (written first)
    DIR/results.json       everything the figures need (written atomically at the end)
    DIR/metrics.jsonl      one JSON record per logged step (appended line by line; long runs)
    DIR/checkpoints/       training state to resume from (long runs)
    DIR/figures/*.png      drawn from results.json alone

Every whole-file write goes to a temporary file in the same directory, is flushed to disk, then renamed
over the target (``os.replace`` is atomic on POSIX and Windows): a killed run leaves either the old file
or the new one, never half of one. JSON may contain ``Infinity``/``NaN`` (a diverged loss); Python's
``json`` reads them back.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

CONFIG = "config.json"
RESULTS = "results.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
FIGURES = "figures"


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    return _atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(obj: Any) -> Any:
    """Tensors, numpy values, tuples, paths and dataclass-like objects as plain JSON types."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return to_jsonable(obj.tolist())
    if isinstance(obj, torch.dtype):
        return str(obj)
    return obj


def atomic_write_json(path: Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=1) + "\n")


def read_json(path: Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line. The line is a single ``write`` on an O_APPEND descriptor, so a
    reader (or a crash) sees whole lines only — at worst a final line cut short, which ``read_jsonl``
    skips."""
    line = (json.dumps(to_jsonable(record)) + "\n").encode("utf-8")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return  # a line still being written (or cut by a crash): not a record yet
            yield json.loads(line)


def truncate_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite ``path`` atomically with only the records ``keep`` accepts (used when resuming, so
    records logged after the checkpoint are not duplicated)."""
    path = Path(path)
    if path.exists():
        kept = [json.dumps(r) + "\n" for r in iter_jsonl(path) if keep(r)]
        atomic_write_text(path, "".join(kept))


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """``torch.save`` through a temporary file: the previous checkpoint survives a crash mid-write."""
    return _atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    # weights_only=False: checkpoints hold RNG states and configs written by this package
    return torch.load(path, map_location="cpu", weights_only=False)


def prepare_run_dir(out: Path, experiment: str, config: dict[str, Any], resume: bool = False) -> Path:
    """Create ``out`` and write ``config.json``. Refuses to overwrite another experiment's results.

    Re-running the same experiment into the same directory replaces its results; with ``resume`` the
    stored configuration must equal the new one (else resuming would mix two experiments).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} exists and is not a directory")
    existing = out / CONFIG
    if existing.exists():
        previous = read_json(existing)
        if previous.get("experiment") != experiment:
            raise FileExistsError(
                f"{out} holds a run of experiment {previous.get('experiment')!r}; choose another --out "
                f"for {experiment!r}"
            )
        if resume and previous.get("config") != to_jsonable(config):
            changed = sorted(
                k
                for k in set(previous["config"]) | set(config)
                if previous["config"].get(k) != to_jsonable(config).get(k)
            )
            raise ValueError(f"--resume {out}: the configuration differs from the stored one in {changed}")
    (out / FIGURES).mkdir(parents=True, exist_ok=True)
    atomic_write_json(existing, {"experiment": experiment, "config": config})
    return out


def is_rank_zero() -> bool:
    """True unless this is a non-zero rank of a distributed (torchrun) job: only rank 0 writes files."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0
