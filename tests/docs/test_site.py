"""The built site: `mkdocs build --strict` passes, and in a real browser it works offline from the file system.

One build per session (into a temporary folder), as `make docs` builds it; the browser is the distribution's
Chromium (``tests/conftest.py``), which aborts and records any request that leaves the site.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_every_page_opens_offline_with_its_images_and_no_error(site, page):
    pages = html_pages(site)
    assert len(pages) > 30
    for path in pages:
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        broken = page.evaluate(
            "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
        )
        assert not broken, f"{path.relative_to(site)}: images that did not load: {broken}"
    outside = [url for url in page.requests if not url.startswith(("file://", "data:", "blob:"))]
    assert not outside, f"requests outside the site: {sorted(set(outside))[:5]}"
    assert not page.external
    assert not page.errors, f"console errors: {page.errors[:5]}"


def test_search_finds_the_monitor_guide_for_u_over_w(site, page):
    page.goto((site / "index.html").as_uri())
    page.locator(".md-search__input").first.click()
    page.keyboard.type("u/w", delay=20)  # as a person types: Material searches on key events
    results = page.locator(".md-search-result__link")
    results.first.wait_for(timeout=15_000)
    links = results.evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert any("guides/monitor.html" in href for href in links), links
    assert not page.errors, page.errors
