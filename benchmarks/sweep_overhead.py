"""The sweep's cost: its overhead per trial against running the same trials one by one with
``optiscope run``, and the throughput of two local workers against one on small trials.

1. Overhead. The same trials (a small ``lm`` at ``--lrs`` learning rates, one seed) run (a) as one
   ``optiscope sweep lm --workers 1`` process and (b) as one ``optiscope run lm --optimizers adamw@η``
   process each, one after another; the ratio (a)/(b) − 1 is the sweep's overhead per trial (goal ≤ 5 %).
   ``optiscope run`` also draws each run's figures and starts a Python per run; the sweep draws only its
   own three figures. Also printed: the sweep's own time beyond the sum of its trials' wall times.
2. Throughput. ``--trials`` small trials with ``--workers 1`` against ``--workers 2`` (goal ≥ 1.7× on 2
   cores). One worker runs the trials in the sweep's process, two workers in spawned processes; every
   process runs one torch thread (``OMP_NUM_THREADS=1``; the pool would give each of 2 workers
   cores // 2 = 1 anyway), so the ratio is the pool's parallel speed-up.

The machine's load average is printed with the numbers: other work on the cores disturbs both ratios.

    python benchmarks/sweep_overhead.py [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIAL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--eval-every", "50", "--sample-tokens", "0"]


def optiscope(*args: str) -> float:
    """Seconds one ``python -m optiscope ...`` process takes (it must succeed), with one torch thread per
    process: small trials gain nothing from more, and on a busy machine extra threads only wait."""
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "optiscope", *args], check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - started


def sweep(out: Path, lrs: list[str], steps: int, workers: int) -> tuple[float, float]:
    """(wall seconds of the sweep, sum of its trials' wall seconds)."""
    wall = optiscope(
        *("sweep", "lm", "--optimizers", "adamw", "--out", str(out), "--lrs", ",".join(lrs)),
        *("--seeds", "1", "--workers", str(workers), "--steps", str(steps), "--warmup-steps", "10", *TRIAL),
    )
    results = json.loads((out / "results.json").read_text())
    return wall, sum(t["wall_seconds"] for t in results["trials"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps per trial")
    parser.add_argument("--lrs", default="3e-4,1e-3,3e-3", help="the overhead part's learning rates")
    parser.add_argument("--trials", type=int, default=8, help="trials of the throughput part")
    args = parser.parse_args()
    lrs = args.lrs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        swept, inside = sweep(root / "sweep", lrs, args.steps, workers=1)
        one_by_one = sum(
            optiscope(
                *("run", "lm", "--out", str(root / f"run-{lr}"), "--optimizers", f"adamw@{lr}", "--quiet"),
                *("--steps", str(args.steps), "--warmup-steps", "10", *TRIAL),
            )
            for lr in lrs
        )
        print(
            f"overhead: sweep of {len(lrs)} trials {swept:.1f} s, the same trials with optiscope run one by one "
            f"{one_by_one:.1f} s: {swept / one_by_one - 1:+.1%} per trial (goal <= +5 %); "
            f"the sweep's own time beyond its trials: {swept - inside:.1f} s"
        )
        # one seed on an explicit grid: every trial runs in the first round, the same trials for both
        grid = [f"{1e-4 * 1.5**i:.3g}" for i in range(args.trials)]
        one, _ = sweep(root / "w1", grid, args.steps, workers=1)
        two, _ = sweep(root / "w2", grid, args.steps, workers=2)
        n = len(json.loads((root / "w1" / "results.json").read_text())["trials"])
        print(f"throughput: {n} trials, 1 worker {one:.1f} s, 2 workers {two:.1f} s: {one / two:.2f}x (goal >= 1.7x)")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
