"""The README stays true: its Python examples run as shown."""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_python_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})


def command_lines() -> list[str]:
    """Every `optiscope …` command in the README's bash blocks (torchrun's `-m optiscope …` included),
    without its comment; the synopsis lines with <placeholders> are left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.splitlines():
            command = line.split("#")[0].strip()
            _, sep, rest = command.partition("optiscope ")
            if sep and not re.search(r"[<\[]", rest) and (command.startswith("optiscope") or "-m optiscope" in command):
                found.append(rest)
    return found


@pytest.mark.parametrize("line", command_lines())
def test_command_parses_and_its_options_are_valid(line):
    """Each command the README shows is accepted as written: known options, valid values."""
    from optiscope import cli, experiments, sweep

    args = cli.make_parser().parse_args(shlex.split(line))
    if args.command == "run":
        experiments.build_config(experiments.load(args.name), args.quick, cli.config_overrides(args))
    if args.command == "sweep":
        sweep.check(cli.sweep_config(args))
