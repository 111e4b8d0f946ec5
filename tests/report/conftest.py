"""The report's tests share the figures' runs (made once) and the browser of ``tests/conftest.py``, and the page
of all the tiny runs (written once per module, loaded once per module)."""

import pytest

from figures.conftest import corpus, tiny_results, tiny_runs  # noqa: F401  (the same runs, made once)
from optiscope import cli

from .browser import load, open_page


@pytest.fixture(scope="module")
def written(tiny_runs, tmp_path_factory):  # noqa: F811  (tiny_runs is the fixture imported above)
    """The page of every tiny run, one section per experiment."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert cli.main(["report", *map(str, tiny_runs.values()), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def shown(browser, written):
    """The written report, loaded once for a module's tests."""
    context, page = open_page(browser)
    load(page, written.as_uri())
    yield page
    context.close()
