"""Run directories and the I/O that must never lose results.

A run directory holds exactly one run::

    DIR/config.json        the experiment's name and full configuration (written when the run starts)
    DIR/results.json       everything the figures need (written atomically at the end)
    DIR/metrics.jsonl      one JSON record per logged step (appended line by line; long runs)
    DIR/checkpoints/       training state to resume from (long runs)
    DIR/tensorboard/       TensorBoard event files (when the extra is installed)
    DIR/figures/*.png      drawn from results.json alone
    DIR/error.log          tracebacks of internal errors, figures that could not be drawn
    DIR/report.html        the page ``optiscope report DIR`` writes (a snapshot; ``--force`` removes it too)

``open_run`` is the lifecycle every command goes through: it locks the directory, refuses to mix two
runs in it (``--resume`` continues the one there, ``--force`` replaces it) and writes ``config.json``.

Every whole-file write goes to a temporary file in the same directory, is flushed to disk, then renamed
over the target (``os.replace`` is atomic on POSIX and Windows): a killed run leaves either the old file
or the new one, never half of one. A write the machine refuses (a full disk, a read-only folder) is a
``WriteError`` naming the file: bad input, not a bug. JSON may contain ``Infinity``/``NaN`` (a diverged
loss); Python's ``json`` reads them back.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import ujson

from .errors import UserError

CONFIG = "config.json"
RESULTS = "results.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
FIGURES = "figures"
TENSORBOARD = "tensorboard"
ERROR_LOG = "error.log"
REPORT = "report.html"  # the page ``optiscope report DIR`` writes by default


def checkpoint_name(label: str) -> str:
    """A file name for a run label ('adam@0.05' -> 'adam@0.05.pt'; characters unsafe in paths become _)."""
    return "".join(c if c.isalnum() or c in "@+-._" else "_" for c in label) + ".pt"


def _file_mode() -> int:
    """The mode ``open()`` would give a new file (0o666 less the umask); mkstemp's own is 0o600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


#: Why the machine refuses a write (a full disk or quota, a file-size limit, a read-only or forbidden place): no bug
#: of optiscope's, so a run's file that cannot be written for one of these is a ``WriteError``
REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def _refused_as_write_error(path: Path) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        refused = None if isinstance(e, WriteError) else _refusal(e)
        if refused is None:
            raise
        raise WriteError(path, refused) from e


def _refusal(error: BaseException | None) -> OSError | None:
    """The refused write (``REFUSED``) that ``error`` is, or that caused it (``torch.save``'s zip writer turns
    one into a ``RuntimeError`` of its own as it closes), or None."""
    seen = set()
    while error is not None and id(error) not in seen:  # (a chain can loop back on itself)
        if isinstance(error, OSError) and error.errno in REFUSED:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    path = Path(path)
    with _refused_as_write_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, _file_mode())
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
    if isinstance(obj, torch.Tensor | Path | torch.dtype) or hasattr(obj, "tolist"):
        return to_jsonable(_plain(obj))
    return obj


def _plain(obj: Any) -> Any:
    """A value JSON has no type for as one it has: a tensor or a NumPy value as numbers, a path or a dtype as its
    name (``json``'s ``default``)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().tolist()
    if isinstance(obj, Path | torch.dtype):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_json(obj: Any, indent: int | None = None) -> str:
    """``obj`` as JSON text, through ujson: it walks the dicts and lists in C and writes a float in its shortest
    round-tripping form about six times faster than ``json`` (a monitor's record of 15 tensors: 31 µs against
    174 µs), asking ``_plain`` only for what JSON has no type for. A non-finite number is written
    ``NaN``/``Infinity``, as ``json`` writes it, and a dict key that is not a string as ``str`` writes it."""
    return ujson.dumps(obj, indent=indent or 0, default=_plain, escape_forward_slashes=False)


def atomic_write_json(path: Path, obj: Any) -> Path:
    return atomic_write_text(path, to_json(obj, indent=1) + "\n")


def read_json(path: Path) -> Any:
    """The JSON document in ``path``; a missing or malformed file is a ``UserError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise RunDirError(f"{path} does not exist")
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path} is not valid JSON ({e})") from e


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line. The line is a single ``write`` on an O_APPEND descriptor, so a
    reader (or a crash) sees whole lines only — at worst a final line cut short, which ``read_jsonl``
    skips. A write the kernel cuts short (a full disk, a file-size limit) goes on with the rest, so that a
    record that could not be written raises here (``OSError``) rather than return as if it were."""
    line = (to_json(record) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    with _refused_as_write_error(path):
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:  # the run's first record: its folder is made then, not at every record
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o644)
        try:
            while line:
                line = line[os.write(fd, line) :]
        finally:
            os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records in ``path``, one per line (none if it does not exist). A last line cut short is not a record
    yet; a whole line that is not a JSON object (a damaged file) is a ``RunDirError`` naming the file and line."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # a line still being written (or cut by a crash): not a record yet
            yield _record(path, number, line)


def _record(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)  # UTF-8 bytes; JSONDecodeError and UnicodeDecodeError are ValueErrors
    except ValueError as e:
        record = e
    if not isinstance(record, dict):
        why = f"{type(record).__name__}: {record}" if isinstance(record, ValueError) else "not a JSON object"
        raise RunDirError(
            f"{path} line {number} is not a record ({why}); delete that line to keep the others, or use --force to "
            "replace the whole run"
        )
    return record


def truncate_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite ``path`` atomically with only the records ``keep`` accepts (used when resuming, so
    records logged after the checkpoint are not duplicated); left untouched when that is every record, written
    as they are (a refused resume must not look like one that wrote: ``open_run``)."""
    path = Path(path)
    if path.exists():
        data = path.read_bytes()
        whole = not data or data.endswith(b"\n")  # else a last line cut short
        records = list(iter_jsonl(path))
        kept = [r for r in records if keep(r)]
        if len(kept) < len(records) or not whole:
            atomic_write_text(path, "".join(to_json(r) + "\n" for r in kept))


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """``torch.save`` through a temporary file: the previous checkpoint survives a crash mid-write."""
    return _atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by ``save_checkpoint``; a missing, truncated or foreign file is a
    ``CheckpointError`` naming it (nothing is changed on disk)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        # weights_only=False: checkpoints hold RNG states and configs written by this package
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a bad file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(e).__name__}: {reason}); delete it to start that "
            "run afresh, or use --force to replace the whole run"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not an optiscope checkpoint")
    return state


# ----------------------------------------------------------------------------------------- lifecycle
class RunDirError(UserError):
    """A run directory that cannot be used as asked (the message says why and what to do)."""


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or not optiscope's."""


class WriteError(RunDirError, OSError):
    """A file that the machine would not let be written (``REFUSED``: a full disk, a read-only folder): bad input
    naming the file, and still an ``OSError`` (with the system's ``errno`` and ``strerror``) for code that
    handles a failed write itself."""

    def __init__(self, path: Path, error: OSError) -> None:
        OSError.__init__(self, error.errno, error.strerror, str(path))
        self.message = (
            f"cannot write {path} ({error.strerror}); free space there or make it writable: what was written before "
            "is intact, and --resume continues a run from its last checkpoint"
        )

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as it was made (a sweep's worker sends it back)
        return type(self), (self.filename, OSError(self.errno, self.strerror))


#: Files and folders a run owns: ``--force`` removes exactly these (experiments may own more). The report page
#: is one: left behind, it would show the replaced run as if it were the new one.
OWNED = (CONFIG, RESULTS, METRICS, CHECKPOINTS, FIGURES, TENSORBOARD, ERROR_LOG, REPORT)
LOCK = ".optiscope.lock"


@dataclass(frozen=True)
class RunDir:
    """An opened run directory: ``path``, and whether it continues a run that was already there."""

    path: Path
    experiment: str
    resuming: bool


def check_out(out: str | os.PathLike, name: str = "--out") -> Path:
    """A run directory's path given as ``name`` (``--out``, or ``DIR`` of ``plot``/``report``); an empty one is
    refused (it would silently mean the current directory)."""
    if not str(out).strip():
        example = "runs/lm" if name == "DIR" else f"{name} runs/lm"
        raise RunDirError(f"{name} is empty; give the run directory's path, e.g. {example}")
    return Path(out)


def require_directory(path: Path, give: str) -> None:
    """Refuse (``RunDirError``) a ``path`` that is no directory, saying which it is: missing, or a file; ``give``
    ends the message (what to give instead)."""
    if not Path(path).is_dir():
        what = "is a file, not a directory" if Path(path).exists() else "does not exist"
        raise RunDirError(f"{path} {what}; {give}")


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds something of a run: results, monitor records, or an optiscope config.json."""
    return any((path / name).is_file() for name in (RESULTS, METRICS)) or _is_run_config_file(path / CONFIG)


def resume_starts_afresh(path: Path, owned: Iterable[str] = ()) -> bool:
    """Whether ``--resume`` in ``path`` starts a new run there (``open_run``'s rule): ``path`` is no file and
    holds neither a config.json (its own run's, continued, or another program's, refused) nor other files a run
    owns (``OWNED`` plus ``owned``; refused without a config.json to say which run they belong to)."""
    if path.exists() and not path.is_dir():
        return False
    return not (path / CONFIG).exists() and not _present(path, (*OWNED, *owned))


@contextmanager
def open_run(
    out: str | os.PathLike,
    experiment: str,
    config: dict[str, Any],
    *,
    resume: bool = False,
    force: bool = False,
    ignored: Iterable[str] = (),
    owned: Iterable[str] = (),
    follows: dict[str, str] | None = None,
) -> Iterator[RunDir]:
    """Hold ``out`` as the one directory of one run of ``experiment`` for the duration of the block.

    * A lock (``flock``, released by the kernel even after ``kill -9``) makes a second process that
      opens the same directory fail within ``LOCK_GRACE_SECONDS``; ``in_progress`` tells a reader (the
      report) that a run is going on. Its file, ``LOCK``, is removed as the block ends, refused or not (only a
      process killed outright leaves it, unlocked).
    * A directory that holds another run is refused unless ``resume`` (continue it: the stored
      configuration must equal ``config`` except in the keys ``ignored``, which do not change results)
      or ``force`` (first remove every file the run owns: ``OWNED`` plus ``owned``); both at once are refused.
      A refused resume names each differing option, and for one in ``follows`` (a key's default follows
      another option) says which.
    * ``config.json`` is written when the run starts. If the block fails with a ``UserError`` before
      anything else was written, it is removed again: the directory never describes a run it does not hold.
    """
    if resume and force:
        raise RunDirError("--resume continues the run in --out and --force replaces it; give one of them")
    path = check_out(out)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path} exists and is not a directory")
    # the folders this run creates, deepest first, removed again if it is refused; none for a path through
    # "..", whose folders by name are not the ones mkdir makes (a user's folder could be taken for one)
    created = [] if ".." in path.parts else [d for d in (path, *path.parents) if not d.exists()]
    owned = (*OWNED, *owned)
    with _locked(path, created=created):
        stored = _stored_config(path)
        present = _present(path, owned)
        resuming = False
        if resume and stored is not None:
            _check_resumable(path, stored, experiment, config, set(ignored), follows or {})
            resuming = True
        elif resume and present:
            raise RunDirError(
                f"--resume: {path} holds {', '.join(present)} but no {CONFIG}, so it cannot tell which run to "
                "continue; use --force to replace it"
            )
        elif present and force:
            busy = [d for name in present for d in _folders_deepest_first(path / name) if in_progress(d)]
            if busy:  # a trial of a killed sweep whose worker still runs: removing its files would share its folder
                raise RunDirError(
                    f"--force: {busy[0]} is in use by another optiscope process; stop it, then run this again"
                )
            for name in present:
                _remove(path / name)
        elif present and not resume:
            what = f"a run of {stored['experiment']!r}" if stored else f"files of a run ({', '.join(present)})"
            raise RunDirError(
                f"{path} already holds {what}; pass --resume to continue it, --force to replace it, "
                "or choose another --out"
            )
        original = (path / CONFIG).read_bytes() if resuming else b""
        atomic_write_json(path / CONFIG, _config_record(stored if resuming else None, experiment, config))
        written = _last_written(path, owned)
        try:
            yield RunDir(path, experiment, resuming)
        except BaseException as e:
            # bad input, memory that ran out or an interrupt before the run wrote anything: the directory is
            # left free for the corrected command (an error.log alone holds no run)
            if not resuming and _present(path, owned) == [CONFIG]:
                (path / CONFIG).unlink()
            elif resuming and isinstance(e, UserError) and _last_written(path, owned) == written:
                # a resume refused before it wrote anything (a damaged checkpoint, a corpus gone): it did not
                # happen, so config.json is again what it was, without the resumed_with entry written for it
                atomic_write_bytes(path / CONFIG, original)
            raise


def _config_record(stored: dict[str, Any] | None, experiment: str, config: dict[str, Any]) -> dict[str, Any]:
    """What config.json holds: the run's configuration as it started, and for a resumed run, under
    ``resumed_with``, one entry per resume holding the options it gave other values (those that do not change
    results, such as --threads), so that the file does not say the whole run had the last resume's."""
    if stored is None:
        return {"experiment": experiment, "config": config}
    started = stored["config"]
    changed = {k: v for k, v in to_jsonable(config).items() if k in started and started[k] != v}
    return {**stored, "resumed_with": [*stored.get("resumed_with", []), changed]}


#: files a run writes whether or not it does any work: its config.json, error.log and lock, and those of the runs
#: it holds (a sweep's trials), which a refused resume writes too
BOOKKEEPING = (CONFIG, ERROR_LOG, LOCK)


def _last_written(path: Path, owned: Iterable[str]) -> int:
    """The latest modification time (ns) of the files a run owns in ``path``, its bookkeeping aside (0 for none):
    it moves when the run writes any result, record, checkpoint or figure."""
    entries = [path / name for name in owned]
    files = [f for e in entries for f in ([e] if e.is_file() else e.rglob("*") if e.is_dir() else [])]
    times = []
    for f in files:
        if f.name in BOOKKEEPING or f.is_dir():
            continue
        with suppress(OSError):  # removed meanwhile
            times.append(f.stat().st_mtime_ns)
    return max(times, default=0)


def _present(path: Path, owned: Iterable[str]) -> list[str]:
    """The names in ``owned`` that hold something of a run in ``path``: a file other than ``error.log``, or a
    folder with a file in it other than a lock (a nested run that stopped before it wrote anything)."""

    def holds(entry: Path) -> bool:
        if entry.is_dir() and not entry.is_symlink():
            return any(f.name != LOCK for f in entry.rglob("*") if not f.is_dir())
        return entry.exists() and entry.name != ERROR_LOG

    return [name for name in owned if holds(path / name)]


def in_progress(path: Path) -> bool:
    """Whether a process holds the lock of the run directory ``path`` now: a run going on, not one that was
    interrupted or failed. Tested without writing anything there, by a shared lock taken and given back at once
    (which a run starting in that instant waits out: ``LOCK_GRACE_SECONDS``)."""
    try:
        fd = os.open(Path(path) / LOCK, os.O_RDONLY)
    except OSError:  # no lock file: no run ever held the directory (or it cannot be read: none known to)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing the descriptor gives back a lock it took
    return False


LOCK_GRACE_SECONDS = 1.0  # how long a starting run waits for a lock held for an instant (``in_progress``)


@contextmanager
def _locked(path: Path, *, created: Sequence[Path] = ()) -> Iterator[None]:
    """Hold the lock of the run directory ``path`` (created if need be) for the block; the lock file is there only
    while it is held, so a run directory keeps only what its runs wrote. If the block is refused (a
    ``UserError``), ``path`` is among ``created`` (the folders the caller found missing, deepest first) and it
    holds nothing but the lock, those folders are removed again: a refused command leaves no trace. (Any other
    error keeps them: the command line writes its traceback there.)"""
    fd = _acquire(path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    except UserError:
        if path in created and os.listdir(path) == [LOCK]:
            with suppress(OSError):  # a folder that another process has written in since stays
                (path / LOCK).unlink()
                for folder in created:
                    folder.rmdir()
        raise
    finally:
        # removed while still held: a process that opened the file meanwhile finds it gone once it gets the lock,
        # and takes a fresh one (_acquire), so two processes never hold one directory
        with suppress(OSError):
            if _is_lock_file(fd, path / LOCK):
                (path / LOCK).unlink()
        os.close(fd)  # closing the descriptor releases the lock


def _acquire(path: Path) -> int:
    """A descriptor of ``path``'s lock file, locked exclusively (within ``LOCK_GRACE_SECONDS``)."""
    deadline = time.monotonic() + LOCK_GRACE_SECONDS
    while True:
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            made = path.is_dir()
            if isinstance(e, FileNotFoundError) and not made and time.monotonic() < deadline:
                continue  # a refused run removed the folder it had made (``_locked``) between our mkdir and open
            what = "write in" if made else "create"
            raise RunDirError(f"cannot {what} the run directory --out {path}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() < deadline:
                os.close(fd)
                time.sleep(0.01)
                continue
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(
                f"{path} is in use by another optiscope run ({holder}); wait for it to finish or choose another --out"
            ) from None
        if _is_lock_file(fd, path / LOCK):
            return fd
        os.close(fd)  # the holder removed the lock file (and the directory) before it let go: take a fresh one


def _is_lock_file(fd: int, lock: Path) -> bool:
    try:
        named = os.stat(lock)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def is_run_config(stored: Any) -> bool:
    """Whether ``stored`` (a config.json's content) is an optiscope run's: ``{"experiment", "config"}``."""
    return (
        isinstance(stored, dict)
        and isinstance(stored.get("experiment"), str)
        and isinstance(stored.get("config"), dict)
    )


def _stored_config(path: Path) -> dict[str, Any] | None:
    """The run configuration in ``path``, None without one. Another program's config.json (a 🤗 model's, a
    damaged file) is refused whatever the flags: ``--force`` removes a run's files, and this one is not."""
    if not (path / CONFIG).exists():
        return None
    try:
        stored = read_json(path / CONFIG)
    except RunDirError:
        stored = None
    if not is_run_config(stored):
        raise RunDirError(
            f"{path / CONFIG} is not an optiscope run configuration (another program's file?) and optiscope leaves "
            "it alone; choose another --out"
        )
    return stored


def _check_resumable(
    path: Path,
    stored: dict[str, Any],
    experiment: str,
    config: dict[str, Any],
    ignored: set[str],
    follows: dict[str, str],
) -> None:
    if stored["experiment"] != experiment:
        raise RunDirError(
            f"--resume: {path} holds a run of {stored['experiment']!r}, not {experiment!r}; choose another --out"
        )
    new, old = _as_flags(to_jsonable(config)), _as_flags(stored["config"])
    ignored = set(_as_flags(dict.fromkeys(ignored)))
    changed = sorted(k for k in set(old) | set(new) if k not in ignored and old.get(k) != new.get(k))
    if changed:
        sources = {"--" + key.replace("_", "-"): source for key, source in follows.items()}
        said = {k: f", as it follows {source} unless given" for k, source in sources.items() if source in changed}
        shown = "; ".join(f"{k} {old.get(k)!r} → {new.get(k)!r}{said.get(k, '')}" for k in changed)
        raise RunDirError(
            f"--resume {path}: the options differ from the stored run's ({shown}); give the stored values to "
            "continue it, or --force to start a new run"
        )


def _as_flags(config: dict[str, Any]) -> dict[str, Any]:
    """A stored configuration keyed as the command line names it: ``weight_decay`` as ``--weight-decay``; a
    sweep's ``options`` (its experiment's own) one by one; its ``experiment`` as the word, not a flag."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if key == "options" and isinstance(value, dict):
            flat.update(_as_flags(value))
        else:
            flat[key if key == "experiment" else "--" + key.replace("_", "-")] = value
    return flat


#: What a run writes inside the folders it owns: ``--force`` removes these and leaves a file of the user's
#: (notes beside the figures) where it is. Atomic writes leave ``.*.tmp`` only when killed mid-write.
WRITTEN_IN = {
    FIGURES: ("*.png", ".*.tmp"),
    CHECKPOINTS: ("*.pt", ".*.tmp"),
    TENSORBOARD: ("events.out.tfevents.*",),
}


def _remove(path: Path) -> None:
    """Removes what the run wrote at ``path``: a file, the run's own files in a folder of ``WRITTEN_IN``, or in
    any other folder (a sweep's trials, entropy's nested ``lm`` run) what the run directories inside it wrote;
    then the folders left empty. A file of the user's stays, as does another program's config.json."""
    if not (path.is_dir() and not path.is_symlink()):
        path.unlink()
        return
    patterns = WRITTEN_IN.get(path.name)
    if patterns is None:
        for folder in _folders_deepest_first(path):
            for name in (*OWNED, LOCK):
                entry = folder / name
                if name == CONFIG and not _is_run_config_file(entry):
                    continue  # none, or another program's: left alone
                if name in WRITTEN_IN and entry.is_dir() and not entry.is_symlink():
                    _remove(entry)
                elif entry.is_file() or entry.is_symlink():
                    entry.unlink()
    else:
        for pattern in patterns:
            for found in path.rglob(pattern):
                if found.is_file() or found.is_symlink():
                    found.unlink()
    for folder in _folders_deepest_first(path):
        if folder.is_dir() and not any(folder.iterdir()):  # deepest first, so a folder emptied of folders goes too
            folder.rmdir()


def _folders_deepest_first(path: Path) -> list[Path]:
    folders = [path, *(d for d in path.rglob("*") if d.is_dir() and not d.is_symlink())]
    return sorted(folders, key=lambda d: -len(d.parts))


def _is_run_config_file(path: Path) -> bool:
    """Whether ``path`` is an optiscope run's config.json (not missing, damaged or another program's)."""
    try:
        return is_run_config(read_json(path))
    except RunDirError:  # none, or not JSON
        return False


def stored_run_config(path: str | os.PathLike) -> dict[str, Any] | None:
    """The content of the run directory ``path``'s config.json (``{"experiment", "config"}``); None where it has
    none, or one that is damaged or another program's."""
    return read_json(Path(path) / CONFIG) if _is_run_config_file(Path(path) / CONFIG) else None


def write_error_log(directory: Path | None, what: str, text: str) -> Path:
    """Append ``text`` (a traceback) under a dated heading to ``directory/error.log`` (the temporary
    directory when there is no run directory); returns the log's path."""
    entry = f"== {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{text.rstrip()}\n\n"
    places = [Path(directory)] if directory is not None and Path(directory).is_dir() else []
    for place in [*places, Path(tempfile.gettempdir())]:  # a directory that cannot be written: the temporary one
        log = place / ERROR_LOG
        try:
            with log.open("a", encoding="utf-8") as f:
                f.write(entry)
            return log
        except OSError:
            continue
    raise OSError(f"cannot write {ERROR_LOG} in {directory} or {tempfile.gettempdir()}")


def rank() -> int:
    """This process's rank in a distributed (torchrun) job: the process group's once joined, torchrun's
    ``RANK`` before; 0 outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK") or 0)


def world_size() -> int:
    """The processes of the distributed (torchrun) job this one belongs to (1 outside one), as ``rank``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE") or 1)


def is_rank_zero() -> bool:
    """True unless this is a non-zero rank of a distributed (torchrun) job: only rank 0 writes files."""
    return rank() == 0
