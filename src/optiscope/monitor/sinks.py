"""Where monitor records go: the console (the seed's g/w/u log, aligned), JSONL, TensorBoard, any logger.

A sink is any object with ``write(record)`` and ``close()``. Every sink here writes only on rank 0
of a distributed job, so the same code runs unchanged under ``torchrun``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..checks import is_count, is_number
from ..runs import METRICS, TENSORBOARD, append_jsonl, checkpoint_name, is_rank_zero, truncate_jsonl
from .keys import check_prefix, flat_metrics, given_scalars, parameter_filter


def checked_sinks(sinks: Any, who: str, absent: str = "() for none") -> list[Any]:
    """``sinks`` as a list (an iterator would serve once), or a TypeError naming ``who``'s bad ``sinks`` unless it
    is a list (any iterable but a string) of objects with ``write(record)`` and ``close()``: told when built,
    not at the first record."""
    if isinstance(sinks, str | bytes) or not isinstance(sinks, Iterable):
        raise TypeError(f"{who}: sinks={sinks!r} must be a list of sinks (e.g. [ConsoleSink()]), or {absent}")
    sinks = list(sinks)
    for i, sink in enumerate(sinks):
        if isinstance(sink, type):
            raise TypeError(f"{who}: sinks[{i}] is the class {sink.__name__}; give a sink, e.g. {sink.__name__}(...)")
        if not all(callable(getattr(sink, method, None)) for method in ("write", "close")):
            raise TypeError(
                f"{who}: sinks[{i}]={sink!r} is not a sink; a sink has write(record) and close() "
                "(e.g. ConsoleSink(), JSONLSink(path))"
            )
    return sinks


def _e(x: float | None) -> str:
    """Two significant digits in scientific notation, like the seed's log (3.1e-05)."""
    if x is None:
        return "  n/a  "
    if not math.isfinite(x):
        return f"{x!s:>7}"
    return f"{x:.1e}"


class ConsoleSink:
    """Prints each measured step as a header line and one aligned line per parameter, like the seed's log.

    The header gives the step, loss, learning rates, ‖g‖, the overall u/w, tokens/s, when measured λ₁ against
    its threshold, tr H and B_simple, and the scalars given to ``Monitor.step`` (``train_acc 0.8``); each
    parameter's line, in the model's order, gives g, w, u, u/w, cos(u, −g) and the effective learning rate
    η/(√v̂ + ε) as ``[min median max]``; where optiscope does not know it for the optimizer, a line says why,
    once::

        embedding.weight   g=3.1e-05 w=1.0e+00 u=1.6e-06 u/w=1.6e-06 cos=+0.98 lr_eff=[1.0e-04 3.2e-03 9.9e-02]

    A divergence record prints as ``DIVERGED at step N: reason``, with the curvature diagnosis and the
    parameters whose u/w exploded first (or grew most). Writes on rank 0 only.

    Args:
        console: the ``rich.console.Console`` to print to, or None for the terminal.
        max_rows: with more parameters than this, only the ``max_rows // 2`` largest and smallest movers (by
            u/w) are shown, still in the model's order, and a line says how many were left out; an integer ≥ 2.
        full: print every parameter, whatever ``max_rows``.
        every: print only records whose step is a multiple of this (and the first), when the monitor measures
            more often than you want to read; an integer ≥ 1. Divergence is always printed.

    Raises:
        TypeError: ``console`` is not a ``rich`` Console, or ``full`` not a bool.
        ValueError: ``max_rows`` < 2 or ``every`` < 1 (or not integers).

    Examples:
        >>> import torch
        >>> from rich.console import Console
        >>> from optiscope.monitor import ConsoleSink, Monitor
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        >>> monitor = Monitor(model, optimizer, sinks=[ConsoleSink(Console(width=120, color_system=None))])
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> _ = monitor.step(0.5, train_acc=0.8)
        step 1 │ loss 0.5000 │ lr 1.00e-02 │ |g| 1.7e+00 │ u/w 2.5e-02 │ train_acc 0.8
          weight  g=1.4e+00 w=3.7e-01 u=1.4e-02 u/w=3.8e-02 cos=+1.00 lr_eff=[1.0e-02 1.0e-02 1.0e-02]
          bias    g=1.0e+00 w=5.9e-01 u=1.0e-02 u/w=1.7e-02 cos=+1.00 lr_eff=[1.0e-02 1.0e-02 1.0e-02]
    """

    def __init__(self, console: Console | None = None, max_rows: int = 12, full: bool = False, every: int = 1) -> None:
        if console is not None and not isinstance(console, Console):
            raise TypeError(
                f"ConsoleSink: console={console!r} must be a rich.console.Console, or None for the terminal"
            )
        # two rows at least: the table shows the largest and the smallest movers, max_rows // 2 of each
        if not is_count(max_rows, 2):
            raise ValueError(f"ConsoleSink: max_rows={max_rows!r} must be an integer >= 2")
        if not isinstance(full, bool):
            raise TypeError(f"ConsoleSink: full={full!r} must be True or False")
        if not is_count(every):
            raise ValueError(f"ConsoleSink: every={every!r} must be an integer >= 1 (print every every-th record)")
        self.console = console or Console()
        self.max_rows, self.full, self.every = max_rows, full, every
        self.told: set[str] = set()  # why an effective learning rate is unknown, said once each

    def write(self, record: dict[str, Any]) -> None:
        """Print ``record`` (a measured step's, or a divergence's), on rank 0 only.

        Args:
            record: a record as ``Monitor.step`` returns it, or a divergence record.
        """
        if not is_rank_zero():
            return
        for warning in record.get("warnings", []):  # every one, whether or not this record is printed
            self.console.print(self.warning_line(warning), highlight=False, soft_wrap=True)
        if record.get("diverged"):
            self._write_divergence(record)
            return
        if record["step"] != 1 and record["step"] % self.every:
            return
        self.console.print(self._header(record), highlight=False, soft_wrap=True)
        params = record.get("params", {})
        rows = list(params.items()) if self.full else _shown_rows(params, self.max_rows)
        width = min(max((len(n) for n, _ in rows), default=10), 48)
        for name, entry in rows:
            self.console.print("  " + escape(self.line(name, entry, width)), highlight=False, soft_wrap=True)
        if len(rows) < len(params):
            self.console.print(
                f"  {'':<{width}}  ⋯ {len(params) - len(rows)} more, their u/w between the largest and smallest "
                "shown (ConsoleSink(full=True) lists all)",
                style="dim",
                highlight=False,
                soft_wrap=True,
            )
        for why in dict.fromkeys(e["no_eff_lr"] for e in params.values() if "no_eff_lr" in e):
            if why not in self.told:  # the optimizer does not change: the reason is said once, not every step
                self.told.add(why)
                self.console.print(f"  no lr_eff: {escape(why)}", style="dim", highlight=False, soft_wrap=True)

    @staticmethod
    def warning_line(warning: dict[str, Any]) -> str:
        """An early warning (``Monitor(early_warning=True)``) as one line, with markup.

        Args:
            warning: one of a record's ``warnings``.

        Returns:
            The line, e.g. ``"WARNING at step 40 (loss): the loss is 6.2 standard deviations above its average
                (threshold 5)"``, and the lr it set where ``on_warning="reduce_lr"`` acted.
        """
        text = (
            f"[bold yellow]WARNING at step {warning['step']}[/bold yellow] ({warning['signal']}): "
            f"{escape(warning['message'])} (threshold {warning['threshold']:.3g})"
        )
        if warning.get("action") == "reduce_lr":
            text += " → lr halved to " + " ".join("relative" if lr is None else f"{lr:.2e}" for lr in warning["lr"][:3])
        return text

    @staticmethod
    def line(name: str, entry: dict[str, Any], width: int = 0) -> str:
        """One parameter's line of the table.

        Args:
            name: the parameter's name.
            entry: its entry in a record's ``params``.
            width: the name is padded to this many characters.

        Returns:
            The line, without markup, e.g. ``"w  g=3.1e-05 w=1.0e+00 u=1.6e-06 u/w=1.6e-06 cos=+0.98"``.
        """
        text = (
            f"{name:<{width}}  g={_e(entry['g'])} w={_e(entry['w'])} u={_e(entry['u'])} "
            f"u/w={_e(entry['u_over_w'])} cos={entry['cos']:+.2f}"
        )
        if "eff_lr" in entry:
            e = entry["eff_lr"]
            text += f" lr_eff=[{_e(e['min'])} {_e(e['median'])} {_e(e['max'])}]"
        if entry.get("nonfinite_grad") or entry.get("nonfinite_w"):
            text += f" NONFINITE g:{entry['nonfinite_grad']} w:{entry['nonfinite_w']}"
        return text

    @staticmethod
    def _header(record: dict[str, Any]) -> str:
        parts = [f"step {record['step']}"]
        if record.get("loss") is not None:
            parts.append(f"loss {record['loss']:.4f}")
        lrs = record.get("lr", [])
        if lrs:
            shown = " ".join("relative" if lr is None else f"{lr:.2e}" for lr in lrs[:3])  # None: Adafactor's own
            parts.append("lr " + shown + (" …" if len(lrs) > 3 else ""))
        parts.append(f"|g| {_e(record.get('grad_norm'))}")
        parts.append(f"u/w {_e(record['total']['u_over_w'])}")
        if "tokens_per_s" in record:
            parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
        if "sharpness" in record:  # with its ratio where the optimizer has a threshold (Lion, Muon: none)
            ratio = record.get("sharpness/threshold")
            against = f" = {ratio:.2f}× {record['curvature']['label']}" if ratio is not None else ""
            parts.append(f"λ₁ {_e(record['sharpness'])}{against}")
        if "hessian_trace" in record:
            parts.append(f"tr H {_e(record['hessian_trace'])}")
        if "noise_scale" in record:
            parts.append(f"B_simple {_e(record['noise_scale'])}")
        parts += [f"{escape(name)} {value:.4g}" for name, value in given_scalars(record).items()]
        return "[bold]" + " │ ".join(parts) + "[/bold]"

    def _write_divergence(self, record: dict[str, Any]) -> None:
        self.console.print(
            f"[bold red]DIVERGED at step {record['step']}[/bold red]: {escape(str(record['reason']))}",
            highlight=False,
            soft_wrap=True,
        )
        if record.get("curvature_diagnosis"):
            self.console.print(f"  {escape(record['curvature_diagnosis'])}", highlight=False, soft_wrap=True)
        exploded = record.get("exploded_first", [])
        for row in exploded or record.get("grew_most", []):
            when = f"from step {row['first_step']}" if exploded else "no alarm"
            self.console.print(
                f"  {escape(row['name'])}: u/w {_e(row['u_over_w'])} = {_e(row['growth'])} x its early level ({when})",
                highlight=False,
                soft_wrap=True,
            )

    def close(self) -> None:
        """Nothing to release: the console belongs to the caller."""


class JSONLSink:
    """Appends one JSON line per record to a file, readable while the run goes.

    Each write appends atomically (``runs.append_jsonl``); a number that is not finite is written
    ``NaN``/``Infinity``, as in every JSON file optiscope writes. Writes on rank 0 only. ``optiscope report``
    reads the file, and several runs may share it, told apart by their records' context.

    Args:
        path: the file, e.g. ``run_dir / "metrics.jsonl"``; created at the first record.

    Raises:
        TypeError: ``path`` is not a str or path, or empty.
        ValueError: ``path`` is a directory.

    Examples:
        >>> import json
        >>> import torch
        >>> from optiscope.monitor import JSONLSink, Monitor
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer, every=2, sinks=[JSONLSink("metrics.jsonl")], context={"run": "sgd"})
        >>> for _ in range(4):
        ...     optimizer.zero_grad()
        ...     loss = model(torch.ones(1, 2)).pow(2).sum()
        ...     loss.backward()
        ...     optimizer.step()
        ...     _ = monitor.step(loss)
        >>> [(r["run"], r["step"]) for r in map(json.loads, open("metrics.jsonl"))]
        [('sgd', 1), ('sgd', 2), ('sgd', 4)]
    """

    def __init__(self, path: Path | str) -> None:
        if not isinstance(path, str | PathLike) or not str(path).strip():
            raise TypeError(f"JSONLSink: path={path!r} must be a file's path (a str or Path)")
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(
                f"JSONLSink: path={str(path)!r} is a directory; give a file's path, e.g. run_dir / {METRICS!r}"
            )

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one JSON line, on rank 0 only.

        Args:
            record: any JSON-serialisable dict (non-finite numbers are written ``NaN``/``Infinity``).
        """
        if is_rank_zero():
            append_jsonl(self.path, record)

    def rewind(self, step: int, context: dict[str, Any]) -> None:
        """Drop the records of this run logged after ``step`` (``Monitor.rewind_sinks`` calls it).

        Args:
            step: the step resumed from; this run's records of later steps are dropped.
            context: this run's context fields: records carrying all of them are this run's.
        """
        if is_rank_zero():

            def keep(record: dict[str, Any]) -> bool:
                ours = all(record.get(k) == v for k, v in context.items())
                return not ours or record.get("step", 0) <= step

            truncate_jsonl(self.path, keep)

    def close(self) -> None:
        """Nothing to release: every write opens, appends and closes the file."""


class TensorBoardSink:
    """Writes records as TensorBoard event files, through ``torch.utils.tensorboard.SummaryWriter``.

    Tags: every number at the record's top level under its own name (``loss``, ``grad_norm``,
    ``tokens_per_s``, the curvature keys when measured: ``sharpness``, ``sharpness/threshold``, …, and the
    scalars given to ``Monitor.step``, e.g. ``val_acc``; not ``step`` nor the context's fields, which are
    the same at every step), ``lr/group{i}``, ``total/{g,w,u,u_over_w}`` and per parameter
    ``{g,w,u,u_over_w,cos}/{name}`` and ``eff_lr_median/{name}``; a divergence is a text entry.
    Writes on rank 0 only; the events file is opened at the first record.

    Args:
        log_dir: the folder for the event files, e.g. ``run_dir / "tensorboard" / "adam"``.

    Raises:
        ImportError: the ``tensorboard`` package is missing: ``pip install 'optiscope[tensorboard]'``.

    Examples:
        >>> import os
        >>> import torch
        >>> from optiscope.monitor import Monitor, TensorBoardSink
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer, sinks=[TensorBoardSink("tb")])
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> _ = monitor.step(0.5)
        >>> monitor.close()
        >>> [f.split(".")[0] for f in os.listdir("tb")]
        ['events']
    """

    def __init__(self, log_dir: Path | str) -> None:
        # the events file is opened at the first write, once: a rewind before it (every run's start) then
        # leaves no empty file beside the real one
        self.writer: Any = None
        self.purge_step: int | None = None
        self.active = is_rank_zero()
        if not self.active:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401 (fails now, not at the first write)
        except ImportError as e:  # torch raises this when the tensorboard package is missing
            raise ImportError(
                "TensorBoardSink needs the tensorboard package: pip install 'optiscope[tensorboard]'"
            ) from e
        self.log_dir = str(log_dir)

    def rewind(self, step: int, context: dict[str, Any]) -> None:
        """Continue after ``step``: events this run logged later (before an interruption) are purged.

        Args:
            step: the step resumed from.
            context: unused (one events folder holds one run).
        """
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.purge_step = step + 1

    def write(self, record: dict[str, Any]) -> None:
        """Add ``record``'s numbers as scalars at its step (a divergence as text), on rank 0 only.

        Args:
            record: a record as ``Monitor.step`` returns it, or a divergence record.
        """
        if not self.active:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=self.purge_step)
        step = record["step"]
        if record.get("diverged"):
            self.writer.add_text("diverged", f"step {step}: {record['reason']}", step)
            self.writer.flush()
            return
        constant = {"step", *record.get("context", ())}
        for key, value in record.items():
            if key not in constant and is_number(value):
                self.writer.add_scalar(key, value, step)
        for i, lr in enumerate(record.get("lr", [])):
            if lr is not None:  # an optimizer that sets its own step size per parameter (Adafactor) has none
                self.writer.add_scalar(f"lr/group{i}", lr, step)
        for key, value in record["total"].items():
            if key != "n":
                self.writer.add_scalar(f"total/{key}", value, step)
        for name, entry in record["params"].items():
            for key in ("g", "w", "u", "u_over_w", "cos"):
                self.writer.add_scalar(f"{key}/{name}", entry[key], step)
            if "eff_lr" in entry:
                self.writer.add_scalar(f"eff_lr_median/{name}", entry["eff_lr"]["median"], step)
        self.writer.flush()

    def close(self) -> None:
        """Close the events file, if one was opened."""
        if self.writer is not None:
            self.writer.close()


class LoggerSink:
    """Hands each record, flattened, to any ``log(metrics, step)`` function: W&B, MLflow, TensorBoard, Aim, ….

    Each record becomes ``flat_metrics(record, per_parameter, prefix)`` (``{"optiscope/u_over_w/total": …}``:
    the whole model's numbers and the curvature's, per-parameter series on request; the key table is in
    ``flat_metrics``), given as ``log(metrics, step)`` with the record's step, on rank 0 only. ``wandb.log``
    and ``mlflow.log_metrics`` take that call as it is; a ``SummaryWriter`` takes a one-line lambda::

        LoggerSink(wandb.log)
        LoggerSink(mlflow.log_metrics)
        LoggerSink(lambda metrics, step: [writer.add_scalar(k, v, step) for k, v in metrics.items()])

    Args:
        log: called as ``log(metrics, step)`` with a ``{str: float}`` dict and an int.
        per_parameter: False for totals only; True for every parameter's series too; a glob pattern or a list
            of them (``"*attn*"``) for the parameters whose name matches one.
        prefix: the first part of every key; letters, digits, ``_``, ``.`` and ``-``.

    Raises:
        TypeError: ``log`` is not callable.
        ValueError: a bad ``per_parameter`` or ``prefix``.

    Examples:
        >>> import torch
        >>> from optiscope.monitor import LoggerSink, Monitor
        >>> logged = []
        >>> sink = LoggerSink(lambda metrics, step: logged.append((step, metrics)))
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = Monitor(model, optimizer, sinks=[sink])
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> _ = monitor.step(0.5)
        >>> step, metrics = logged[0]
        >>> step, metrics["optiscope/loss"], metrics["optiscope/lr/group0"]
        (1, 0.5, 0.1)
    """

    def __init__(self, log: Any, per_parameter: bool | str | Iterable[str] = False, prefix: str = "optiscope") -> None:
        if not callable(log):
            raise TypeError(
                f"LoggerSink: log={log!r} must be a function called as log(metrics, step), e.g. wandb.log or "
                "mlflow.log_metrics"
            )
        check_prefix(prefix, "LoggerSink")
        parameter_filter(per_parameter, "LoggerSink")  # told when built, not at the first record
        self.log, self.per_parameter, self.prefix = log, per_parameter, prefix

    def write(self, record: dict[str, Any]) -> None:
        """Log ``record``'s flat metrics at its step, on rank 0 only.

        Args:
            record: a record as ``Monitor.step`` returns it, or a divergence record.
        """
        if is_rank_zero():
            self.log(flat_metrics(record, self.per_parameter, self.prefix), record["step"])

    def close(self) -> None:
        """Nothing to release: the logger belongs to the caller."""


def run_directory_sinks(
    run_dir: Path, label: str, *, console: Console | None = None, console_every: int = 1
) -> list[Any]:
    """The sinks of one run in an optiscope run directory.

    ``metrics.jsonl`` (shared by the runs there, told apart by the records' context), TensorBoard events in
    ``tensorboard/<label>`` when the ``tensorboard`` extra is installed, and the console tables when a
    ``console`` is given.

    Args:
        run_dir: the run directory.
        label: the run's name among those in the directory (e.g. ``"adam@1e-3"``), for its TensorBoard folder
            (made file-name safe).
        console: a ``rich.console.Console`` for a ``ConsoleSink``, or None for no console output.
        console_every: the ``ConsoleSink``'s ``every``: print every ``console_every``-th step's table.

    Returns:
        A list: a ``JSONLSink``, then a ``ConsoleSink`` with a ``console``, then a ``TensorBoardSink`` when
            the extra is installed.

    Examples:
        >>> from pathlib import Path
        >>> from optiscope.monitor import run_directory_sinks
        >>> sinks = run_directory_sinks(Path("run"), "adam")
        >>> sinks[0].path.as_posix()
        'run/metrics.jsonl'
        >>> [type(s).__name__ for s in sinks]  # TensorBoardSink with the extra installed
        ['JSONLSink'...]
    """
    sinks: list[Any] = [JSONLSink(Path(run_dir) / METRICS)]
    if console is not None:
        sinks.append(ConsoleSink(console, every=console_every))
    with contextlib.suppress(ImportError):  # TensorBoard is an optional extra; metrics.jsonl has everything
        sinks.append(TensorBoardSink(Path(run_dir) / TENSORBOARD / checkpoint_name(label).removesuffix(".pt")))
    return sinks


def _shown_rows(params: dict[str, dict[str, Any]], max_rows: int) -> list[tuple[str, dict[str, Any]]]:
    """The rows of a table of ``params`` at most ``max_rows`` long: all of them, or the ``max_rows // 2`` largest
    and as many smallest movers by u/w; in the record's order (the model's) either way, so that a layer keeps its
    place from one table to the next."""
    if len(params) <= max_rows:
        return list(params.items())
    half = max_rows // 2
    by_size = sorted(params, key=lambda name: -_sortable(params[name]["u_over_w"]))
    kept = {*by_size[:half], *by_size[-half:]}
    return [(name, entry) for name, entry in params.items() if name in kept]


def _sortable(x: float) -> float:
    return x if math.isfinite(x) else (1e300 if x > 0 or math.isnan(x) else -1e300)
