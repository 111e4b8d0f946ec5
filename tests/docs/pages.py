"""The pages the docs tests read: the README and every Markdown page of the site."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` on ``page`` (a fence may be indented, as inside a list or a details block)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(rf"^([ \t]*)```{language}[^\n]*\n(.*?)^\1```", text, re.S | re.M):
        indent = m.group(1)
        found.append("".join(line.removeprefix(indent) for line in m.group(2).splitlines(keepends=True)))
    return found
