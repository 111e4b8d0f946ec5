"""The ``optiscope`` command: ``list``, ``run <name> --out DIR [--quick]``, ``plot DIR``, ``demo``.

Every experiment's options come from its ``Config`` dataclass, so ``optiscope run <name> --help``
always lists exactly what the experiment accepts, with its defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import __version__, experiments, figures, runs

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


def _converter(tp: Any, optional: bool):
    """A string -> value function for an option of type ``tp`` ('none' -> None where allowed)."""
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        inner = typing.get_args(tp)[0]

        def convert_seq(text: str):
            items = [s.strip() for s in text.split(",") if s.strip()]
            return tuple(inner(s) for s in items)

        base = convert_seq
    else:
        base = tp

    def convert(text: str):
        if optional and text.lower() == "none":
            return None
        return base(text)

    convert.__name__ = getattr(tp, "__name__", str(tp))
    return convert


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    hints = typing.get_type_hints(config_cls)
    defaults = config_cls()
    for f in dataclasses.fields(config_cls):
        if not f.init or f.metadata.get("cli") is False:
            continue
        tp, optional = _unwrap_optional(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple | list) else default
        help_text = f"{f.metadata.get('help', '')} (default: {shown})".strip()
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        else:
            metavar = f.metadata.get("metavar") or (
                "A,B,..." if typing.get_origin(tp) in (tuple, list) else getattr(tp, "__name__", "VALUE").upper()
            )
            parser.add_argument(
                flag,
                dest=f.name,
                type=_converter(tp, optional),
                default=argparse.SUPPRESS,
                metavar=metavar,
                help=help_text,
            )


def build_config(module: Any, quick: bool, overrides: dict[str, Any]) -> Any:
    """The experiment's Config: defaults, then QUICK (with --quick), then explicit options."""
    values = dict(getattr(module, "QUICK", {})) if quick else {}
    values.update(overrides)
    return module.Config(**values)


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


def run_experiment(name: str, out: Path, quick: bool, overrides: dict[str, Any], console: Console) -> dict[str, Any]:
    """Configure, run, save results.json and draw the figures of one experiment."""
    module = experiments.load(name)
    config = build_config(module, quick, overrides)
    resume = bool(getattr(config, "resume", False))
    config_dict = {k: v for k, v in dataclasses.asdict(config).items() if k != "resume"}
    writer = runs.is_rank_zero()
    if writer:
        runs.prepare_run_dir(out, name, config_dict, resume=resume)
    started = time.perf_counter()
    results = module.run(config, Path(out))
    if not writer:
        return results
    results = {"experiment": name, "quick": quick, **results}
    results.setdefault("status", "ok")
    results["wall_seconds"] = round(time.perf_counter() - started, 3)
    runs.atomic_write_json(Path(out) / runs.RESULTS, results)
    results["figures"] = [
        str(p) for p in figures.draw(runs.read_json(Path(out) / runs.RESULTS), Path(out) / runs.FIGURES)
    ]
    return results


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "name", "out", "quick")}
    results = run_experiment(args.name, Path(args.out), args.quick, overrides, console)
    if not runs.is_rank_zero():
        return 0
    console.print(f"[bold]{args.name}[/bold] results: {Path(args.out) / runs.RESULTS}")
    for path in results["figures"]:
        console.print(f"  figure: {path}")
    if results.get("status") == "diverged":
        console.print(f"[bold red]diverged[/bold red]: {results.get('divergence', {})}")
        return EXIT_DIVERGED
    return 0


def cmd_plot(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.dir)
    results = runs.read_json(out / runs.RESULTS)
    for path in figures.draw(results, out / runs.FIGURES):
        console.print(f"figure: {path}")
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Every experiment in quick mode, one after another, then a list of the figures."""
    out = Path(args.out)
    written: list[tuple[str, str, float]] = []
    names = list(experiments.EXPERIMENTS)  # the registry's order tells the story
    if not names:
        console.print("No experiments are registered yet.")
        return 0
    for name in names:
        console.rule(f"[bold]{name}[/bold] (quick)")
        started = time.perf_counter()
        results = run_experiment(name, out / name, True, {}, console)
        elapsed = time.perf_counter() - started
        written.extend((name, p, elapsed) for p in results["figures"])
    console.rule("[bold]figures[/bold]")
    for name, path, elapsed in written:
        console.print(f"{name:<14} {path}  [dim]({elapsed:.0f} s)[/dim]")
    return 0


# ---------------------------------------------------------------------------------------------- main
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optiscope",
        description="A PyTorch laboratory for optimizers: run an experiment, get data and figures.",
    )
    parser.add_argument("--version", action="version", version=f"optiscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{list,run,plot,demo}")
    sub.required = True
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run an experiment: optiscope run <name> --out DIR [--quick]")
    run_sub = run.add_subparsers(dest="name", metavar="name")
    run_sub.required = True
    for name in sorted(experiments.EXPERIMENTS):
        module = experiments.load(name)
        p = run_sub.add_parser(name, help=module.SUMMARY, description=module.SUMMARY)
        p.add_argument("--out", required=True, type=Path, help="run directory for config, results and figures")
        p.add_argument("--quick", action="store_true", help="the short version (what `make demo` runs)")
        add_config_arguments(p, module.Config)
    plot = sub.add_parser("plot", help="redraw the figures of a run directory from its results.json")
    plot.add_argument("dir", type=Path)
    demo = sub.add_parser("demo", help="every experiment in quick mode, then where the figures are")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"))
    return parser


def main(argv: list[str] | None = None) -> int:
    console = Console()
    parser = make_parser()
    args = parser.parse_args(argv)
    command = {
        "list": lambda: cmd_list(console),
        "run": lambda: cmd_run(args, console),
        "plot": lambda: cmd_plot(args, console),
        "demo": lambda: cmd_demo(args, console),
    }[args.command]
    try:
        return command()
    except (experiments.ConfigError, FileExistsError, FileNotFoundError, NotADirectoryError) as e:
        console.print(f"[bold red]optiscope {args.command}: error:[/bold red] {e}", highlight=False)
        return EXIT_BAD_INPUT
    except ValueError as e:
        console.print(f"[bold red]optiscope {args.command}: error:[/bold red] {e}", highlight=False)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        console.print("[bold yellow]interrupted[/bold yellow]: finished work is saved; long runs resume with --resume")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
