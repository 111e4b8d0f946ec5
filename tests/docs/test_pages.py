"""The docs stay true: every Python example on a page runs as shown, every command parses, every figure is there.

"A page" is the README or any Markdown file under ``docs/``. A page's ``python`` blocks run in order in one
namespace (a tutorial builds on its earlier blocks), in a fresh working directory.
"""

import importlib
import re
import shlex

import pytest

from .pages import DOCS, PAGES, README, ROOT, blocks, name

WITH_CODE = [page for page in PAGES if blocks(page, "python")]


@pytest.mark.parametrize("page", WITH_CODE, ids=name)
def test_python_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(blocks(page, "python")):
        exec(compile(code, f"{name(page)} (python block {i + 1})", "exec"), namespace)


def command_lines() -> list[tuple[str, str]]:
    """Every `optiscope …` command in the pages' bash blocks (torchrun's `-m optiscope …` included), without its
    comment; synopsis lines with <placeholders> or [options] are left out."""
    found = []
    for page in PAGES:
        for block in blocks(page, "bash"):
            for line in block.splitlines():
                command = line.split(" #")[0].strip()
                _, sep, rest = command.partition("optiscope ")
                runs_optiscope = command.startswith("optiscope") or "-m optiscope" in command
                if sep and not re.search(r"[<\[]", rest) and runs_optiscope:
                    found.append((name(page), rest))
    return found


@pytest.mark.parametrize(("page", "line"), command_lines())
def test_command_parses_and_its_options_are_valid(page, line, monkeypatch):
    """Each command a page shows is accepted as written, from the repository's root: known options, valid values,
    the recipes of its ``--recipes`` file."""
    from optiscope import cli, experiments, sweep

    monkeypatch.chdir(ROOT)
    args = cli.make_parser().parse_args(shlex.split(line))
    if getattr(args, "recipes", None) is not None:
        cli.load_recipes(args)
    if args.command == "run":
        experiments.build_config(experiments.load(args.name), args.quick, cli.config_overrides(args))
    if args.command == "sweep":
        sweep.sweep.check(cli.sweep_config(args))


def test_every_public_name_has_its_api_entry():
    """Each package's API page has a ``::: package.name`` entry for every name in its ``__all__``."""
    text = "".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    # an entry, or an anchor before one (a function named as its module is rendered from inside it)
    entries = set(re.findall(r"^::: ([\w.]+)", text, re.M)) | set(re.findall(r"^\[\]\(\)\{#([\w.]+)\}", text, re.M))
    from test_docstrings import PUBLIC

    missing = [
        f"{package}.{n}"
        for package in PUBLIC
        if package != "optiscope"  # the top level re-exports names documented on their packages' pages
        for n in importlib.import_module(package).__all__
        if f"{package}.{n}" not in entries
    ]
    assert not missing, f"no API entry for {missing}"


def test_every_figure_a_page_shows_is_in_the_repository_and_small():
    shown = {(page, src) for page in PAGES for src in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", page.read_text())}
    for page, src in shown:
        if not src.startswith(("http://", "https://")):
            assert (page.parent / src).is_file(), f"{name(page)} shows {src}, which is not there"
    images = [p for p in (DOCS / "assets").rglob("*") if p.suffix in (".png", ".svg", ".jpg", ".gif", ".webp")]
    unused = [p for p in images if not any((page.parent / src).resolve() == p.resolve() for page, src in shown)]
    assert not unused, f"figures no page shows: {[str(p.relative_to(ROOT)) for p in unused]}"
    total = sum(p.stat().st_size for p in images)
    assert total < 5 * 2**20, f"the docs' figures take {total / 2**20:.1f} MB; the budget is 5 MB"


def test_pages_stay_short():
    """The README is a landing page (≤ 12 KB); no page of the site is longer than ~25 KB."""
    assert len(README.read_bytes()) <= 12 * 1024, f"README.md is {len(README.read_bytes()) / 1024:.1f} KB"
    long = {name(p): len(p.read_bytes()) for p in DOCS.rglob("*.md") if len(p.read_bytes()) > 26 * 1024}
    assert not long, f"pages over 26 KB: {long}"


def test_the_cli_reference_lists_exactly_the_options_the_commands_take():
    """A new option, or one renamed or gone, shows on docs/guides/cli.md or, for an experiment's own, on
    docs/guides/cli-experiments.md (whose help texts come from the parser)."""
    from optiscope import cli
    from test_cli import parsers

    pages = [DOCS / "guides" / "cli.md", DOCS / "guides" / "cli-experiments.md"]
    page = "".join(p.read_text() for p in pages)
    taken = {option for _, p in parsers(cli.make_parser()) for a in p._actions for option in a.option_strings}
    helps = [line for path in pages for block in blocks(path, "text") for line in block.splitlines()]
    # the help texts, not the error messages shown as examples (one names a misspelt option on purpose)
    shown = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", "\n".join(h for h in helps if "optiscope:" not in h)))
    long_options = {o for o in taken if o.startswith("--")}
    assert not long_options - shown, f"options cli.md does not show: {sorted(long_options - shown)}"
    assert not shown - long_options, f"options cli.md shows that no command takes: {sorted(shown - long_options)}"
    assert page.count("```text") >= len({path[0] for path, _ in parsers(cli.make_parser()) if path})
