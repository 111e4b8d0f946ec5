"""``optiscope sweep synthetic ...`` as a command of its own, a real process to kill: the synthetic experiment
registered, then optiscope's own entry point. Run as ``python -m sweep.command sweep synthetic ...`` with
``tests`` on ``PYTHONPATH`` (its pool workers import ``sweep.synthetic`` from there too)."""

import sys

from optiscope import experiments

experiments.EXPERIMENTS["synthetic"] = "sweep.synthetic"

if __name__ == "__main__":  # a spawned pool worker imports this module again (as __mp_main__): it must not run
    from optiscope.__main__ import main

    sys.exit(main())
