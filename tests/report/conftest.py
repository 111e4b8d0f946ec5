"""The report's tests share the figures' runs (made once) and the browser of ``tests/conftest.py``."""

from figures.conftest import corpus, tiny_results, tiny_runs  # noqa: F401  (the same runs, made once)
