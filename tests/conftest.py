"""Fixtures shared by the test packages: a real browser (the report's and the docs site's tests).

The distribution's headless Chromium driven by Playwright. No browser is ever downloaded (``playwright install``
is not used): Playwright is pointed at the Chromium binary that the system has (Debian: ``apt-get install
chromium``). Where none is found, the browser tests skip with a message saying how to install one, except under CI
(``CI`` set), where they fail: there, as root, installing the package is tried first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from report.browser import find_chromium, open_page
from support import run_folder

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


def _demo_folder(tmp_path_factory) -> Path:
    """Where this test run's demo goes: one worker starts it, any worker reads it."""
    return run_folder(tmp_path_factory) / "demo-of-this-run"


def _start_demo(folder: Path) -> subprocess.Popen:
    """``make demo`` as the Makefile runs it (``python -m optiscope demo``) into files, from a shell whose PATH
    lacks the environment's ``bin`` (one that has not activated it); its exit status goes to ``folder/rc`` last."""
    folder.mkdir()
    own_bin = Path(sys.prefix, "bin").resolve()
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != own_bin
    )
    script = '"$0" -m optiscope demo --out "$1/demo" >"$1/stdout" 2>"$1/stderr"; echo $? >"$1/rc.part"; '
    script += 'mv "$1/rc.part" "$1/rc"'
    return subprocess.Popen(
        ["bash", "-c", script, sys.executable, str(folder)], env={**os.environ, "COLUMNS": "100", "PATH": path}
    )


@pytest.fixture(scope="session", autouse=True)
def _demo_started_early(request, tmp_path_factory):
    """The demo takes minutes of one core, so when any test of the session needs it, it starts with the session's
    first test and runs beside the others (under pytest-xdist, in the first worker only)."""
    if not request.config.stash.get(NEEDS_DEMO, False) or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        yield
        return
    started = _start_demo(_demo_folder(tmp_path_factory))
    yield
    started.wait()  # another worker may still be waiting for it


@pytest.fixture(scope="session")
def demo(tmp_path_factory, _demo_started_early) -> Demo:
    """The demo of this test run (every experiment's quick run, their figures and the report page), shared by
    the tests of the demo's output, its headlines, its figures in the report and Getting started's shell steps:
    waits for the run that ``_demo_started_early`` started (about three minutes of one core)."""
    folder = _demo_folder(tmp_path_factory)
    deadline = time.monotonic() + 3600
    while not (folder / "rc").is_file():
        assert time.monotonic() < deadline, f"the demo in {folder} did not end within an hour"
        time.sleep(1)
    stderr = (folder / "stderr").read_text()
    assert (folder / "rc").read_text().strip() == "0", stderr
    return Demo(folder / "demo", (folder / "stdout").read_text().splitlines(), stderr)


@pytest.fixture(autouse=True)
def _own_recipes(monkeypatch):
    """Each test registers its recipes (``--recipes``, ``register_recipe``) for itself: a name one test gave a
    recipe is unknown in the next, as in a new process."""
    from optiscope.optim import recipes

    monkeypatch.setattr(recipes, "_registered", {})


NEEDS_DEMO = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # the tests that will run: after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    config.stash[NEEDS_DEMO] = any("demo" in item.fixturenames for item in items)


@pytest.fixture
def one_ray_at_a_time(tmp_path_factory):
    """Held by a test that starts a local Ray instance: under pytest-xdist no other worker starts one meanwhile (a
    second ``ray.init`` on one machine can join the first's instance, which then shuts down under it)."""
    with open(run_folder(tmp_path_factory) / "ray.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pytest_configure(config):
    # Each worker, and every process it starts, computes on one thread: workers with torch's default of one thread
    # per core would ask for more cores than there are, and OpenMP's waiting threads then slow them all. The
    # processes a test starts get the same count, as results compared bit for bit depend on it.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
