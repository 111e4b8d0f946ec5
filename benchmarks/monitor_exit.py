"""Distributed jobs that end without an abort: the torchrun guide's scripts, with the monitor and without it.

The guide's DDP and FSDP2 scripts and FSDP1 with either ``use_orig_params`` (``tests/exit_jobs.py``), each a real
2-process gloo job ending as the guide shows it (``monitor.close()``, ``dist.destroy_process_group()``; no
``del``, no ``gc.collect()``), run ``--jobs`` times with the monitor and ``--peers`` times without it (the peer:
torch's own rate of aborts at exit), taking turns, ``--parallel`` jobs at once (2: four processes on a 2-core
machine, the load under which an abort at exit shows, as when the test suite's two workers run side by side).
Prints, per script, the jobs in which a rank was killed by SIGABRT ("terminate called without an active
exception") and those that failed otherwise, one line per job as it ends and a table at the end. Goal: 0 aborts
in ≥ 30 jobs of each script with the monitor (before: 3 of 22 FSDP1 jobs, either ``use_orig_params``, two at a
time, when gloo could still hold the monitor's last reduction at shutdown; see ``optiscope.collectives``).

With ``--log PATH`` each job's line is also appended to ``PATH`` as it ends, and a run given a log that already
holds lines skips the jobs they record and counts them in its table: a stopped run continues where it stopped.
What the ranks of a job that aborted or failed said is kept beside the log, one file per job.

    python benchmarks/monitor_exit.py [--jobs 30] [--peers 10] [--parallel 2] [--log PATH]
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import Parser, whole_number

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the jobs the test runs, written once
from exit_jobs import guide_scripts, run_job, without_monitor  # noqa: E402

#: one job's line: "FSDP1 monitor job 3: ok, exit codes (0, 0)"
LINE = re.compile(r"^(?P<name>.+) (?P<side>monitor|without) job (?P<job>\d+): (?P<verdict>ok|aborted|failed), ")


def logged(path: Path | None) -> dict[tuple[str, str, int], str]:
    """The verdicts a log already holds, by (script, side, job number)."""
    if path is None or not path.exists():
        return {}
    found = (LINE.match(line) for line in path.read_text(encoding="utf-8").splitlines())
    return {(m["name"], m["side"], int(m["job"])): m["verdict"] for m in found if m}


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--jobs", type=whole_number(1), default=30, help="jobs of each script with the monitor")
    parser.add_argument("--peers", type=whole_number(0), default=10, help="jobs of each script without it")
    parser.add_argument("--parallel", type=whole_number(1), default=2, help="jobs running at once")
    parser.add_argument("--log", type=Path, default=None, help="append each job's line here; resume from it")
    args = parser.parse_args()
    scripts = guide_scripts()
    done = logged(args.log)
    turns = [  # in turns: job i of every script and side before job i + 1 of any
        (name, side, i + 1, text)
        for i in range(max(args.jobs, args.peers))
        for name, script in scripts.items()
        for side, text, wanted in (("monitor", script, args.jobs), ("without", without_monitor(script), args.peers))
        if i < wanted
    ]
    verdicts = {(name, side, i): done[(name, side, i)] for name, side, i, _ in turns if (name, side, i) in done}
    lock = threading.Lock()

    def run(name: str, side: str, i: int, text: str, folder: Path) -> None:
        job = run_job(text, folder / f"{name}-{side}-{i}".replace(" ", "_"))
        verdict = "aborted" if job.aborted else "ok" if job.codes == (0, 0) else "failed"
        line = f"{name} {side} job {i}: {verdict}, exit codes {job.codes}"
        with lock:
            verdicts[(name, side, i)] = verdict
            print(line, flush=True)
            if args.log is not None:
                with args.log.open("a", encoding="utf-8") as log:
                    log.write(line + "\n")
                if verdict != "ok":  # what each rank said, beside the log
                    said = f"{args.log.name}.{name}-{side}-{i}.txt".replace(" ", "_")
                    text = "".join(f"--- rank {r}\n{out}" for r, out in enumerate(job.outputs))
                    (args.log.parent / said).write_text(text, encoding="utf-8")

    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(args.parallel) as pool:
        waiting = [pool.submit(run, *turn, Path(folder)) for turn in turns if turn[:3] not in verdicts]
        for future in waiting:
            future.result()
    counts = {(name, side): [0, 0, 0] for name in scripts for side in ("monitor", "without")}  # jobs, aborts, failed
    for (name, side, _), verdict in verdicts.items():
        tally = counts[(name, side)]
        tally[0] += 1
        tally[1] += verdict == "aborted"
        tally[2] += verdict == "failed"
    print(f"{'script':<24}{'with the monitor':>26}{'without':>26}")
    for name in scripts:
        cells = []
        for side in ("monitor", "without"):
            jobs, aborts, failed = counts[(name, side)]
            cells.append(f"{aborts} aborts/{jobs}" + (f", {failed} failed" if failed else ""))
        print(f"{name:<24}{cells[0]:>26}{cells[1]:>26}")
    print("Goal: 0 aborts with the monitor.")


if __name__ == "__main__":
    main()
