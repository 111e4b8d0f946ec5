"""Run-directory I/O: atomic writes survive a crash mid-write; JSONL readers see whole lines only."""

import errno
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optiscope import runs


def test_atomic_write_keeps_old_file_when_writer_dies(tmp_path):
    target = tmp_path / "results.json"
    runs.atomic_write_json(target, {"v": 1})

    def dying_writer(f):
        f.write(b'{"v": 2, "half')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        runs._atomic_write(target, dying_writer)
    assert runs.read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left behind


def test_atomic_writes_get_the_mode_of_a_plain_write(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    written = runs.atomic_write_text(tmp_path / "atomic.txt", "x")
    assert written.stat().st_mode == plain.stat().st_mode


def test_json_round_trips_tensors_and_non_finite(tmp_path):
    path = runs.atomic_write_json(tmp_path / "r.json", {"t": torch.tensor([1.0, 2.0]), "loss": math.inf, "n": (1, 2)})
    back = runs.read_json(path)
    assert back["t"] == [1.0, 2.0] and back["loss"] == math.inf and back["n"] == [1, 2]


def test_to_json_writes_what_the_plain_copy_would(tmp_path):
    """The fast encoder (ujson's, asking only for what it has no type for) against ``json`` on the plain copy
    ``to_jsonable`` builds, on every kind a record or a result holds; a key json refuses is written as ``str``
    writes it; floats read back exactly."""
    import numpy as np

    value = {
        "t": torch.tensor([[1.5, -2.0]]), "t0": torch.tensor(3, dtype=torch.int64), "f32": np.float32(0.1),
        "f64": np.float64(1 / 3), "i": np.int64(7), "b": np.bool_(True), "a": np.arange(3.0), "p": tmp_path,
        "dtype": torch.bfloat16, "nested": [({"x": (1, math.nan)}, -math.inf)], 3: "int key", "s": "é",
    }  # fmt: skip
    for indent in (None, 1):  # the same JSON; its spacing is the encoder's
        assert json.dumps(json.loads(runs.to_json(value, indent))) == json.dumps(runs.to_jsonable(value))
    assert json.loads(runs.to_json({("a", 1): 1.0})) == {"('a', 1)": 1.0}
    floats = torch.randn(10_000, dtype=torch.float64).mul(torch.logspace(-300, 300, 10_000, dtype=torch.float64))
    assert json.loads(runs.to_json(floats.tolist())) == floats.tolist()  # shortest forms that read back exactly
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        runs.to_json({"x": object()})


def test_jsonl_appends_and_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in range(3):
        runs.append_jsonl(path, {"step": step})
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # a writer killed mid-line
    assert [r["step"] for r in runs.read_jsonl(path)] == [0, 1, 2]
    runs.truncate_jsonl(path, lambda r: r["step"] < 2)
    assert runs.read_jsonl(path) == [{"step": 0}, {"step": 1}] and path.read_text().endswith("}\n")


def test_a_rewind_that_keeps_every_record_leaves_the_file_as_written(tmp_path):
    """Lines as ``json`` spaced them (an earlier version's file) stay byte for byte; a torn last line alone goes, so
    that the next record does not join it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 2.5}\n{"step": 1, "loss": NaN}\n')
    before = path.read_bytes()
    runs.truncate_jsonl(path, lambda r: True)
    assert path.read_bytes() == before
    with open(path, "a") as f:
        f.write('{"step": 2, "lo')
    runs.truncate_jsonl(path, lambda r: True)
    runs.append_jsonl(path, {"step": 2})
    assert [r["step"] for r in runs.read_jsonl(path)] == [0, 1, 2]


FULL = """
import resource, signal, sys
from pathlib import Path
from optiscope import runs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit is then cut short, and the next fails
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
for step in range(10):
    try:
        runs.append_jsonl(Path(sys.argv[1]), {"step": step, "loss": 1.25})
    except OSError:
        print(step)
        break
"""


def test_an_appended_record_that_did_not_fit_raises(tmp_path):
    """With the file's size limited by the kernel (as a full disk does), every record ``append_jsonl`` returned
    for is in the file: the first one that did not fit raises, not the one after it."""
    path = tmp_path / "metrics.jsonl"
    done = subprocess.run([sys.executable, "-c", FULL, str(path)], capture_output=True, text=True, timeout=60)
    failed = int(done.stdout)
    assert [r["step"] for r in runs.read_jsonl(path)] == list(range(failed))


LIMITED = """
import pickle, resource, signal, sys
from pathlib import Path
import torch
from optiscope import runs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
path = Path(sys.argv[1])
for write in (lambda: runs.save_checkpoint(path, {"w": torch.zeros(4096)}), lambda: runs.append_jsonl(
    path.with_suffix(".jsonl"), {"x": "y" * 5000})):
    try:
        write()
    except runs.RunDirError as e:
        back = pickle.loads(pickle.dumps(e))  # as a sweep's worker sends it back
        print(isinstance(e, OSError), e.errno, e.strerror, str(back) == str(e), "|", str(e))
"""


def test_a_file_the_machine_will_not_let_be_written_is_bad_input_naming_it(tmp_path):
    """A write the kernel refuses (here a file-size limit; a full disk alike) is a ``RunDirError`` naming the file
    (exit 2 on the command line, not "a bug in optiscope"), still an OSError with the system's errno; the
    checkpoint written before is intact."""
    path = tmp_path / "ckpt.pt"
    runs.save_checkpoint(path, {"w": torch.ones(3)})
    done = subprocess.run([sys.executable, "-c", LIMITED, str(path)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stderr
    for line, name in zip(lines, (path, path.with_suffix(".jsonl")), strict=True):
        assert line.startswith(f"True {errno.EFBIG} File too large True | cannot write {name} (File too large)")
    assert torch.equal(runs.load_checkpoint(path)["w"], torch.ones(3))


@pytest.mark.parametrize(
    "line, why",
    [
        (b'{"step": 1, "lo\n', "JSONDecodeError"),  # a torn line that later appends ended
        (b"\xff\xfe\n", "UnicodeDecodeError"),
        (b"[1, 2]\n", "not a JSON object"),
    ],
)
def test_a_damaged_jsonl_line_is_bad_input_naming_the_file_and_line_and_left_alone(tmp_path, line, why):
    """A whole line that is not a record is refused by name (exit 2 on the command line), not a traceback; the
    rewind that resuming does (``truncate_jsonl``) leaves the file as it was rather than drop the line."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n' + line + b'{"step": 2}\n')
    before = path.read_bytes()
    for read in (runs.read_jsonl, lambda p: runs.truncate_jsonl(p, lambda r: True)):
        with pytest.raises(runs.RunDirError, match=f"line 2 is not a record .*{why}") as error:
            read(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert path.read_bytes() == before


def test_checkpoint_round_trip(tmp_path):
    state = {"model": {"w": torch.arange(3.0)}, "rng": torch.get_rng_state(), "step": 7}
    runs.save_checkpoint(tmp_path / "ckpt.pt", state)
    back = runs.load_checkpoint(tmp_path / "ckpt.pt")
    assert back["step"] == 7 and torch.equal(back["model"]["w"], state["model"]["w"])
    with pytest.raises(runs.CheckpointError, match="no checkpoint at"):
        runs.load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign"])
def test_a_damaged_checkpoint_is_an_error_naming_the_file(tmp_path, damage):
    path = tmp_path / "adam.pt"
    runs.save_checkpoint(path, {"model": {"w": torch.randn(500)}})
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"not a checkpoint at all")
    else:
        torch.save([1, 2, 3], path)
    before = path.read_bytes()
    with pytest.raises(runs.CheckpointError) as error:
        runs.load_checkpoint(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert path.read_bytes() == before  # nothing was overwritten


def test_read_json_names_the_file(tmp_path):
    (tmp_path / "r.json").write_text('{"a": ')
    with pytest.raises(runs.RunDirError, match=r"r\.json is not valid JSON"):
        runs.read_json(tmp_path / "r.json")
    with pytest.raises(runs.RunDirError, match="does not exist"):
        runs.read_json(tmp_path / "none.json")


def test_open_run_refuses_another_experiments_dir_and_changed_options(tmp_path):
    with runs.open_run(tmp_path / "a", "rare-tokens", {"steps": 10, "quiet": False}):
        pass
    with (
        pytest.raises(runs.RunDirError, match="already holds a run of 'rare-tokens'"),
        runs.open_run(tmp_path / "a", "landscapes", {}),
    ):
        pass
    with (
        pytest.raises(runs.RunDirError, match="holds a run of 'rare-tokens', not 'landscapes'"),
        runs.open_run(tmp_path / "a", "landscapes", {}, resume=True),
    ):
        pass
    with (
        pytest.raises(runs.RunDirError, match="--steps 10 → 20"),
        runs.open_run(tmp_path / "a", "rare-tokens", {"steps": 20, "quiet": False}, resume=True),
    ):
        pass
    with runs.open_run(
        tmp_path / "a", "rare-tokens", {"steps": 10, "quiet": True}, resume=True, ignored=["quiet"]
    ) as run:
        assert run.resuming


def test_a_refused_resume_says_which_differing_option_follows_another(tmp_path):
    """--warmup-steps was never given: its value follows --steps, and the message says so rather than ask for it."""
    with runs.open_run(tmp_path, "lm", {"steps": 1000, "warmup_steps": 100}):
        runs.atomic_write_json(tmp_path / "results.json", {})
    follows = {"warmup_steps": "--steps"}
    resumed = runs.open_run(tmp_path, "lm", {"steps": 300, "warmup_steps": 30}, resume=True, follows=follows)
    with pytest.raises(runs.RunDirError) as refused, resumed:
        pass
    assert "(--steps 1000 → 300; --warmup-steps 100 → 30, as it follows --steps unless given)" in str(refused.value)
    # given, and changed on its own: the message does not say it follows --steps
    resumed = runs.open_run(tmp_path, "lm", {"steps": 1000, "warmup_steps": 50}, resume=True, follows=follows)
    with pytest.raises(runs.RunDirError) as refused, resumed:
        pass
    assert "(--warmup-steps 100 → 50)" in str(refused.value)


@pytest.mark.parametrize("error", [MemoryError, ValueError, KeyboardInterrupt, runs.RunDirError])
def test_a_run_that_wrote_nothing_leaves_the_directory_free(tmp_path, error):
    """config.json goes again when the block fails before writing anything; an error.log (the traceback the
    command line keeps) and a nested run's lock file hold no run."""
    with pytest.raises(error), runs.open_run(tmp_path, "a", {"x": 1}, owned=["nested"]):
        (tmp_path / "nested").mkdir()
        (tmp_path / "nested" / runs.LOCK).write_text("pid 1")
        runs.write_error_log(tmp_path, "a", "Traceback ...")
        raise error("stopped")
    assert not (tmp_path / "config.json").exists()
    with runs.open_run(tmp_path, "b", {"x": 2}, owned=["nested"]):  # another run, no --force needed
        pass
    assert runs.read_json(tmp_path / "config.json")["experiment"] == "b"


def test_a_refused_run_removes_the_folders_it_created_and_only_those(tmp_path):
    """A run refused before it wrote anything leaves no folder (nor a lock file) that was not there before."""
    out = tmp_path / "runs" / "new" / "a"
    (tmp_path / "runs").mkdir()
    with pytest.raises(runs.RunDirError), runs.open_run(out, "a", {"x": 1}):
        raise runs.RunDirError("--hf-model /nowhere does not exist")
    assert list(tmp_path.iterdir()) == [tmp_path / "runs"] and list((tmp_path / "runs").iterdir()) == []
    with pytest.raises(runs.RunDirError), runs.open_run(tmp_path / "runs", "a", {"x": 1}):
        raise runs.RunDirError("refused")
    assert (tmp_path / "runs").is_dir()  # it was there before the run


def test_a_run_whose_lock_file_is_removed_before_it_locks_takes_a_fresh_one(tmp_path, monkeypatch):
    """A refused run removes its new folder while it holds the lock. A run that opened that lock file just
    before must not end up holding the removed file's lock: a third run could then lock a new file and share
    the folder. Here the removal falls between the open and the flock."""
    import fcntl

    out = tmp_path / "a"
    real_flock, removed = fcntl.flock, []

    def flock_after_the_holder_left(fd, operation):
        if not removed:  # the holder's cleanup, in the instant before this process gets the lock
            (out / runs.LOCK).unlink()
            out.rmdir()
            removed.append(True)
        return real_flock(fd, operation)

    monkeypatch.setattr(runs.fcntl, "flock", flock_after_the_holder_left)
    fd = runs._acquire(out)
    try:
        assert removed and (out / runs.LOCK).is_file() and runs._is_lock_file(fd, out / runs.LOCK)
    finally:
        os.close(fd)


def test_a_refused_run_through_dotdot_removes_no_folder_of_the_users(tmp_path, monkeypatch):
    """'new/../mine/run': the folders by name are not those mkdir makes; the user's empty folder must stay."""
    monkeypatch.chdir(tmp_path)
    Path("mine").mkdir()
    with pytest.raises(runs.RunDirError), runs.open_run("new/../mine/run", "a", {"x": 1}):
        raise runs.RunDirError("refused")
    assert Path("mine").is_dir()


def test_a_run_whose_new_folder_is_removed_between_mkdir_and_open_makes_it_again(tmp_path, monkeypatch):
    out, real_open, removed = tmp_path / "a", os.open, []

    def open_after_the_folder_went(path, *args):
        if not removed:  # a refused run's cleanup, in the instant between this process's mkdir and open
            out.rmdir()
            removed.append(True)
        return real_open(path, *args)

    monkeypatch.setattr(runs.os, "open", open_after_the_folder_went)
    fd = runs._acquire(out)
    try:
        assert removed and runs._is_lock_file(fd, out / runs.LOCK)
    finally:
        os.close(fd)


def test_force_is_refused_while_a_nested_run_is_held(tmp_path):
    """A killed sweep's worker may still run its trial: --force must not clear that folder under it."""
    import fcntl

    trial = tmp_path / "trials" / "sgd@0.1" / "seed-0"
    with runs.open_run(tmp_path, "sweep", {"seeds": 1}, owned=["trials"]), runs.open_run(trial, "landscapes", {}):
        runs.atomic_write_json(trial / "results.json", {})
    held = os.open(tmp_path / "trials" / "sgd@0.1" / "seed-0" / runs.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # the orphaned worker, which took the folder again
    try:
        refused = pytest.raises(runs.RunDirError, match=r"--force: .*seed-0 is in use by another optiscope process")
        with refused, runs.open_run(tmp_path, "sweep", {"seeds": 2}, force=True, owned=["trials"]):
            pass
        assert (tmp_path / "trials" / "sgd@0.1" / "seed-0" / "results.json").is_file()
    finally:
        os.close(held)


def test_a_run_that_wrote_something_keeps_its_config(tmp_path):
    with pytest.raises(ValueError), runs.open_run(tmp_path, "a", {"x": 1}):
        (tmp_path / "metrics.jsonl").write_text("{}\n")
        raise ValueError("late")
    with pytest.raises(runs.RunDirError, match="already holds a run of 'a'"), runs.open_run(tmp_path, "b", {}):
        pass


def test_force_clears_the_runs_nested_in_a_folder_and_leaves_the_users_files(tmp_path):
    """A sweep's trials/ holds run directories: --force removes what they wrote (then the folders left empty),
    not a file of the user's among them nor another program's config.json."""
    with runs.open_run(tmp_path, "sweep", {"seeds": 1}, owned=["trials"]):
        for trial in ("adam@0.01/seed-0", "adam@0.1/seed-0"):
            with runs.open_run(tmp_path / "trials" / trial, "landscapes", {"steps": 5}):
                runs.atomic_write_json(tmp_path / "trials" / trial / "results.json", {"v": 1})
                runs.atomic_write_bytes(tmp_path / "trials" / trial / "figures" / "surfaces.png", b"png")
    (tmp_path / "trials" / "mine.txt").write_text("the user's notes")
    (tmp_path / "trials" / "adam@0.1" / "seed-0" / "figures" / "mine.svg").write_text("<svg/>")
    (tmp_path / "trials" / "model").mkdir()
    (tmp_path / "trials" / "model" / "config.json").write_text('{"model_type": "gpt2"}')
    with runs.open_run(tmp_path, "sweep", {"seeds": 2}, force=True, owned=["trials"]):
        pass
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "trials").rglob("*") if p.is_file())
    assert left == ["trials/adam@0.1/seed-0/figures/mine.svg", "trials/mine.txt", "trials/model/config.json"]
    assert not (tmp_path / "trials" / "adam@0.01").exists()  # emptied, so removed


@pytest.mark.parametrize("content", ['{"model_type": "gpt2"}', "not json"])
def test_another_programs_config_is_left_alone_even_with_force(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    for flags in ({}, {"force": True}, {"resume": True}):
        refused = pytest.raises(runs.RunDirError, match="not an optiscope run configuration.*choose another --out")
        with refused as e, runs.open_run(tmp_path, "a", {}, **flags):
            pass
        assert "--force" not in str(e.value)
    assert (tmp_path / "config.json").read_text() == content


def test_a_directory_that_cannot_be_written_is_bad_input(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: take a directory no one can write in
            locked = Path("/proc/self")
        with pytest.raises(runs.RunDirError, match="cannot write in the run directory"), runs.open_run(locked, "a", {}):
            pass
        log = runs.write_error_log(locked, "a", "Traceback ...")  # falls back to the temporary directory
        assert log.parent != locked and "Traceback ..." in log.read_text()
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_the_lock_is_released_when_the_holder_dies(tmp_path):
    """flock belongs to the process: a run killed with -9 leaves no stale lock behind."""
    import subprocess
    import sys

    code = f"from optiscope import runs; import os\nwith runs.open_run({str(tmp_path)!r}, 'x', {{}}):\n    os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    with runs.open_run(tmp_path, "x", {}, resume=True):
        pass


def test_in_progress_while_a_process_holds_the_run_and_probing_writes_nothing(tmp_path):
    """The report tells a run going on from one that stopped by the lock: held while the run's process lives
    (here another process, as a run in a terminal would be), free once it is killed."""
    import subprocess
    import sys

    assert not runs.in_progress(tmp_path) and list(tmp_path.iterdir()) == []  # no lock file made by asking
    code = (
        "from optiscope import runs; import sys\n"
        "with runs.open_run(sys.argv[1], 'x', {}):\n    print('held', flush=True)\n    sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert runs.in_progress(tmp_path) and runs.in_progress(tmp_path)  # asking twice leaves it held
    finally:
        holder.kill()
        holder.wait()
    assert not runs.in_progress(tmp_path)


def test_a_run_that_starts_while_a_reader_probes_the_lock_waits_it_out(tmp_path):
    """A reader (``in_progress``) holds the lock for an instant; a run starting then must not be refused."""
    import fcntl
    import threading

    fd = os.open(tmp_path / runs.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.2, os.close, (fd,)).start()  # closing gives the lock back, well within the grace
    with runs.open_run(tmp_path, "x", {}):
        assert runs.in_progress(tmp_path)


def test_no_lock_file_is_left_after_a_run_ends_or_is_refused(tmp_path):
    """The lock file is there while a process holds the directory, and only then: not after a finished run, a run
    that failed, nor a run refused for another program's config.json or for a finished run's files (they had
    each left a .optiscope.lock naming a process that had exited)."""
    finished, failed, foreign = tmp_path / "finished", tmp_path / "failed", tmp_path / "foreign"
    with runs.open_run(finished, "a", {"x": 1}):
        assert (finished / runs.LOCK).is_file()  # held
        runs.atomic_write_json(finished / runs.RESULTS, {"x": 1})
    with pytest.raises(runs.RunDirError, match="already holds a run of 'a'"), runs.open_run(finished, "a", {}):
        pass
    with pytest.raises(ValueError), runs.open_run(failed, "a", {"x": 1}):
        runs.atomic_write_json(failed / runs.RESULTS, {"partial": True})
        raise ValueError("an internal error")
    foreign.mkdir()
    (foreign / runs.CONFIG).write_text('{"model_type": "gpt2"}')
    with pytest.raises(runs.RunDirError, match="not an optiscope run configuration"), runs.open_run(foreign, "a", {}):
        pass
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == [
        "failed/config.json",
        "failed/results.json",
        "finished/config.json",
        "finished/results.json",
        "foreign/config.json",
    ]


def test_holders_that_take_and_leave_one_directory_never_hold_it_together(tmp_path):
    """The lock file goes as each holder lets go, and a holder that opened it meanwhile must not end up holding it
    beside one that took a fresh file. Three holders take the directory 40 times each, each through a file
    descriptor of its own (flock locks an open file, so threads contend as processes do); the oracle is the log
    they write while holding it: every "in" is followed by the same holder's "out"."""
    import threading
    import time

    out, log = tmp_path / "run", []

    def take_turns(me: int) -> None:
        turns = 40
        while turns:
            try:
                with runs._locked(out):
                    log.append(("in", me))
                    time.sleep(0.001)
                    log.append(("out", me))
                turns -= 1
            except runs.RunDirError:  # in use past the grace: try again
                pass

    holders = [threading.Thread(target=take_turns, args=(me,)) for me in range(3)]
    for holder in holders:
        holder.start()
    for holder in holders:
        holder.join(timeout=120)
    assert len(log) == 2 * 3 * 40
    for entered, left in zip(log[::2], log[1::2], strict=True):
        assert entered[0] == "in" and left == ("out", entered[1]), (entered, left)
    assert list(out.iterdir()) == []  # and no lock file once all have left


def test_rank_zero_from_environment(monkeypatch):
    monkeypatch.setitem(os.environ, "RANK", "1")
    assert not runs.is_rank_zero()
    monkeypatch.setitem(os.environ, "RANK", "0")
    assert runs.is_rank_zero()
