"""Fixtures shared by the test packages: a real browser (the report's and the docs site's tests).

The distribution's headless Chromium driven by Playwright. No browser is ever downloaded (``playwright install``
is not used): Playwright is pointed at the Chromium binary that the system has (Debian: ``apt-get install
chromium``). Where none is found, the browser tests skip with a message saying how to install one, except under CI
(``CI`` set), where they fail: there, as root, installing the package is tried first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from report.browser import find_chromium, open_page

HOW = "install the distribution's Chromium (Debian/Ubuntu: `apt-get install -y chromium`) and the dev extras"


def installed_chromium() -> str | None:
    """Chromium, installing the Debian package first when that is possible (root, apt-get)."""
    found = find_chromium()
    if found or not (os.environ.get("CI") and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "install", "-y", "chromium"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "chromium"],
    ):
        subprocess.run(command, env=env, capture_output=True, timeout=900, check=False)
        if found := find_chromium():
            return found
    return None


def unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {message}")
    pytest.skip(f"{message}; to run the browser tests, {HOW}")


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole session."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the Python package playwright is not installed")
    executable = installed_chromium()
    if executable is None:
        unavailable("no Chromium binary found")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context, page = open_page(browser)
    yield page
    context.close()


@dataclass
class Demo:
    """The whole demo, run once: its folder of runs (``report.html`` among them) and what it printed."""

    out: Path
    stdout: list[str]
    stderr: str


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Demo:
    """``make demo`` once per session, as the Makefile runs it (``python -m optiscope demo``) into a pipe, from a
    shell whose PATH lacks the environment's ``bin`` (one that has not activated it): every experiment's quick
    run, their figures and the report page, shared by the tests of the demo's output, its headlines, its figures
    in the report and Getting started's shell steps (about three minutes of one core)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    own_bin = str(Path(sys.prefix, "bin").resolve())
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(own_bin)
    )
    done = subprocess.run(
        [sys.executable, "-m", "optiscope", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "COLUMNS": "100", "PATH": path},
    )
    assert done.returncode == 0, done.stderr
    return Demo(out, done.stdout.splitlines(), done.stderr)


@pytest.fixture(autouse=True)
def _own_recipes(monkeypatch):
    """Each test registers its recipes (``--recipes``, ``register_recipe``) for itself: a name one test gave a
    recipe is unknown in the next, as in a new process."""
    from optiscope.optim import recipes

    monkeypatch.setattr(recipes, "_registered", {})
