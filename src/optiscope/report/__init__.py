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
    """Read the run directories ``dirs``, build one HTML page of them and write it atomically to ``out``.

    What ``optiscope report`` does: ``read_run`` on each directory, ``build`` the page, write it. The page opens
    from disk with no network (BokehJS and the figures are inlined) and computes nothing new.

    Args:
        dirs: the run directories: written by ``optiscope run``, ``optiscope sweep`` or a ``Monitor``'s
            ``JSONLSink`` (a directory with ``metrics.jsonl``), finished, running or stopped.
        out: the page's file; None: ``DIR/report.html`` for one directory, for several ``report.html`` in the
            directory that holds them all.

    Returns:
        The path of the page written.

    Raises:
        UserError: ``out`` is a directory or cannot be written (a file in its path where a folder should be, no
            such device, a read-only folder); a path in ``dirs`` is not a directory; or none of ``dirs`` holds
            an optiscope run (no ``results.json``, ``metrics.jsonl`` or run ``config.json``).

    Examples:
        >>> import json
        >>> from pathlib import Path
        >>> from optiscope import report
        >>> run = Path("runs/mine")
        >>> run.mkdir(parents=True)
        >>> with open(run / "metrics.jsonl", "w") as f:  # as a Monitor's JSONLSink writes it
        ...     for step in range(1, 6):
        ...         print(json.dumps({"step": step, "loss": 1 / step}), file=f)
        >>> report.write([run]).as_posix()
        'runs/mine/report.html'
        >>> report.write([Path("runs")])
        Traceback (most recent call last):
        optiscope.errors.UserError: runs holds no optiscope run (no results.json, metrics.jsonl or run ...

    Notes:
        Among several directories, one that holds no run is named on the page with what it lacks. The page
        needs the ``report`` extra (Bokeh: ``pip install 'optiscope[report]'``).
    """
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
