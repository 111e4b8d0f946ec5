"""Helpers of the browser tests: the system's Chromium, a page that records errors and requests, and
waiting for the charts."""

import os
import shutil
from pathlib import Path

BINARIES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome-stable", "google-chrome")


def find_chromium() -> str | None:
    for name in (os.environ.get("OPTISCOPE_CHROMIUM"), *BINARIES):
        if name and (found := shutil.which(name) or (Path(name).is_file() and name)):
            return str(found)
    return None


def open_page(browser):
    """A fresh page that records console errors and every request; requests to anything but the page's
    own origin (file:// or the local report server) are aborted and recorded as external."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors, page.requests, page.external, page.failed = [], [], [], []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("requestfailed", lambda r: page.failed.append(r.url))
    page.on("request", lambda r: page.requests.append(r.url))

    def route(r):
        url = r.request.url
        if url.startswith(("file://", "data:", "http://127.0.0.1:")):
            r.continue_()
        else:
            page.external.append(url)
            r.abort()

    page.route("**/*", route)
    return context, page


def load(page, url: str, idle: bool = True) -> None:
    """Go to ``url`` and wait until BokehJS has rendered the page's charts (and, with ``idle``, until the
    network is quiet: never, for a watched page, which keeps polling)."""
    page.goto(url)
    page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && Object.keys(Bokeh.index).length > 0")
    if idle:
        page.wait_for_load_state("networkidle")


def unfold(page) -> None:
    """Open every collapsed ``<details>`` (a run's per-parameter charts, its config) and wait until BokehJS has
    laid out the charts in them."""
    page.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.chart [data-root-id]')].every(e => Bokeh.index[e.dataset.rootId]"
        " && Bokeh.index[e.dataset.rootId].el.getBoundingClientRect().width > 100)"
    )
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
