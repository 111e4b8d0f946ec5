"""Figures: each module turns one experiment's ``results.json`` into PNGs, with no training code.

``draw(results, fig_dir)`` dispatches on ``results["experiment"]``; every module draws with
``optiscope.figures.style`` and takes every number it shows from ``results``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

DRAWERS: dict[str, str] = {
    "rare-tokens": "optiscope.figures.rare_tokens",
    "landscapes": "optiscope.figures.landscapes",
    "lm": "optiscope.figures.lm",
    "entropy": "optiscope.figures.entropy",
    "adder": "optiscope.figures.adder",
}


def draw(results: dict[str, Any], fig_dir: Path) -> list[Path]:
    """Draw every figure of ``results`` into ``fig_dir``; returns the paths written."""
    name = results.get("experiment")
    if name not in DRAWERS:
        raise ValueError(f"results.json names experiment {name!r}, which has no figures; known: {sorted(DRAWERS)}")
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    return importlib.import_module(DRAWERS[name]).draw(results, fig_dir)
