"""``optiscope report``: run directories -> one self-contained, interactive HTML page.

The report reads what runs left (``config.json``, ``results.json``, ``metrics.jsonl``, ``figures/*.png``;
``rundir``), picks and thins the columns each chart needs (``series``), states each experiment's headline
numbers from ``results.json`` (``headlines``), draws the charts with Bokeh (``charts``, ``sections``) and
writes the page (``page``); ``watch`` serves it on 127.0.0.1 while a run is going. Like ``figures``, it
computes nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .. import runs
from ..errors import UserError
from .page import Page, build
from .rundir import RunDir, read_run

__all__ = [
    "write",
    "build",
    "Page",
    "read_run",
    "RunDir",
]


def default_out(dirs: Sequence[Path]) -> Path:
    """DIR/report.html for one directory; for several, report.html in the directory that holds them all."""
    if len(dirs) == 1:
        return Path(dirs[0]) / runs.REPORT
    resolved = [Path(d).resolve() for d in dirs]
    common = Path(*_common_parts([p.parts for p in resolved]))
    return common / runs.REPORT


def _common_parts(parts: list[tuple[str, ...]]) -> tuple[str, ...]:
    out = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        out.append(column[0])
    return tuple(out)


def write(dirs: Sequence[Path], out: Path | None = None) -> Path:
    """Read ``dirs``, build the page and write it atomically to ``out`` (default: ``default_out``)."""
    out = Path(out) if out is not None else default_out(dirs)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give the page's file name, e.g. {out / runs.REPORT}")
    read = [read_run(d) for d in dirs]
    # a mistyped path, another program's folder: no page about nothing
    if not any(runs.holds_run(run.path) for run in read):
        said = (
            f"{read[0].path} holds no optiscope run"
            if len(read) == 1
            else f"none of {', '.join(str(run.path) for run in read)} holds an optiscope run"
        )
        raise UserError(
            f"{said} (no {runs.RESULTS}, {runs.METRICS} or run {runs.CONFIG}); give "
            "directories written by `optiscope run`, `optiscope sweep` or a Monitor, or --watch one that will be"
        )
    page = build(read)  # beside runs, a directory without one is named on the page with what it lacks
    try:
        return runs.atomic_write_text(out, page.html)
    except OSError as e:  # a place the user named that cannot hold the page: a file as a folder, no such device
        file_as_folder = next((p for p in Path(out).parents if p.is_file()), None)
        why = f"{file_as_folder} is a file, not a folder" if file_as_folder is not None else e.strerror or e
        raise UserError(f"cannot write the page to {out} ({why}); give --out a writable file path") from e
