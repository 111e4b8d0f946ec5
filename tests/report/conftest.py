"""The report's tests share the figures' runs (made once) and the browser of ``tests/conftest.py``, and the page
of all the tiny runs (written once per test run, loaded once per module)."""

import pytest

from figures.conftest import NAMES, corpus, tiny_results, tiny_runs, tiny_runs_made  # noqa: F401  (the same runs)
from optiscope import cli
from support import made_once

from .browser import load, open_page


@pytest.fixture(scope="session")
def page_runs(tiny_runs_made):  # noqa: F811
    """experiment name -> the tiny run the written page shows (read it only)."""
    return {name: tiny_runs_made / name for name in NAMES}


@pytest.fixture(scope="session")
def written(tiny_runs_made, tmp_path_factory):  # noqa: F811  (tiny_runs_made is the fixture imported above)
    """The page of every tiny run, one section per experiment, written once per test run (read it only)."""

    def write(folder):
        runs = [str(tiny_runs_made / name) for name in NAMES]
        assert cli.main(["report", *runs, "--out", str(folder / "report.html")]) == 0

    return made_once(tmp_path_factory, "report-of-the-tiny-runs", write) / "report.html"


@pytest.fixture(scope="module")
def shown(browser, written):
    """The written report, loaded once for a module's tests."""
    context, page = open_page(browser)
    load(page, written.as_uri())
    yield page
    context.close()
