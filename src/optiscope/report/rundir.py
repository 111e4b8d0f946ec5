"""Reading one run directory for the report, whatever state it is in.

A report is read from directories that may be finished, still running (``metrics.jsonl`` growing, its
last line half-written, no ``results.json`` yet), interrupted, or not optiscope's at all. ``read_run``
never raises for what it finds inside a directory: each file it cannot use becomes a sentence in
``RunDir.problems``, which the page shows in place of what could not be drawn. Only a path that is not a
directory at all is bad input (``UserError``, exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import contracts, runs, sweep


@dataclass
class RunDir:
    """What could be read from one run directory, and what could not (one sentence per problem).

    Args:
        path: the directory.
        experiment: the experiment its ``results.json`` or ``config.json`` names (``"sweep"`` for a sweep), when
            this optiscope knows it; None: none (a Monitor's directory, nothing of a run).
        config: its ``config.json`` as a dict; None when missing, unreadable or another program's.
        results: its ``results.json``, when it is a known experiment's and has that experiment's shape; else None.
        metrics: the monitor records of its ``metrics.jsonl`` (a line still being written left out).
        figures: its ``figures/*.png``, sorted.
        problems: one sentence per thing that could not be read or shown; the page shows them in its place.
        monitored: a Monitor's directory (its ``JSONLSink``, the 🤗 and Lightning callbacks'): ``metrics.jsonl``
            and no run ``config.json``.
        in_progress: a process holds the directory's lock: the run is going on.

    Examples:
        >>> from pathlib import Path
        >>> from optiscope.report import RunDir
        >>> RunDir(Path("runs/lm")).name
        'lm'
    """

    path: Path
    experiment: str | None = None
    config: dict[str, Any] | None = None
    results: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    monitored: bool = False  # a Monitor's directory (its JSONL sink, the callbacks'): metrics.jsonl, no config.json
    in_progress: bool = False  # a process holds the directory's lock: the run is going on

    @property
    def name(self) -> str:
        """The directory's name (its whole path where it has none, such as ``/``)."""
        return self.path.name or str(self.path)


def read_run(path: Path) -> RunDir:
    """Read one run directory for the report, whatever state it is in.

    A directory may be finished, still running (``metrics.jsonl`` growing, its last line half-written, no
    ``results.json`` yet), interrupted, or not optiscope's at all. Nothing found inside it raises: each file that
    cannot be used becomes a sentence in ``RunDir.problems``, which the page shows in place of what could not be
    drawn.

    Args:
        path: the run directory.

    Returns:
        The [`RunDir`][optiscope.report.RunDir]: what could be read, and the problems.

    Raises:
        RunDirError: ``path`` does not exist or is a file (a ``UserError``: exit 2 at the command line).

    Examples:
        >>> import json
        >>> from pathlib import Path
        >>> from optiscope.report import read_run
        >>> run = Path("runs/mine")
        >>> run.mkdir(parents=True)
        >>> with open(run / "metrics.jsonl", "w") as f:  # as a Monitor's JSONLSink writes it
        ...     for step in range(1, 6):
        ...         print(json.dumps({"step": step, "loss": 1 / step}), file=f)
        ...     _ = f.write('{"step": 6, "lo')  # a last line cut short
        >>> read = read_run(run)
        >>> read.monitored, len(read.metrics), read.results
        (True, 5, None)
        >>> read.problems
        ['metrics.jsonl: its last line is incomplete (still being written, or cut off) and is left out']

    Notes:
        A ``config.json`` that is not an optiscope run's (a 🤗 model's, saved beside the callback's
        ``metrics.jsonl``) is not the directory's config: the directory counts as a Monitor's. A missing
        ``results.json`` is a problem only for a run that started (it wrote its config or records), is no
        Monitor's and that no process holds any more: it was interrupted or failed, and ``--resume`` continues
        it. A ``results.json`` of an experiment this optiscope does not know, or without that experiment's shape,
        is left out and said; so are lines of ``metrics.jsonl`` that are not monitor records.
    """
    path = Path(path)
    runs.require_directory(path, "give run directories (written by `optiscope run`, `optiscope sweep` or a Monitor)")
    run = RunDir(path)
    present = {name for name in (runs.CONFIG, runs.RESULTS, runs.METRICS) if (path / name).exists()}
    config = _read_object(path / runs.CONFIG, run.problems)
    # a config.json that is not an optiscope run's (a 🤗 model's, saved next to the callback's metrics.jsonl)
    # is not this directory's config
    foreign = config is not None and not runs.is_run_config(config)
    run.config = None if foreign else config
    run.monitored = runs.METRICS in present and (foreign or runs.CONFIG not in present)
    run.in_progress = runs.in_progress(path)
    # results.json is written at the end: its absence is a problem of a run that started (it wrote its config
    # or records) and that no process holds any more; a directory with nothing of a run is said below
    started = bool(present & {runs.CONFIG, runs.METRICS})
    expected = started and not (run.monitored or run.in_progress)
    run.results = _read_results(path / runs.RESULTS, run.problems, expected=expected)
    run.metrics = read_metrics(path / runs.METRICS, run.problems)
    if run.monitored and not run.metrics:
        run.problems.append(f"{runs.METRICS} holds no record yet (the monitor writes one every `every` steps)")
    run.figures = sorted((path / runs.FIGURES).glob("*.png"))
    named = [d.get("experiment") for d in (run.results, run.config) if isinstance(d, dict)]
    run.experiment = next((n for n in named if sweep.results_contract(n) is not None), None)
    if not present:
        run.problems.append(f"{path} holds no config.json, results.json or metrics.jsonl of an optiscope run")
    return run


def _read_object(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"{path.name} could not be read ({e}): nothing from it is shown")
        return None
    if not isinstance(value, dict):
        problems.append(f"{path.name} holds {type(value).__name__}, not an object: nothing from it is shown")
        return None
    return value


def _read_results(path: Path, problems: list[str], expected: bool = True) -> dict[str, Any] | None:
    """results.json when it is an optiscope experiment's and has that experiment's shape, else None (and a
    problem said, where one was ``expected``)."""
    if not path.is_file():
        if not expected:
            return None
        problems.append(
            f"{runs.RESULTS} is missing and no process holds the run: it was interrupted or failed (`optiscope run "
            "… --resume` continues it from its last checkpoint); headline numbers, result charts and figures' data "
            "are not shown"
        )
        return None
    results = _read_object(path, problems)
    if results is None:
        return None
    name = results.get("experiment")
    known = sweep.results_contract(name)
    if known is None:
        problems.append(
            f"{runs.RESULTS} names experiment {name!r}, which this optiscope does not know "
            f"(known: {', '.join(sweep.result_kinds())}): its results are not shown"
        )
        return None
    found = contracts.problems(results, known[0])
    if found:
        problems.append(
            f"{runs.RESULTS} does not have the shape of a {name!r} result ({'; '.join(found)}): "
            "its results are not shown"
        )
        return None
    return results


def read_metrics(path: Path, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``. A last line without its newline is a record still being written;
    it and any other line that is not a monitor record are left out, and ``problems`` says so."""
    problems = [] if problems is None else problems
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        problems.append(f"{path.name} could not be read ({e}): no training curves are shown")
        return []
    lines = text.split("\n")
    if lines and lines[-1]:
        lines.pop()  # a record still being appended (or cut off by a crash)
        problems.append(f"{path.name}: its last line is incomplete (still being written, or cut off) and is left out")
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if is_monitor_record(record):
            records.append(record)
        else:
            bad += 1
    if bad:
        said = "line that is not a monitor record was" if bad == 1 else "lines that are not monitor records were"
        problems.append(f"{path.name}: {bad} {said} skipped")
    return records


def is_monitor_record(record: Any) -> bool:
    """An object with a finite ``step`` whose fields the report reads have a monitor record's shape."""
    if not (isinstance(record, dict) and isinstance(record.get("step"), int | float) and math.isfinite(record["step"])):
        return False
    params = record.get("params", {})
    if not (isinstance(params, dict) and all(isinstance(v, dict) for v in params.values())):
        return False
    first = record.get("exploded_first", [])
    return isinstance(first, list) and all(isinstance(e, dict) for e in first)
