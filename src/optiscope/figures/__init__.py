"""Figures: each module turns one experiment's ``results.json`` into PNGs, with no training code.

A figure module has ``FIGURES``: file name -> a function ``results -> matplotlib Figure``. It draws with
``optiscope.figures.style``, takes every number it shows from ``results`` (and computes nothing a title
states: the experiment did), and draws something sensible for any valid results — diverged runs, NaN or
infinite values, zeros on log axes, a single run or step — replacing a panel that has nothing to show by
a short note. ``draw`` calls each function separately, so one figure that still fails never costs the
others, and never the run's results: ``draw_run`` writes the failure's traceback to ``DIR/error.log``.
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runs
from ..errors import UserError

DRAWERS: dict[str, str] = {
    "rare-tokens": "optiscope.figures.rare_tokens",
    "landscapes": "optiscope.figures.landscapes",
    "lm": "optiscope.figures.lm",
    "entropy": "optiscope.figures.entropy",
    "adder": "optiscope.figures.adder",
    "sweep": "optiscope.figures.sweep",
    "edge-of-stability": "optiscope.figures.edge_of_stability",
    "mlp": "optiscope.figures.mlp",
}


@dataclass
class Drawn:
    """The figures written, (file name, traceback) of each that could not be drawn, and the error.log that holds
    those tracebacks (None when none failed)."""

    paths: list[Path]
    failures: list[tuple[str, str]]
    log: Path | None = None


def module_for(results: dict[str, Any]) -> Any:
    name = results.get("experiment") if isinstance(results, dict) else None
    if name not in DRAWERS:
        raise UserError(f"these results name experiment {name!r}, which has no figures; known: {', '.join(DRAWERS)}")
    return importlib.import_module(DRAWERS[name])


def draw(results: dict[str, Any], fig_dir: Path) -> Drawn:
    """Draw every figure of ``results`` into ``fig_dir``, each on its own."""
    from . import style  # matplotlib is imported only when something is drawn

    module = module_for(results)
    fig_dir = Path(fig_dir)
    try:
        fig_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder goes, a folder that cannot be written: the results stay
        raise UserError(f"cannot draw the figures into {fig_dir} ({e.strerror or e}); move what is there away") from e
    style.apply()
    drawn = Drawn([], [])
    for name, figure in module.FIGURES.items():
        try:
            drawn.paths.append(style.save(figure(results), fig_dir / name))
        except OSError as e:  # the file could not be written (a read-only folder, a full disk): no bug of ours
            style.close_all()
            raise UserError(
                f"cannot write the figure {fig_dir / name} ({e.strerror or e}); the results are untouched; give the "
                "figures a folder that can be written"
            ) from e
        except Exception:
            style.close_all()
            drawn.failures.append((name, traceback.format_exc()))
    return drawn


def draw_run(run_dir: Path, results: dict[str, Any] | None = None) -> Drawn:
    """Draw the figures of a run directory from its results.json; failures go to its error.log."""
    run_dir = Path(run_dir)
    results = results if results is not None else runs.read_json(run_dir / runs.RESULTS)
    drawn = draw(results, run_dir / runs.FIGURES)
    for name, trace in drawn.failures:  # where the log went: the temporary folder when the run's is read-only
        drawn.log = runs.write_error_log(run_dir, f"figure {name} from {run_dir / runs.RESULTS}", trace)
    return drawn
