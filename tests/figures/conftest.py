"""Real results.json files of every experiment, from tiny runs made once per test run (shared by the workers)."""

import shutil
from pathlib import Path

import pytest
import torch

from optiscope import cli, runs
from support import made_once, write_tiny_corpus

LM = [
    *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4"),
    *("--eval-every", "10", "--eval-batches", "2", "--log-every", "5", "--checkpoint-every", "20"),
    *("--sample-tokens", "8", "--prompts", "the|a cat", "--warmup-steps", "2", "--quiet", "--steps", "20"),
]
PROBE = [
    *("--E", "16", "--runs", "2", "--seq-len", "12", "--n-etas", "4", "--subset-size", "8", "--subsets", "20"),
    *("--warm-steps", "2", "--quiet", "--optimizers", "sgd,adamw"),
]
COMMANDS = {
    "rare-tokens": ["--steps", "300", "--sweep-lrs", "0.01,1,5", "--optimizers", "sgd,adam,adamw,lion,muon"],
    "landscapes": [
        *("--steps", "150", "--lrs", "0.01,0.1,2", "--optimizers", "sgd,adam,lion,momentum@0.05"),
        *("--bias-steps", "40", "--decay-steps", "60", "--weights-per-group", "10"),
    ],
    "lm": [*LM, "--optimizers", "sgd,adamw,muon+adamw,sgd@1e30"],
    "adder": [
        *("--params-budget", "300", "--steps", "12", "--eval-every", "6", "--log-every", "3"),
        *("--warmup-steps", "2", "--seeds", "1,2", "--quiet"),
    ],
    "edge-of-stability": [
        *("--optimizers", "sgd@0.5,momentum@0.35,adam@0.01", "--steps", "30", "--measure-every", "5"),
        *("--examples", "32", "--width", "16", "--quiet"),
    ],
    "mlp": [
        *("--optimizers", "momentum,adamw,sgd@1e30", "--steps", "20", "--examples", "64", "--val-examples", "32"),
        *("--width", "16", "--eval-every", "10", "--log-every", "5", "--quiet"),
    ],
}
#: the tiny runs' experiments, in the order they are made (entropy probes lm's checkpoint)
NAMES = [*COMMANDS, "entropy"]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus") / "tiny.txt")


#: The tiny runs, made once per session: tests/report's conftest reuses these fixtures.
_MADE: dict[str, dict] = {}


@pytest.fixture(scope="session")
def tiny_runs_made(tmp_path_factory, corpus) -> Path:
    """The folder of the tiny runs, one per experiment (figures drawn), made once per test run: under pytest-xdist
    by the first worker that needs them. Read it only: ``tiny_runs`` are copies a test may redraw."""
    return made_once(tmp_path_factory, "tiny-runs-of-this-run", lambda base: _make_tiny_runs(base, corpus))


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, tiny_runs_made):
    """experiment name -> the run directory of a tiny run of it (figures drawn): this worker's copy."""
    if "dirs" in _MADE:
        return _MADE["dirs"]
    base = tmp_path_factory.mktemp("tiny-runs")
    _MADE["dirs"] = dirs = {name: Path(shutil.copytree(tiny_runs_made / name, base / name)) for name in NAMES}
    return dirs


def _make_tiny_runs(base: Path, corpus: Path) -> None:
    threads = torch.get_num_threads()
    try:
        for name, options in COMMANDS.items():
            extra = ["--text", str(corpus)] if name == "lm" else []
            assert cli.main(["run", name, "--out", str(base / name), *options, *extra]) in (0, cli.EXIT_DIVERGED)
        probe = ["--checkpoint", str(base / "lm"), "--checkpoint-run", "adamw", *PROBE]
        assert cli.main(["run", "entropy", "--out", str(base / "entropy"), *probe]) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_results(tiny_runs):
    """experiment name -> its results.json, as read back from disk."""
    return {name: runs.read_json(path / runs.RESULTS) for name, path in tiny_runs.items()}
