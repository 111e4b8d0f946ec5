"""A real ``optiscope sweep --workers 2`` process killed while its trials run: none of its processes outlives it
(SIGTERM, Ctrl-C: by the time it has ended; SIGKILL: they notice their parent gone and stop), and an immediate
``--resume`` finishes every trial without recording a crash. The oracle is the kernel's process table (/proc)
and the files the sweep leaves."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optiscope import runs

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads the process table from /proc")

TESTS = Path(__file__).resolve().parents[1]
#: generous deadlines (a loaded machine), never a claim about speed
DEADLINE = 120


def parent_of(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (children, theirs, ...), from /proc."""
    parents = {int(p.name): parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it only waits to be reaped)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def sweep_command(out: Path, started: Path, hold: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sweep.command",
        "sweep",
        "synthetic",
        "--optimizers",
        "sgd",
        "--lrs",
        "0.01,0.1,1",
        "--seeds",
        "1",
        "--workers",
        "2",
        "--out",
        str(out),
        "--started",
        str(started),
        "--sleep-while",
        str(hold),
        *extra,
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def survivors():
    """Pids to SIGKILL after the test whatever it found (a sweep without the fix leaves its workers sleeping)."""
    pids: set[int] = set()
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C", "SIGKILL", "Ctrl-C at the start"])
def test_a_killed_sweep_leaves_no_worker_and_resumes_without_a_crash(tmp_path, survivors, how):
    """The parent killed (SIGTERM, or SIGKILL) left its pool workers running their trials, each holding its trial's
    folder: an immediate --resume met those folders in use and recorded both trials as crashed. Now a stopped
    sweep stops its workers before it ends, a SIGKILLed one's workers stop by themselves, and the resume waits
    for a folder still held. The round has three trials for two workers: the third, queued by the pool, must not
    start once the sweep stops (stopped or killed). A Ctrl-C while the workers are still starting (importing
    torch) reaches the sweep alone: no worker prints a traceback."""
    out, started, hold = tmp_path / "s", tmp_path / "started", tmp_path / "hold"
    started.mkdir()
    hold.touch()  # the trials sleep until it is gone: a survivor is seen as one
    with (tmp_path / "killed.log").open("w") as log:
        sweep = subprocess.Popen(
            sweep_command(out, started, hold),
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_at_a_terminal,
        )
    try:
        if how == "Ctrl-C at the start":  # two workers spawned, neither running a trial yet
            wait_for(lambda: len(workers_of(sweep.pid)) == 2 or sweep.poll() is not None, "no workers started")
            workers = set(workers_of(sweep.pid))
            family = descendants(sweep.pid)
            survivors.update(family)
        else:  # both trials of the first round running, each in its own worker (the pid it wrote)
            wait_for(lambda: len(list(started.iterdir())) == 2 or sweep.poll() is not None, "the trials never started")
            assert sweep.poll() is None, (tmp_path / "killed.log").read_text()
            workers = {int(f.read_text().split()[0]) for f in started.iterdir()}
            family = descendants(sweep.pid)
            survivors.update(family)
            assert workers <= family and len(workers) == 2  # the case at hand: two workers running trials
        if how.startswith("Ctrl-C"):  # a terminal sends it to the whole foreground process group
            os.killpg(sweep.pid, signal.SIGINT)
        else:
            os.kill(sweep.pid, getattr(signal, how))
        code = sweep.wait(timeout=DEADLINE)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    said = (tmp_path / "killed.log").read_text()
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:  # stopped, not killed: it ends as an interrupted sweep, once it has stopped every worker it started
        assert code == 130 and "interrupted" in said and "Traceback" not in said, said
        assert not any(running(pid) for pid in workers), f"left running: {sorted(filter(running, workers))}"
    # the rest (multiprocessing's resource tracker) ends once the sweep and its workers have
    wait_for(lambda: not any(running(pid) for pid in family), f"left running: {sorted(filter(running, family))}")
    assert not (started / "sgd@1-seed-0").exists()  # the queued trial never started
    assert not list((out / "trials").glob("*/*/error.log"))  # no trial was recorded as crashed
    hold.unlink()
    resumed = subprocess.run(
        sweep_command(out, started, hold, "--resume"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=10 * DEADLINE,
    )
    assert resumed.returncode == 0, resumed.stderr
    records = runs.read_jsonl(out / "trials.jsonl")
    assert [r["status"] for r in records] == ["ok"] * 4, records  # three tuning trials, one fresh seed
    assert runs.read_json(out / "results.json")["optimizers"]["sgd"]["tuned_lr"] == 0.01


def sigint_as_at_a_terminal() -> None:
    """SIGINT's default action in the sweep, whatever this process was started with: a test run in the background
    by a non-interactive shell (``make test &``, a CI runner) inherits SIGINT ignored, which Python then keeps
    ignoring, as would the sweep, and a Ctrl-C from a terminal never reaches such a process anyway."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def workers_of(pid: int) -> list[int]:
    """The spawned pool workers among ``pid``'s children (the resource tracker, also a child, runs another
    command line)."""
    children = [p for p in descendants(pid) if parent_of(p) == pid]
    return [p for p in children if b"spawn_main" in (Path("/proc") / str(p) / "cmdline").read_bytes()]
