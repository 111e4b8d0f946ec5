"""A minimal experiment for CLI tests: it squares numbers and can pretend to diverge."""

from dataclasses import dataclass, field

from optiscope.experiments import ConfigError

SUMMARY = "test double"


@dataclass
class Config:
    steps: int = field(default=3, metadata={"help": "how many numbers"})
    rate: float = 0.5
    names: tuple[str, ...] = ("a", "b")
    diverge: bool = False

    def __post_init__(self):
        if self.steps <= 0:
            raise ConfigError(f"steps={self.steps} must be a positive integer")


QUICK = dict(steps=2)


def run(config, run_dir):
    results = {"squares": [i * i * config.rate for i in range(config.steps)], "names": list(config.names)}
    if config.diverge:
        results.update(status="diverged", divergence={"step": 1})
    return results


def draw(results, fig_dir):
    path = fig_dir / "squares.txt"
    path.write_text(str(results["squares"]))
    return [path]
