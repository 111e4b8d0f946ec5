"""Size and load time of the report page of a default-length ``lm`` run (goal: under 5 MB, open in 2 s).

Training the default ``lm`` run (5 runs × 2000 steps) takes ~15 minutes on 2 cores, so by default this
script makes a run directory of the same shape instead: a real ``lm`` run of the default model and the
default five optimizers for a few steps on a generated text, whose ``metrics.jsonl`` and training curves
are then repeated, with renumbered steps, up to 2000 steps (a record every 10 steps, as the default logs).
``--dir DIR`` measures a real run directory instead. The peers printed: the run directory's own data
(results.json + metrics.jsonl + figures) and the goals. Load time is measured in the system's Chromium
(Playwright), from navigation until every chart is drawn; it is skipped when no Chromium is found.

    python benchmarks/report_size.py [--dir RUN_DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import Parser
from optiscope import cli, report, runs

STEPS, EVERY = 2000, 10
WORDS = ("the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "far", "away", "while", "birds", "sang")


def synthetic_run(base: Path) -> Path:
    text = base / "text.txt"
    rng = random.Random(0)
    text.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) + "." for _ in range(3000)))
    out = base / "lm"
    options = ["--steps", "30", "--warmup-steps", "5", "--prompts", "the|a cat", "--log-every", str(EVERY)]
    options += ["--eval-every", "30", "--eval-batches", "2"]
    with contextlib.redirect_stdout(io.StringIO()):  # --quiet leaves the results' and figures' paths, all temporary
        code = cli.main(["run", "lm", "--out", str(out), "--text", str(text), "--quiet", *options])
    assert code == 0, code
    stretch_metrics(out / runs.METRICS)
    stretch_results(out / runs.RESULTS)
    return out


def stretch_metrics(path: Path) -> None:
    """Each run's records repeated, steps renumbered, to a record every EVERY steps up to STEPS."""
    by_run: dict[str, list[dict]] = {}
    for record in runs.read_jsonl(path):
        if not record.get("diverged"):
            by_run.setdefault(record["run"], []).append(record)
    lines = []
    for records in by_run.values():
        for i, step in enumerate([1, *range(EVERY, STEPS + 1, EVERY)]):
            lines.append(json.dumps({**records[i % len(records)], "step": step}) + "\n")
    path.write_text("".join(lines))


def stretch_results(path: Path) -> None:
    results = runs.read_json(path)
    steps = [1, *range(EVERY, STEPS + 1, EVERY)]
    for run in results["runs"].values():
        for curve, keys in ((run["train"], ("loss", "seconds")), (run["update_ratio"], ())):
            n = len(curve["step"])
            for key in keys:
                curve[key] = [curve[key][i % n] for i in range(len(steps))]
            for layer, values in curve.get("layers", {}).items():
                curve["layers"][layer] = [values[i % n] for i in range(len(steps))]
            curve["step"] = steps
    runs.atomic_write_json(path, results)


def lm_run_dir(text: str) -> Path:
    """An argparse type: a run directory with the files measured beside the page (results.json, metrics.jsonl)."""
    path = Path(text)
    missing = [name for name in (runs.RESULTS, runs.METRICS) if not (path / name).is_file()]
    if not path.is_dir() or missing:
        why = "is not a directory" if not path.is_dir() else f"holds no {' or '.join(missing)}"
        raise argparse.ArgumentTypeError(f"{text} {why}; give a run directory written by `optiscope run lm`")
    return path


def load_seconds(page_path: Path) -> float | None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        from playwright.sync_api import sync_playwright

        from report.browser import find_chromium
    except ImportError:
        return None
    executable = find_chromium()
    if executable is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        times = []
        for _ in range(3):
            started = time.perf_counter()
            page.goto(page_path.as_uri())
            page.wait_for_function(
                "() => window.Bokeh && Bokeh.documents.length > 0 && [...document.querySelectorAll('[data-root-id]')]"
                ".every(e => e.dataset.rootId in Bokeh.index)"
            )
            times.append(time.perf_counter() - started)
        browser.close()
    return min(times)


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--dir", type=lm_run_dir, help="a real lm run directory (default: a synthetic one)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="optiscope-report-bench-"))
    try:
        run_dir = args.dir or synthetic_run(base)
        started = time.perf_counter()
        page_path = report.write([run_dir], base / "report.html")
        build = time.perf_counter() - started
        size = page_path.stat().st_size
        data = sum(
            p.stat().st_size
            for p in [run_dir / runs.RESULTS, run_dir / runs.METRICS, *report.read_run(run_dir).figures]
        )
        records = len(runs.read_jsonl(run_dir / runs.METRICS))
        # the synthetic one is deleted at exit: no path to name
        print(f"run directory: {args.dir or 'synthetic, default length'}, {records} records")
        print(f"page: {size / 1e6:.2f} MB, written in {build:.1f} s")
        print(f"  vs the run's results.json + metrics.jsonl + figures ({data / 1e6:.2f} MB): {size / data:.2f}x")
        print(f"  vs the 5 MB goal: {size / 5e6:.2f}x")
        seconds = load_seconds(page_path)
        if seconds is None:
            print("load time: skipped (no Chromium or Playwright)")
        else:
            print(f"load time in headless Chromium: {seconds:.2f} s; vs the 2 s goal: {seconds / 2:.2f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
