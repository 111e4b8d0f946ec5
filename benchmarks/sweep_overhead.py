"""The sweep's cost: its overhead per trial against running the same trials one by one with
``optiscope run``, and the throughput of two local workers against one on small trials.

1. Overhead. The same trials (a small ``lm`` at ``--lrs`` learning rates, one seed, and, as every sweep
   runs, the tuned one again at a fresh seed) run (a) as one ``optiscope sweep lm --workers 1`` process and
   (b) as one ``optiscope run lm --optimizers adamw@η --seed s`` process each (the trials the sweep's
   results.json lists), one after another; the ratio (a)/(b) − 1 is the sweep's overhead per trial (goal ≤ 5 %).
   ``optiscope run`` also draws each run's figures and starts a Python per run; the sweep draws only its
   own three figures. Also printed: the sweep's own time beyond the sum of its trials' wall times.
2. Throughput. A sweep over ``--trials`` learning rates (``--trials`` + 1 small trials, the tuned one at a
   fresh seed included) with ``--workers 1`` against ``--workers 2`` (goal ≥ 1.7× on 2
   cores). One worker runs the trials in the sweep's process, two workers in spawned processes; every
   process runs one torch thread (``OMP_NUM_THREADS=1``; the pool would give each of 2 workers
   cores // 2 = 1 anyway), so the ratio is the pool's parallel speed-up.

The machine's load average is printed with the numbers: other work on the cores disturbs both ratios.

    python benchmarks/sweep_overhead.py [--steps 150]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Parser, whole_number

TRIAL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--eval-every", "50", "--sample-tokens", "0"]


def optiscope(*args: str) -> float:
    """Seconds one ``python -m optiscope ...`` process takes, with one torch thread per process: small trials
    gain nothing from more, and on a busy machine extra threads only wait. A failed one ends the benchmark
    with optiscope's own last line on stderr (which names a bad option's value) and its exit status (2: bad
    input)."""
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "optiscope", *args], capture_output=True, text=True, env=env)
    if done.returncode:
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        print(f"{Path(__file__).name}: error: `optiscope {' '.join(args[:2])}` failed: {said}", file=sys.stderr)
        sys.exit(done.returncode)
    return time.perf_counter() - started


def training(steps: int) -> list[str]:
    """The options of every trial, sweep's or run's: ``TRIAL``, ``steps`` steps, and a warmup of a tenth of them,
    at most 10 (the lm experiment's own rule caps it at 100, too long for trials this short)."""
    return ["--steps", str(steps), "--warmup-steps", str(min(10, steps // 10)), *TRIAL]


def sweep(out: Path, lrs: list[str], steps: int, workers: int) -> tuple[float, list[dict]]:
    """(wall seconds of the sweep, the trials of its results.json)."""
    wall = optiscope(
        *("sweep", "lm", "--optimizers", "adamw", "--out", str(out), "--lrs", ",".join(lrs)),
        *("--seeds", "1", "--workers", str(workers), *training(steps)),
    )
    return wall, json.loads((out / "results.json").read_text())["trials"]


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--steps", type=whole_number(1), default=150, help="training steps per trial")
    parser.add_argument("--lrs", default="3e-4,1e-3,3e-3", help="the overhead part's learning rates")
    parser.add_argument(
        "--trials",
        type=whole_number(1),
        default=8,
        help="learning rates of the throughput part's sweep (it runs one trial more: the tuned one at a fresh seed)",
    )
    args = parser.parse_args()
    lrs = args.lrs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        swept, trials = sweep(root / "sweep", lrs, args.steps, workers=1)
        one_by_one = sum(
            optiscope(
                *("run", "lm", "--out", str(root / f"run-{t['lr']}-{t['seed']}"), "--quiet"),
                *("--optimizers", f"adamw@{t['lr']}", "--seed", str(t["seed"]), *training(args.steps)),
            )
            for t in trials
        )
        inside = sum(t["wall_seconds"] for t in trials)
        print(
            f"overhead: sweep of {len(trials)} trials ({len(lrs)} learning rates, then the tuned one at a fresh "
            f"seed) {swept:.1f} s, the same {len(trials)} trials with optiscope run one by one {one_by_one:.1f} s: "
            f"{swept / one_by_one - 1:+.1%} per trial (goal <= +5 %); "
            f"the sweep's own time beyond its trials: {swept - inside:.1f} s"
        )
        # one seed on an explicit grid: every trial runs in the first round, the same trials for both
        grid = [f"{1e-4 * 1.5**i:.3g}" for i in range(args.trials)]
        one, trials = sweep(root / "w1", grid, args.steps, workers=1)
        two, _ = sweep(root / "w2", grid, args.steps, workers=2)
        print(
            f"throughput: {len(trials)} trials ({len(grid)} learning rates, then the tuned one at a fresh seed), "
            f"1 worker {one:.1f} s, 2 workers {two:.1f} s: {one / two:.2f}x (goal >= 1.7x)"
        )
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
