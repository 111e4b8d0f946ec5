"""The ``optiscope`` command: ``list``, ``run <name> --out DIR [--quick]``, ``plot DIR``, ``demo``,
``sweep <name> --optimizers a,b --out DIR``, ``suggest-lr <name> --optimizers a,b --out DIR``,
``report DIR [DIR ...] [--out FILE] | --watch DIR``.

Every experiment's options come from its ``Config`` dataclass, so ``optiscope run <name> --help``
always lists exactly what the experiment accepts, with its defaults.

Exit codes: 0 ok; 2 bad input (``UserError``: one line on stderr naming the value and what would be
valid); 1 an internal error (one line, the traceback in ``DIR/error.log``), including a figure that could
not be drawn from a finished run's results, or memory that ran out (said as such: sizes too large for the
machine, not a bug); 3 every run diverged; 130 interrupted (resume with --resume).
``report --watch`` runs until Ctrl-C, its normal way to stop, and then exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
from rich.console import Console
from rich.table import Table

from . import __version__, contracts, experiments, figures, optim, runs, sweep
from .errors import ConfigError, UserError
from .optim.recipes import register_table
from .suggest.methods import DEFAULT_METHOD, METHODS
from .sweep.sweep import OWNS as SWEEP_OWNS
from .sweep.sweep import RESERVED as SWEEP_RESERVED
from .train.distributed import leave_job
from .train.signals import terminate_as_interrupt

EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_INTERRUPTED = 130


# ------------------------------------------------------------------------------------ config <-> argv
def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _converter(tp: Any, optional: bool, separator: str = ","):
    """A string -> value function for an option of type ``tp`` ('none' -> None where allowed); a list's items are
    separated by ``separator`` (a field's metadata may set another: prompts hold commas)."""
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        inner = typing.get_args(tp)[0]
        by, separated = ("commas", "comma") if separator == "," else (f"'{separator}'", f"'{separator}'")

        def convert_seq(text: str):
            items = [s.strip() for s in text.split(separator)] if text.strip() else []  # "" is the empty list
            if "" in items:  # "0.5,,0.5" or "0.1,": a typo, not a shorter list
                raise argparse.ArgumentTypeError(f"{text!r} has an empty item; separate the values by single {by}")
            try:
                return tuple(_in_range(inner(s)) for s in items)
            except ValueError:
                what = {int: "integers", float: "numbers"}.get(inner, f"{inner.__name__} values")
                raise argparse.ArgumentTypeError(f"{text!r} is not a {separated}-separated list of {what}") from None

        base = convert_seq
    else:

        def base(text: str):
            return _in_range(tp(text))

    def convert(text: str):
        if optional and text.lower() == "none":
            return None
        return base(text)

    convert.__name__ = getattr(tp, "__name__", str(tp))
    return convert


def _in_range(value: Any) -> Any:
    """An integer option within the 64-bit range torch and the random generators take (checked here, so a
    seed of 10**20 is bad input rather than an overflow deep inside a run)."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give an integer with |value| < 2**63")
    return value


def _shown(value: Any, separator: str) -> Any:
    """An option's value as it is written on the command line (a list's items joined by ``separator``)."""
    return separator.join(map(str, value)) if isinstance(value, tuple | list) else value


def add_config_arguments(parser: argparse.ArgumentParser, module: types.ModuleType, skip: tuple[str, ...] = ()) -> None:
    """One option per field of the experiment ``module``'s Config, its help ending in its default and, where
    ``--quick`` sets another value (the module's QUICK), that value."""
    config_cls, quick = module.Config, getattr(module, "QUICK", {})
    hints = typing.get_type_hints(config_cls)
    defaults = config_cls()
    for f in dataclasses.fields(config_cls):
        if not f.init or f.metadata.get("cli") is False or f.name in skip:
            continue
        tp, optional = _unwrap_optional(hints[f.name])
        separator = f.metadata.get("separator", ",")
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        with_quick = f"; --quick: {_shown(quick[f.name], separator)}" if f.name in quick else ""
        if "default:" not in help_text:  # a help that says its default in words keeps them
            help_text = f"{help_text} (default: {_shown(getattr(defaults, f.name), separator)}{with_quick})".strip()
        elif with_quick:
            help_text = f"{help_text} ({with_quick.removeprefix('; ')})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %: "7.5 % of" would not print
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        else:
            metavar = f.metadata.get("metavar") or (
                f"A{separator}B{separator}..."
                if typing.get_origin(tp) in (tuple, list)
                else getattr(tp, "__name__", "VALUE").upper()
            )
            parser.add_argument(
                flag,
                dest=f.name,
                type=_converter(tp, optional, separator),
                default=argparse.SUPPRESS,
                metavar=metavar,
                help=help_text,
            )


# ------------------------------------------------------------------------------------------ commands
def cmd_list(console: Console) -> int:
    table = Table(title="optiscope experiments", show_lines=False)
    table.add_column("name", style="bold")
    table.add_column("what it shows")
    for name in experiments.EXPERIMENTS:
        table.add_row(name, experiments.load(name).SUMMARY)
    console.print(table)
    console.print("Run one with: optiscope run <name> --out DIR [--quick]; options: optiscope run <name> --help")
    return 0


def run_and_draw(
    name: str, out: Path, quick: bool, overrides: dict[str, Any], *, resume: bool = False, force: bool = False
) -> tuple[dict[str, Any], figures.Drawn]:
    """Configure and run one experiment in ``out`` (results.json written), then draw its figures (before the
    directory is let go, from the results in memory)."""
    config = experiments.build_config(experiments.load(name), quick, overrides)
    drawn = []  # rank 0's figures; other ranks draw none

    def draw(results: dict[str, Any]) -> None:
        drawn.append(figures.draw_run(out, results))

    results = experiments.execute(name, config, out, resume=resume, force=force, quick=quick, then=draw)
    return results, drawn[0] if drawn else figures.Drawn([], [])


def report_figures(drawn: figures.Drawn, out: Path, console: Console) -> int:
    """Print where the figures are, and any that could not be drawn (exit 1: an internal error)."""
    for path in drawn.paths:
        console.print(f"  figure: {path}", highlight=False)
    return report_figure_failures(drawn, out)


def report_figure_failures(drawn: figures.Drawn, out: Path) -> int:
    """Say on stderr which figures could not be drawn, in one line (exit 1: an internal error), or nothing (0)."""
    if not drawn.failures:
        return 0
    names = ", ".join(name for name, _ in drawn.failures)
    first = drawn.failures[0][1].strip().splitlines()[-1]
    _error(
        f"internal error: {names} could not be drawn ({first}); the results are saved in {out / runs.RESULTS}; "
        f"traceback in {drawn.log}"
    )
    return EXIT_INTERNAL


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment's options among the parsed arguments of ``run`` or ``sweep`` (not the run
    directory's, nor the sweep's own)."""
    lifecycle = ("command", "name", "out", "quick", "resume", "force", "recipes")
    own = {"sweep": SWEEP_OPTIONS, "suggest-lr": SUGGEST_OPTIONS}.get(args.command, ())
    return {k: v for k, v in vars(args).items() if k not in lifecycle and k not in own}


def say_if_nothing_to_resume(args: argparse.Namespace, console: Console, owned: tuple[str, ...]) -> None:
    """``--resume`` on a directory without a run starts it (a job that is always restarted with --resume
    works), but says so: a mistyped --out would otherwise start a long run from scratch unnoticed. ``owned``:
    what the run keeps in --out besides a run's own files (a directory holding them is refused, not started)."""
    if args.resume and runs.is_rank_zero() and runs.resume_starts_afresh(args.out, owned):
        console.print(f"--resume: {args.out} holds no run yet; starting one", highlight=False)


def load_recipes(args: argparse.Namespace) -> None:
    """Register the recipes of ``--recipes`` (a TOML file), if given: their names become optimizers. Without it,
    ``--resume`` registers the recipes the run in ``--out`` recorded in its config.json (what its names ran)."""
    if args.recipes is not None:
        optim.load_recipes(args.recipes)
    elif getattr(args, "resume", False):
        stored = runs.stored_run_config(args.out)
        recipes = stored["config"].get("recipes") if stored else None
        if recipes:
            register_table(recipes, f"{args.out / runs.CONFIG}")


def add_recipes_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipes",
        type=Path,
        default=None,
        metavar="PATH",
        help="a TOML file of named optimizer recipes ([recipes.NAME]: class, lr, decays, options), for --optimizers",
    )


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    load_recipes(args)
    overrides = config_overrides(args)
    say_if_nothing_to_resume(args, console, experiments.owned_files(args.name))
    results, drawn = run_and_draw(args.name, args.out, args.quick, overrides, resume=args.resume, force=args.force)
    if not runs.is_rank_zero():
        return 0
    console.print(f"[bold]{args.name}[/bold] results: {args.out / runs.RESULTS}", highlight=False)
    code = report_figures(drawn, args.out, console)
    if results.get("status") == "diverged":
        console.print("[bold red]every run diverged[/bold red]: see where in results.json", highlight=False)
        return code or EXIT_DIVERGED
    return code


def read_results(run_dir: Path) -> dict[str, Any]:
    """A run directory's results.json, checked against its experiment's (or a sweep's) ``Results`` contract."""
    runs.require_directory(run_dir, "give a run directory (written by `optiscope run` or `optiscope sweep`)")
    path = run_dir / runs.RESULTS
    results = runs.read_json(path)
    name = results.get("experiment") if isinstance(results, dict) else None
    known = sweep.results_contract(name)
    if known is None:
        raise UserError(
            f"{path} is not the result of an optiscope experiment (experiment {name!r}); known: "
            f"{', '.join(sweep.result_kinds())}"
        )
    contract = known[0]
    found = contracts.problems(results, contract)
    if found:
        raise UserError(f"{path} does not have the shape of a {name!r} result: {'; '.join(found)}")
    return results


def cmd_plot(args: argparse.Namespace, console: Console) -> int:
    return report_figures(figures.draw_run(args.dir, read_results(args.dir)), args.dir, console)


#: What the demo says as it starts the experiments that take most of its time, so that a long wait is expected
#: (from a fresh clone on a quiet 2-core machine: lm 50 s and adder 55 s, the next entropy 28 s), as
#: getting-started says; they start first, side by side where there are workers for both.
DEMO_SLOW = dict.fromkeys(("lm", "adder"), "one of the demo's two slow ones: about a minute of one core")

#: seconds the demo may be silent, writing to a file or a pipe (``make demo`` into a CI log), before it says which
#: experiment is still running: a log that stops for minutes looks like a job that hangs
SILENT_AT_MOST = 30.0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Every experiment in quick mode (replacing an earlier demo's runs), ``--workers`` of them at a time, each
    said as it starts and as it ends (its status, seconds and figures), then the report page of them all: the last
    line, its ``file://`` address (or why it was not written)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise runs.RunDirError(
            f"--out {out} exists and is not a directory; the demo writes a run per experiment into a folder "
            "(default runs/demo): choose another --out"
        )
    if runs.holds_run(out):
        raise runs.RunDirError(
            f"--out {out} holds a run itself; the demo writes a run per experiment into a folder of its own "
            "(default runs/demo): choose another --out"
        )
    if not (isinstance(args.workers, int) and args.workers >= 1):
        raise UserError(f"--workers {args.workers!r} must be an integer >= 1 (experiments run at a time)")
    names = list(experiments.EXPERIMENTS)  # the registry's order tells the story
    workers = min(args.workers, len(names))
    code = demo_one_by_one(names, out, console) if workers == 1 else demo_side_by_side(names, out, workers, console)
    hint = activation_hint()
    if hint is not None:
        console.print(hint, highlight=False)
    try:
        page = report_module().write([out / name for name in names], out / runs.REPORT)
        console.print(f"report: {page.resolve().as_uri()}", highlight=False)
    except UserError as e:
        console.print(f"report: not written ({' '.join(str(e).split())})", highlight=False)
    return code


def demo_started(k: int, names: list[str]) -> str:
    """The line that starts the ``k``-th of the demo's experiments: ``"experiment 3/7: lm (one of the demo's …)"``."""
    name = names[k - 1]
    expect = f" ({DEMO_SLOW[name]})" if name in DEMO_SLOW else ""
    return f"[bold]experiment {k}/{len(names)}: {name}[/bold]{expect}"


def demo_ended(
    k: int, names: list[str], seconds: float, results: dict[str, Any], drawn: figures.Drawn, out: Path
) -> str:
    """The line that ends it: ``"experiment 3/7: lm ok, 48 s; 4 figures in runs/demo/lm/figures"``."""
    status = "error" if drawn.failures else results.get("status", "ok")
    return f"experiment {k}/{len(names)}: {names[k - 1]} {status}, {seconds:.0f} s; {figures_in(drawn, out)}"


def demo_failed(k: int, names: list[str], seconds: float) -> str:
    """The line that ends it when it raised: ``"experiment 3/7: lm error, 12 s"``."""
    return f"experiment {k}/{len(names)}: {names[k - 1]} error, {seconds:.0f} s"


def demo_one_by_one(names: list[str], out: Path, console: Console) -> int:
    """The demo's experiments in this process, one after another, with their own progress bars on a terminal."""
    code = 0
    for k, name in enumerate(names, 1):
        which = f"experiment {k}/{len(names)}: {name}"
        console.print(demo_started(k, names), highlight=False)
        started = time.perf_counter()
        try:
            with said_while_silent(console, which):
                results, drawn = run_and_draw(name, out / name, True, {}, force=True)
        except Exception:  # said here, then as every command says it (one line on stderr, the exit code)
            console.print(demo_failed(k, names, time.perf_counter() - started), highlight=False)
            raise
        console.print(demo_ended(k, names, time.perf_counter() - started, results, drawn, out / name), highlight=False)
        code = report_figure_failures(drawn, out / name) or code
    return code


def demo_side_by_side(names: list[str], out: Path, workers: int, console: Console) -> int:
    """The demo's experiments, each in a process of its own, ``workers`` at a time: the slow ones first and the
    others in the registry's order as processes come free (each keeps its number in the story). The runs are quiet
    (the progress bars of several at once would overwrite each other), so every ``SILENT_AT_MOST`` seconds without
    a line says which are still running. An error, Ctrl-C or SIGTERM stops the others at once: a demo has nothing
    to resume."""
    code, running = 0, {}
    waiting = sorted(range(1, len(names) + 1), key=lambda k: names[k - 1] not in DEMO_SLOW)
    # fresh interpreters (no forked torch threads or locks) that know the experiments this process knows, each on
    # its share of the CPUs: torch's default of one thread per CPU in each would oversubscribe them (lm and entropy
    # side by side on 2 CPUs took 3.7x and 4.8x as long as each alone)
    known = dict(experiments.EXPERIMENTS), dict(figures.DRAWERS), max(1, usable_cpus() // workers)
    context = multiprocessing.get_context("spawn")
    try:
        said = time.perf_counter()
        while waiting or running:
            while waiting and len(running) < workers:
                k = waiting.pop(0)
                console.print(demo_started(k, names), highlight=False)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_demo_experiment, args=(*known, names[k - 1], out / names[k - 1], send), daemon=True
                )
                with sigint_ignored():  # by the process until it trains: a Ctrl-C while it imports is the demo's
                    process.start()
                send.close()
                said = time.perf_counter()
                running[k] = process, receive, said
            left = SILENT_AT_MOST - (time.perf_counter() - said)
            ready = multiprocessing.connection.wait([r for _, r, _ in running.values()], timeout=max(0.0, left))
            if not ready:
                said = time.perf_counter()
                still = ", ".join(f"{names[k - 1]} {said - t:.0f} s" for k, (_, _, t) in sorted(running.items()))
                console.print(f"still running: {still}", highlight=False)
            for k in sorted(k for k, (_, r, _) in running.items() if r in ready):
                (process, receive, started), name = running.pop(k), names[k - 1]
                try:
                    done, result = receive.recv()
                except EOFError:  # it died without a word: killed, out of memory
                    process.join()
                    done, result = (
                        False,
                        RuntimeError(f"the demo's process of {name} ended, exit code {process.exitcode}"),
                    )
                process.join()
                if not done:  # said here, then as every command says it (one line on stderr, the exit code)
                    console.print(demo_failed(k, names, time.perf_counter() - started), highlight=False)
                    raise result
                ended = demo_ended(k, names, time.perf_counter() - started, *result, out / name)
                console.print(ended, highlight=False)
                code, said = report_figure_failures(result[1], out / name) or code, time.perf_counter()
    except BaseException:
        stop_processes([process for process, _, _ in running.values()])
        raise
    return code


def stop_processes(processes: list[multiprocessing.process.BaseProcess], grace: float = 10.0) -> None:
    """SIGTERM to each (a training loop stops after its step), and SIGKILL to any still alive ``grace`` s later."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """For the block, Ctrl-C is ignored by this process and so by the processes it starts (an ignored signal stays
    ignored across ``exec``, and Python then installs no handler of its own); the training loop's handler of its
    stop requests still takes it while they train. Outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _demo_experiment(
    experiments_known: dict[str, str],
    drawers: dict[str, str],
    threads: int,
    name: str,
    out: Path,
    send: multiprocessing.connection.Connection,
) -> None:
    """One of the demo's experiments, quiet, in a process of its own that knows the registries of the demo's
    process (a test's, or one extended at run time) and takes its share of torch's threads (an experiment with
    ``--threads`` sets its own): sends (True, (results, figures drawn)) or (False, the exception). Ctrl-C (which
    reaches the demo too, and it says so) or the demo stopping it ends it without a traceback."""
    experiments.EXPERIMENTS, figures.DRAWERS = experiments_known, drawers
    torch.set_num_threads(threads)
    try:
        send.send((True, run_and_draw(name, out, True, {"quiet": True}, force=True)))
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Exception as e:  # noqa: BLE001 (handed to the demo, which raises it)
        try:
            send.send((False, e))
        except Exception:  # noqa: BLE001 (an exception that does not pickle goes as its words)
            send.send((False, RuntimeError(f"{type(e).__name__}: {e}")))


def activation_hint() -> str | None:
    """How to put this virtual environment's ``optiscope`` command on the shell's PATH, where the shell would not
    find it (``make demo`` installs into ``.venv`` and runs it from there, whether or not it is activated); None
    where it would, or where this Python is no virtual environment.

    Returns:
        ``"optiscope is installed in .venv: source .venv/bin/activate puts the optiscope command on your PATH"``
        (the path relative to the current directory where it is inside it), or None.

    Example:
        >>> activation_hint() is None or "bin/activate" in activation_hint()
        True
    """
    script = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix == sys.base_prefix or not script.is_file():
        return None
    found = shutil.which("optiscope")
    if found is not None and Path(found).parent.resolve() == script.parent.resolve():
        return None
    here = Path.cwd().resolve()
    shown = script.resolve().relative_to(here) if script.resolve().is_relative_to(here) else script
    return f"optiscope is installed in {shown.parent.parent}: source {shown} puts the optiscope command on your PATH"


def figures_in(drawn: figures.Drawn, run_dir: Path) -> str:
    """How many figures a run's ``drawn`` holds and their folder (and how many could not be drawn), in words.

    Args:
        drawn: what ``figures.draw_run`` drew.
        run_dir: the run directory they were drawn for.

    Returns:
        ``"5 figures in runs/demo/lm/figures"``, with ``" (2 could not be drawn)"`` after it where some failed.

    Example:
        >>> figures_in(figures.Drawn([Path("r/figures/a.png")], []), Path("r"))
        '1 figure in r/figures'
    """
    count = len(drawn.paths)
    folder = drawn.paths[0].parent if drawn.paths else run_dir / runs.FIGURES
    failed = f" ({len(drawn.failures)} could not be drawn)" if drawn.failures else ""
    return f"{count} figure{'' if count == 1 else 's'} in {folder}{failed}"


class _Written:
    """A stream that passes every write on to ``stream`` and remembers when the last one was (``time.monotonic``)."""

    def __init__(self, stream: typing.TextIO) -> None:
        self.stream, self.last = stream, time.monotonic()

    def write(self, text: str) -> int:
        self.last = time.monotonic()
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno: the stream's own
        return getattr(self.stream, name)


@contextlib.contextmanager
def said_while_silent(console: Console, what: str, every: float | None = None) -> Iterator[None]:
    """While the block runs, print ``"<what> still running, <seconds> s"`` whenever stdout has been silent for
    ``every`` seconds, if ``console`` is not a terminal: a terminal shows the runs' own progress bars, a file or a
    pipe gets no bar, and the experiments that do not train print nothing while they work.

    Args:
        console: where to print the line (on stdout).
        what: what is running, as the line names it.
        every: seconds of silence before a line; None: ``SILENT_AT_MOST``.

    Example:
        >>> with said_while_silent(Console(), "experiment 1/6: lm"):
        ...     pass
    """
    if console.is_terminal:
        yield
        return
    every = SILENT_AT_MOST if every is None else every
    written, stop, started = _Written(sys.stdout), threading.Event(), time.monotonic()

    def watch() -> None:
        while not stop.wait(min(1.0, every)):
            if time.monotonic() - written.last >= every:
                console.print(f"{what} still running, {time.monotonic() - started:.0f} s", highlight=False)

    sys.stdout, watcher = written, threading.Thread(target=watch, name="said_while_silent", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        sys.stdout = written.stream


def report_module() -> types.ModuleType:
    """``optiscope.report``, which needs Bokeh (the ``report`` extra)."""
    try:
        import bokeh  # noqa: F401
    except ImportError as e:
        raise UserError("the report needs Bokeh: pip install 'optiscope[report]' (make demo installs it)") from e
    from . import report

    return report


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    """Write the page of the run directories, or (--watch) serve it until Ctrl-C."""
    report = report_module()
    if not args.watch:
        console.print(str(report.write(args.dirs, args.out)), highlight=False)
        return 0
    if len(args.dirs) != 1 or args.out is not None:
        raise UserError("--watch takes exactly one run directory and no --out (it serves the page instead)")
    from .report import watch

    server = watch.serve(
        args.dirs, ready=lambda url: console.print(f"watching {args.dirs[0]}: {url} (Ctrl-C stops)", highlight=False)
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        console.print("stopped", highlight=False)
    finally:
        server.shutdown()
    return 0


#: The sweep's own options (parsed into these names; every other option goes to each trial).
SWEEP_OPTIONS = (
    "optimizers",
    "seeds",
    "lrs",
    "workers",
    "backend",
    "address",
    "objective",
    "factor",
    "lr_from",
    "budget",
)
#: suggest-lr's own options (every other option goes to the experiment's configuration).
SUGGEST_OPTIONS = ("budget", "method")


def parse_lrs(text: str) -> tuple[float, ...] | None:
    """``--lrs``: 'auto' (None) or comma-separated finite numbers > 0."""
    if text.strip().lower() == "auto":
        return None
    items = [s.strip() for s in text.split(",")]
    try:
        values = tuple(float(s) for s in items)  # an empty item ("1e-3,,2e-3") is no number either
    except ValueError:
        values = ()
    if not values or any(not (0 < v < float("inf")) for v in values):
        raise UserError(f"--lrs {text!r}: give auto or learning rates as finite numbers > 0, e.g. 1e-3,3e-3,1e-2")
    return values


def sweep_config(args: argparse.Namespace) -> sweep.SweepConfig:
    """The parsed arguments of ``sweep`` as a SweepConfig (not validated yet: ``sweep.sweep.check`` does)."""
    return sweep.SweepConfig(
        experiment=args.name,
        optimizers=tuple(s.strip() for s in args.optimizers.split(",")),
        seeds=args.seeds,
        lrs=parse_lrs(args.lrs),
        objective=args.objective,
        quick=args.quick,
        options=config_overrides(args),
        workers=args.workers,
        backend=args.backend,
        address=args.address,
        factor=args.factor,
        lr_from=args.lr_from,
        budget=args.budget,
    )


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    load_recipes(args)
    config = sweep_config(args)
    say_if_nothing_to_resume(args, console, SWEEP_OWNS)

    def report(record: dict[str, Any]) -> None:
        error = f" ({record['error']})" if record["error"] else ""
        console.print(
            f"  {record['label']} seed {record['seed']}: {record['objective']:.5g} {record['status']}{error}, "
            f"{record['wall_seconds']:.1f} s",
            highlight=False,
        )

    drawn = []
    results = sweep.run_sweep(
        config,
        args.out,
        resume=args.resume,
        force=args.force,
        report=report,
        then=lambda r: drawn.append(figures.draw_run(args.out, r)),
    )
    console.print(f"[bold]sweep {args.name}[/bold] results: {args.out / runs.RESULTS}", highlight=False)
    for name in results["ranking"]:
        t = results["optimizers"][name]
        spread = fresh_seeds(t)
        edge = "" if t["interior"] else " (at an end of the grid that was run: its optimum may lie beyond)"
        chose = f"; the {len(results['seeds'])} tuning seed(s) that chose it: {t['tuning_mean']:.4g}"
        centre = f" (grid centred on its suggestion {t['centre_lr']:.3g})" if config.lr_from == "suggest" else ""
        console.print(
            f"  {name}: tuned lr {t['tuned_lr']:g}{edge}{centre}, fresh seeds {spread}{chose}", highlight=False
        )
    for name in (name for name in results["optimizers"] if name not in results["ranking"]):
        # every trial at +∞: say what each of them did (diverged, crashed, or ran and missed the target)
        console.print(
            f"  no tuned lr for {name}: {sweep.what_trials_did(results, name)}; see results.json", highlight=False
        )
    for neighbours in results["neighbours"]:
        console.print(f"  {neighbours['verdict']}", highlight=False)
    crashed = [t for t in results["trials"] if t["status"] == "crashed"]
    if crashed:
        named = ", ".join(f"{t['label']} seed {t['seed']}" for t in crashed[:5]) + (", …" if len(crashed) > 5 else "")
        console.print(
            f"  {len(crashed)} trial(s) crashed and count as the worst value ({named}; tracebacks in the error.log "
            "of their directories under trials/); the same command with --resume runs them again",
            highlight=False,
        )
    code = report_figures(drawn[0], args.out, console)
    if results["status"] != "ok":
        console.print(
            "[bold red]no trial gave a value[/bold red] (each diverged, crashed or missed its target): see trials in "
            "results.json"
        )
        return code or EXIT_DIVERGED
    return code


def fresh_seeds(tuned: dict[str, Any]) -> str:
    """An optimizer's fresh seeds at its tuned lr, in words: mean ± std and the 95 % interval, or why there is
    none (one seed; a seed that diverged or crashed, which makes the mean +∞; seeds that tie by chance, which
    leave the seed noise unmeasured)."""
    mean, std, (low, high) = tuned["mean"], tuned["std"], tuned["interval"]
    if len(tuned["values"]) == 1:
        return f"{mean:.4g} (one seed: no spread, no interval)"
    if not math.isfinite(mean):
        return "a fresh seed diverged or crashed (no mean, no interval)"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{mean:.4g} ± {std:.2g} (no interval: the seed noise is not measured)"
    return f"{mean:.4g} ± {std:.2g} (95% CI {low:.4g} … {high:.4g})"


def add_sweep_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "sweep",
        help="tune each optimizer's learning rate, then run seeds: optiscope sweep <name> --optimizers a,b --out DIR",
    )
    names = parser.add_subparsers(dest="name", metavar="name")
    names.required = True
    tunable = experiments.sweepable()
    for name in sorted(experiments.EXPERIMENTS):
        module = experiments.load(name)
        # one without an objective keeps its parser, to be refused in words (which experiments do have one),
        # but is not offered in the listing (a subparser without help is not listed)
        offered = {"help": module.SUMMARY} if name in tunable else {}
        p = names.add_parser(name, **offered, description=f"Sweep {name}: {module.SUMMARY}")
        p.add_argument(
            "--optimizers",
            required=True,
            metavar="A,B,...",
            help="optimizers to tune, comma-separated, as run <name> --optimizers takes them (name@lr: where the "
            "grid starts)",
        )
        add_recipes_argument(p)
        p.add_argument("--out", required=True, type=out_dir, metavar="DIR", help="the sweep directory")
        p.add_argument("--quick", action="store_true", help="each trial in the experiment's quick configuration")
        p.add_argument(
            "--seeds",
            type=int,
            default=3,
            metavar="INT",
            help="tuning seeds at the best lr and its neighbours, then as many fresh ones at the tuned lr (default: 3)",
        )
        p.add_argument(
            "--lrs",
            default="auto",
            metavar="auto|A,B,...",
            help="learning rates η to try: auto (a grid that grows until the best is interior) or a list "
            "(default: auto)",
        )
        p.add_argument(
            "--objective",
            default=None,
            metavar="NAME",
            help="which declared objective to tune for (default: the first)",
        )
        p.add_argument(
            "--factor",
            type=float,
            default=sweep.sweep.grid.FACTOR,
            metavar="FLOAT",
            help="ratio between neighbouring lrs of the automatic grid, e.g. 1.414 for a fine one (default: √10)",
        )
        p.add_argument(
            "--lr-from",
            default="usual",
            metavar="usual|suggest",
            help="centre each automatic grid on the experiment's usual lr or on suggest-lr's (default: usual)",
        )
        add_budget_argument(p)
        p.add_argument("--workers", type=int, default=1, metavar="INT", help="trials run at a time (default: 1)")
        p.add_argument(
            "--backend", default="local", metavar="NAME", help="local (a process pool) or ray (default: local)"
        )
        p.add_argument(
            "--address",
            default=None,
            metavar="HOST:PORT",
            help="a Ray cluster's address (--backend ray; default: a local instance)",
        )
        p.add_argument("--resume", action="store_true", help="continue the sweep in --out, keeping finished trials")
        p.add_argument("--force", action="store_true", help="replace the sweep in --out")
        add_config_arguments(p, module, skip=(*SWEEP_RESERVED, *SWEEP_OPTIONS))


def add_budget_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=float,
        default=experiments.DEFAULT_BUDGET,
        metavar="FLOAT",
        help="share of a run's steps × batch a suggestion may spend (default: 0.05)",
    )


def add_suggest_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "suggest-lr",
        help="a learning rate per optimizer before any sweep: optiscope suggest-lr <name> --optimizers a,b --out DIR",
    )
    names = parser.add_subparsers(dest="name", metavar="name")
    names.required = True
    for name in experiments.suggestable():
        module = experiments.load(name)
        p = names.add_parser(
            name, help=module.SUMMARY, description=f"Suggest learning rates for {name}: {module.SUMMARY}"
        )
        p.add_argument("--out", required=True, type=out_dir, metavar="DIR", help="where suggestion.json is written")
        p.add_argument("--quick", action="store_true", help="probe the experiment's quick configuration")
        p.add_argument("--force", action="store_true", help="replace the suggestion.json in --out")
        add_budget_argument(p)
        p.add_argument(
            "--method",
            default=DEFAULT_METHOD,
            metavar="NAME",
            help=f"how the probe reads the lr: {', '.join(METHODS)} (default: {DEFAULT_METHOD})",
        )
        add_recipes_argument(p)
        add_config_arguments(p, module, skip=("seeds",))


#: The file ``suggest-lr`` writes into --out.
SUGGESTION = "suggestion.json"


def cmd_suggest(args: argparse.Namespace, console: Console) -> int:
    """Suggest a learning rate for each optimizer of the experiment's configuration and write them to
    ``--out/suggestion.json`` (atomically; an existing one only with --force)."""
    load_recipes(args)
    path = args.out / SUGGESTION
    if path.exists() and not args.force:
        raise UserError(f"{path} exists; pass --force to replace it, or choose another --out")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file; give a directory for suggestion.json")
    overrides = config_overrides(args)
    if "optimizers" in overrides:  # a suggestion needs no lr: one that has no usual lr here is not refused for it
        named = [item.strip() for item in overrides["optimizers"].split(",")]
        overrides["optimizers"] = ",".join(item if "@" in item or not item else f"{item}@1" for item in named)
    config = experiments.build_config(experiments.load(args.name), args.quick, overrides)
    found = experiments.suggest(args.name, config, args.budget, args.method)
    for name, s in found.items():
        console.print(
            f"  {name}: lr {s.lr:.3g} (band {s.low:.3g} … {s.high:.3g}), {s.steps_used:g} of {s.steps} passes, "
            f"{s.method}" + (f" ({s.threshold})" if s.threshold else ""),
            highlight=False,
        )
    document = {
        "experiment": args.name,
        "optiscope": __version__,
        "quick": args.quick,
        "budget": args.budget,
        "config": experiments.config_dict(config),
        "optimizers": {name: s.to_dict() for name, s in found.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_json(path, document)
    console.print(f"[bold]suggest-lr {args.name}[/bold]: {path}", highlight=False)
    return 0


# ---------------------------------------------------------------------------------------------- main
def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container or ``taskset`` narrows), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def out_dir(text: str) -> Path:
    """``--out``: a run directory; an empty name would silently mean the current directory."""
    return runs.check_out(text)


def run_dir(text: str) -> Path:
    """A run directory named as an argument (``plot DIR``, ``report DIR``); empty is refused as for ``--out``."""
    return runs.check_out(text, "DIR")


class UsageError(Exception):
    """A command line argparse cannot parse: reported in one line, not argparse's usage block."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors raised (``UsageError``), so that ``main`` reports them in one line, and no
    abbreviated options (``--seed`` must not be taken for a sweep's ``--seeds``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
        # a word that begins with '-' then a digit, '.digit', inf or nan is a value, not an option: argparse's own
        # rule takes only '-3' and '-.5', so `--lrs -0.1,0.2` or `--steps -1e3` got "expected one argument"
        # instead of the option's own check naming the value (no option of ours is spelled like a number)
        self._negative_number_matcher = re.compile(r"^-(?:\d|\.\d|inf|nan)", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("optiscope").strip()  # _error names the program itself
        raise UsageError(f"{command}: {message}" if command else message)


def _unknown_options_hint(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """'; valid options: ...' of the (sub)command ``argv`` names, for an unrecognised option."""
    for word in argv:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            continue
        parser = actions[0].choices[word]
    options = sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help")
    return f"; valid options: {', '.join(options)} (--help explains them)" if options else ""


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="optiscope",
        description="A PyTorch laboratory for optimizers: run an experiment, get data and figures.",
    )
    parser.add_argument("--version", action="version", version=f"optiscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{list,run,plot,demo,sweep,suggest-lr,report}")
    sub.required = True
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run an experiment: optiscope run <name> --out DIR [--quick]")
    run_sub = run.add_subparsers(dest="name", metavar="name")
    run_sub.required = True
    for name in sorted(experiments.EXPERIMENTS):
        module = experiments.load(name)
        p = run_sub.add_parser(name, help=module.SUMMARY, description=module.SUMMARY)
        p.add_argument(
            "--out", required=True, type=out_dir, metavar="DIR", help="the run directory (one run per directory)"
        )
        p.add_argument("--quick", action="store_true", help="the short version (what `make demo` runs)")
        p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoints")
        p.add_argument("--force", action="store_true", help="replace the run in --out (its files are deleted first)")
        add_recipes_argument(p)
        add_config_arguments(p, module)
    plot = sub.add_parser("plot", help="redraw the figures of a run directory from its results.json")
    plot.add_argument(
        "dir", type=run_dir, metavar="DIR", help="a run directory (written by `optiscope run` or `sweep`)"
    )
    demo = sub.add_parser("demo", help="every experiment in quick mode, then the report page of them all")
    demo.add_argument(
        "--out",
        type=out_dir,
        default=Path("runs/demo"),
        metavar="DIR",
        help="the folder of the demo's runs, one directory per experiment, and its report (default: runs/demo)",
    )
    demo.add_argument(
        "--workers",
        type=int,
        default=usable_cpus(),
        metavar="INT",
        help="experiments run at a time, each on its share of the CPUs (default: the CPUs this process may use)",
    )
    page = sub.add_parser("report", help="one self-contained HTML page of run directories (or --watch one)")
    page.add_argument("dirs", nargs="+", type=run_dir, metavar="DIR", help="run directories (several are compared)")
    page.add_argument(
        "--out",
        type=out_dir,
        default=None,
        metavar="PATH",
        help="the HTML file (default: DIR/report.html; for several, in their common parent)",
    )
    page.add_argument("--watch", action="store_true", help="serve the page on 127.0.0.1, refreshing as the run writes")
    add_sweep_parser(sub)
    add_suggest_parser(sub)
    return parser


def torchrun_refusal(args: argparse.Namespace) -> str | None:
    """Why this command cannot run in the torchrun job it was started in (None: it can, or there is none):
    only the experiments that train data-parallel split their work over the processes; anything else would
    run whole in every process, each writing the same files."""
    world = runs.world_size()
    if world == 1 or args.command == "list":
        return None
    parallel = experiments.data_parallel()
    if args.command == "run" and args.name in parallel:
        return None
    doing = f"run {args.name}" if args.command == "run" else args.command
    return (
        f"{doing}: started by torchrun ({world} processes), but only `optiscope run {' / '.join(parallel)}` trains "
        f"data-parallel; start `optiscope {doing}` without torchrun"
        + (" (a sweep runs trials side by side with --workers or --backend ray)" if args.command == "sweep" else "")
    )


def _error(message: str) -> None:
    """One line on stderr, never wrapped (pipes and logs get it whole)."""
    print(f"optiscope: {message}", file=sys.stderr, flush=True)


def _error_once_per_machine(message: str) -> None:
    """``_error`` for bad input that every process of a torchrun job meets alike (the command line, a bad
    setting of it): said by the first process on each machine (``LOCAL_RANK`` 0), not by each."""
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:
        _error(message)


def main(argv: list[str] | None = None) -> int:
    console = Console(soft_wrap=True)
    parser = make_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = ("run", "sweep", "suggest-lr")
    named = argv[1] if len(argv) > 1 and argv[0] in commands and not argv[1].startswith("-") else None
    offered = experiments.suggestable() if argv[:1] == ["suggest-lr"] else experiments.EXPERIMENTS
    if named is not None and named not in offered:  # one line, not argparse's usage block
        listed = {"sweep": experiments.sweepable, "suggest-lr": experiments.suggestable}
        valid = sorted(listed.get(argv[0], lambda: experiments.EXPERIMENTS)())
        known = ", ".join(valid) or "none declares an objective"
        _error_once_per_machine(f"{argv[0]}: unknown experiment {named!r}; valid: {known}")
        return EXIT_BAD_INPUT
    try:
        args = parser.parse_args(argv)
    except runs.RunDirError as e:  # raised by an argument type (an empty --out)
        _error_once_per_machine(str(e))
        return EXIT_BAD_INPUT
    except UsageError as e:
        hint = _unknown_options_hint(parser, argv) if "unrecognized arguments" in str(e) else ""
        _error_once_per_machine(f"{e}{hint}")
        return EXIT_BAD_INPUT
    refused = torchrun_refusal(args)
    if refused:
        if runs.is_rank_zero():  # every process gets here: one says it
            _error(refused)
        return EXIT_BAD_INPUT
    try:
        return run_command(args, argv, console)
    finally:
        leave_job()  # a torchrun job's process group, freed before the interpreter's shutdown (train.distributed)


def run_command(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    """Run the parsed command; its exit code, every error said as the module's docstring says."""
    command = {
        "list": lambda: cmd_list(console),
        "run": lambda: cmd_run(args, console),
        "plot": lambda: cmd_plot(args, console),
        "demo": lambda: cmd_demo(args, console),
        "report": lambda: cmd_report(args, console),
        "sweep": lambda: cmd_sweep(args, console),
        "suggest-lr": lambda: cmd_suggest(args, console),
    }[args.command]
    try:
        with terminate_as_interrupt():
            return command()
    except UserError as e:
        said = f"{args.command}: error: {e}".replace("\n", " ")
        # a bad setting met before the processes joined is the command line's, alike in all; after, or any
        # other (a download, a run directory), a process that alone meets it must say so
        joined = torch.distributed.is_available() and torch.distributed.is_initialized()
        (_error_once_per_machine if isinstance(e, ConfigError) and not joined else _error)(said)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:
        if args.command == "demo":  # it replaces its runs each time: nothing to resume
            _error("interrupted: the demo stopped; `optiscope demo` runs it again from the start")
            return EXIT_INTERRUPTED
        where = getattr(args, "out", None) or getattr(args, "dir", None)
        stopped = f"{e}; " if str(e) else ""
        if runs.is_rank_zero():  # every rank of a torchrun job stops at the same step: one says so
            if args.command in ("run", "sweep"):
                _error(f"interrupted: {stopped}{what_is_saved(where)}")
            else:  # plot, report: nothing of a run is at stake
                _error(f"interrupted: {e}" if str(e) else "interrupted")
        return EXIT_INTERRUPTED
    except Exception:
        where = getattr(args, "out", None) or getattr(args, "dir", None)
        if args.command == "report":  # where the page would have gone, not into one of the runs it shows
            try:
                where = Path(args.out or report_module().default_out(args.dirs)).parent
            except Exception:  # noqa: BLE001 (the error log then goes to the temporary directory)
                where = None
            if where is not None and runs.holds_run(where):  # one run's page goes into it: the log does not
                where = None
        if where is not None and not runs.is_rank_zero():
            where = None
        log = runs.write_error_log(where, f"optiscope {' '.join(argv or sys.argv[1:])}", traceback.format_exc())
        kind, error = sys.exc_info()[:2]
        message = " ".join(str(error).split()) or kind.__name__
        training = args.command in ("run", "sweep")
        saved = f"{what_is_saved(where)}; " if training else ""
        if out_of_memory(error):
            _error(f"out of memory: {message} (the sizes asked for need more memory; {saved}traceback in {log})")
        elif peer_failure(error):
            resumable = training and where is not None and runs.holds_run(Path(where))
            resume = "the same command with --resume continues from the last checkpoint; " if resumable else ""
            _error(
                f"the distributed job failed: {kind.__name__}: {message} (another process of it stopped or lost its "
                f"connection: its own output and torchrun's summary say why; {saved}{resume}traceback in {log})"
            )
        else:
            _error(f"internal error: {kind.__name__}: {message} (this is a bug in optiscope; traceback in {log})")
        return EXIT_INTERNAL


def what_is_saved(where: str | os.PathLike | None) -> str:
    """What a stopped command left: its finished work in ``where``, or nothing (stopped before any finished)."""
    if where is None:
        return "finished work is saved"
    if runs.holds_run(Path(where)):  # a missing path, or a file: no
        return f"finished work is saved in {where}"
    return f"it stopped before any work finished: nothing is saved in {where}"


#: what gloo's errors say when the process at the other end has gone: a plain ``RuntimeError`` (seen with torch
#: 2.13 when a rank was killed: "[…/gloo/transport/tcp/pair.cc:537] Read error …: Connection reset by peer")
PEER_GONE = ("gloo/transport", "Connection reset by peer", "Connection closed by peer")


def peer_failure(error: BaseException | None) -> bool:
    """Whether ``error`` is a collective of a torchrun job that failed because another process stopped (killed,
    out of memory, its own error) or its connection broke: torch's ``DistError``, or gloo's plain
    ``RuntimeError`` naming its transport."""
    if isinstance(error, torch.distributed.DistError):
        return True
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in PEER_GONE)


def out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error`` is an allocation that failed: Python's ``MemoryError``, torch's ``OutOfMemoryError``
    (an accelerator's; ``torch.cuda``'s name for it reaches back to torch 2.4), or the CPU allocator's, which
    torch raises as a plain ``RuntimeError`` naming the allocator."""
    if isinstance(error, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "DefaultCPUAllocator" in str(error)


if __name__ == "__main__":
    sys.exit(main())
