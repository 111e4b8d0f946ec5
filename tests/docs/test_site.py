"""The built site: `mkdocs build --strict` passes, and in a real browser it works offline from the file system.

One build per session (into a temporary folder), as `make docs` builds it, and one tour of its pages that the
checks share; the browser is the distribution's Chromium (``tests/conftest.py``), which aborts and records any
request that leaves the site.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from report.browser import open_page

from .pages import ROOT


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems)
    return out


def html_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_build_is_strict_clean(site):
    assert (site / "index.html").is_file()
    assert (site / "api" / "monitor.html").is_file()


#: The window the docs are read in (a laptop's): the text column is then about 690 px wide, between the sidebars.
WINDOW = {"width": 1400, "height": 900}

BROKEN_IMAGES = "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"


@dataclass
class Tour:
    """Every page of the site opened once in one browser page at ``WINDOW``: what each showed, by its path in the
    site (images that did not load, code and tables that do not fit, figures), and the page that made the tour
    (its requests, console errors and aborted external requests)."""

    page: Any
    seen: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def tour(site, browser) -> Tour:
    context, page = open_page(browser)
    page.set_viewport_size(WINDOW)
    seen = {}
    for path in html_pages(site):
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        seen[str(path.relative_to(site))] = {
            "broken": page.evaluate(BROKEN_IMAGES),
            "code": {kind: items for kind, items in page.evaluate(CODE_AND_TABLES).items() if items},
            "figures": page.evaluate(FIGURES),
        }
    yield Tour(page, seen)
    context.close()


def test_every_page_opens_offline_with_its_images_and_no_error(tour):
    assert len(tour.seen) > 30
    for name, seen in tour.seen.items():
        assert not seen["broken"], f"{name}: images that did not load: {seen['broken']}"
    outside = [url for url in tour.page.requests if not url.startswith(("file://", "data:", "blob:"))]
    assert not outside, f"requests outside the site: {sorted(set(outside))[:5]}"
    assert not tour.page.external
    assert not tour.page.errors, f"console errors: {tour.page.errors[:5]}"


def test_search_finds_the_monitor_guide_for_u_over_w(site, page):
    page.goto((site / "index.html").as_uri())
    page.locator(".md-search__input").first.click()
    page.keyboard.type("u/w", delay=20)  # as a person types: Material searches on key events
    results = page.locator(".md-search-result__link")
    results.first.wait_for(timeout=15_000)
    links = results.evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert any("guides/monitor.html" in href for href in links), links
    assert not page.errors, page.errors


CODE_AND_TABLES = """() => {
  const column = document.querySelector('.md-content__inner').getBoundingClientRect();
  const code = [...document.querySelectorAll('.md-typeset code')];
  const box = (e) => {
    let b = e.parentElement;
    while (b && getComputedStyle(b).overflowX === 'visible') b = b.parentElement;
    return b;
  };
  const start = (e) => e.textContent.slice(0, 60);
  return {
    scrolled: code.filter(c => c.parentElement.tagName === 'PRE' && c.scrollWidth > c.clientWidth + 1).map(start),
    broken: [...document.querySelectorAll('.md-typeset code .nobr')].filter(w => w.getClientRects().length > 1)
      .map(start),
    unwrapped: code.filter(c => /\\S/.test(c.textContent) && !c.querySelector('.nobr')).map(start),
    outside: [...document.querySelectorAll('.md-typeset code .nobr')].filter(w => !w.closest('table, pre'))
      .filter(w => w.getBoundingClientRect().right > column.right + 1).map(start),
    spilled: [...document.querySelectorAll('.md-typeset table')]
      .filter(t => box(t).getBoundingClientRect().right > column.right + 17).map(start),
  };
}"""


def test_code_wraps_at_its_spaces_and_wide_tables_scroll_in_their_own_box(tour):
    """At a 1,400 px window, on every page: no line of a code block hides behind a scrollbar, no word of code (a
    run without spaces, such as ``--weight-decay`` or ``benchmarks/optim_step.py``) is broken across lines (the
    Performance page's tables had shown "benchmark s/optim_s tep.py"), no inline code runs past the column, and a
    table wider than the column scrolls inside its own box (Material's, 0.8 rem beyond the text on each side)."""
    found = {name: seen["code"] for name, seen in tour.seen.items() if seen["code"]}
    assert not found, found


FIGURES = """() => [...document.querySelectorAll('.md-content img')].map(i => ({
  src: i.getAttribute('src'), shown: i.getBoundingClientRect().width, pixels: i.naturalWidth}))"""


def test_every_figure_is_legible_where_it_sits(site, tour):
    """At a 1,400 px window each figure of a page is shown at most as wide as the text column: its smallest text
    (the figure's own record, in its PNG: ``figures.style.SMALLEST_FONT_KEY``) renders at that size times the
    displayed width over the PNG's, which must be at least ``LEGIBLE_PX`` (multi-panel figures had shown legends and
    labels at about 5 px)."""
    from PIL import Image

    from optiscope.figures import style

    small = []
    for name, seen in tour.seen.items():
        for image in seen["figures"]:
            if "assets/figures/" not in image["src"]:
                continue
            with Image.open((site / name).parent / image["src"]) as png:
                assert png.width == image["pixels"]
                smallest = float(png.text[style.SMALLEST_FONT_KEY])
            rendered = smallest * image["shown"] / image["pixels"]
            if rendered < style.LEGIBLE_PX:
                small.append(f"{name}: {image['src']} at {rendered:.1f} px")
    assert not small, small
