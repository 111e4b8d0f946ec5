"""A minimal experiment for CLI tests: it squares numbers, can pretend to diverge, and can fail."""

from dataclasses import dataclass, field
from typing import TypedDict

import matplotlib.pyplot as plt
import torch

from optiscope.experiments import ConfigError

SUMMARY = "test double"


@dataclass
class Config:
    steps: int = field(default=3, metadata={"help": "how many numbers"})
    rate: float = 0.5
    names: tuple[str, ...] = ("a", "b")
    diverge: bool = False
    crash: str = field(default="", metadata={"help": "raise this kind of error inside the run: user, internal, memory"})
    quiet: bool = field(default=False, metadata={"affects_results": False})

    def __post_init__(self):
        if self.steps <= 0:
            raise ConfigError(f"steps={self.steps} must be a positive integer")


QUICK = dict(steps=2)


class Results(TypedDict):
    squares: list[float]
    names: list[str]


def run(config, run_dir):
    if config.crash == "user":
        raise ConfigError("the data for this run is missing: give --steps 1 to 5")
    if config.crash == "internal":
        raise ValueError("an internal computation failed")
    if config.crash == "memory":  # torch's own failure: 2**50 floats (4 PiB) fit no machine's memory
        torch.empty(2**50)
    results = {"squares": [i * i * config.rate for i in range(config.steps)], "names": list(config.names)}
    if config.diverge:
        results.update(status="diverged", divergence={"step": 1})
    return results


def squares(results):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(results["squares"])
    if results["names"] == ["boom"]:
        raise RuntimeError("this figure cannot be drawn")
    return fig


FIGURES = {"squares.png": squares}
