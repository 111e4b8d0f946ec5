"""Experiments: one module each, every one reachable as ``optiscope run <name> --out DIR [--quick]``.

An experiment module defines

* ``SUMMARY`` — one line for ``optiscope list``;
* ``Config`` — a dataclass whose fields become command-line options (``field(metadata={"help": ...})``)
  and whose ``__post_init__`` raises ``ConfigError`` naming any bad value and the valid ones;
* ``QUICK`` — field overrides for ``--quick`` (what ``make demo`` runs: well under a minute on a laptop);
* ``run(config, run_dir) -> dict`` — does the work and returns the results that ``results.json`` keeps
  and the figures are drawn from. Long runs also write ``metrics.jsonl`` and checkpoints in ``run_dir``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: dict[str, str] = {
    "rare-tokens": "optiscope.experiments.rare_tokens",
    "landscapes": "optiscope.experiments.landscapes",
    "lm": "optiscope.experiments.lm",
    "entropy": "optiscope.experiments.entropy",
    "adder": "optiscope.experiments.adder",
}


class ConfigError(ValueError):
    """A bad experiment setting; the message names the value and what would be valid."""


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        valid = ", ".join(sorted(EXPERIMENTS)) or "(none yet)"
        raise ConfigError(f"unknown experiment {name!r}; valid experiments: {valid}")
    return importlib.import_module(EXPERIMENTS[name])


def parse_names(
    text: str | list[str] | tuple[str, ...], valid: list[str] | tuple[str, ...], what: str
) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'), each checked against ``valid`` (a clear ConfigError lists the valid names)."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    if not names:
        raise ConfigError(f"{what}: empty list; choose from {', '.join(valid)}")
    bad = [n for n in names if n not in valid]
    if bad:
        raise ConfigError(f"{what}: unknown {', '.join(map(repr, bad))}; valid: {', '.join(valid)}")
    return tuple(names)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
