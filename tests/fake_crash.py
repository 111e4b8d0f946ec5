"""The fake experiment whose quick run fails inside: for the demo's error, where it runs in another process."""

from fake_experiment import FIGURES, SUMMARY, Config, Results, run  # noqa: F401

QUICK = dict(steps=2, crash="internal")
