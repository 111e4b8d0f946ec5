import pytest

from optiscope import experiments


@pytest.fixture
def synthetic(monkeypatch):
    """The synthetic experiment registered as 'synthetic' (its trials carry the module's name, so pool
    and Ray workers import it too)."""
    monkeypatch.setitem(experiments.EXPERIMENTS, "synthetic", "sweep.synthetic")
    return "synthetic"
