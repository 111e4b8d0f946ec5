"""Getting started's shell steps, as a newcomer runs them: in a fresh shell, in the order of the page, exactly as
written, after ``make demo`` (the session's demo run stands for it: ``tests/conftest.py``'s ``demo``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .pages import DOCS

PAGE = DOCS / "getting-started.md"
#: Lines of the page's bash blocks this test does not run: the session ran the demo already, and ``pip install`` is
#: the page's alternative to ``make demo`` for an environment of one's own.
NOT_RUN = ("make demo", "pip install")


def shell_steps(page: Path) -> str:
    """The page's bash and python blocks in their order, as one bash script: a bash block's lines as written (but
    ``NOT_RUN``); python blocks one after another (the tutorial's builds on the one before) in one session of the
    ``python`` the shell finds, as a reader pastes them into one."""
    text = page.read_text(encoding="utf-8")
    steps: list[str] = []
    for m in re.finditer(r"^```(bash|python)[^\n]*\n(.*?)^```", text, re.S | re.M):
        language, code = m.groups()
        if language == "bash":
            steps += [line for line in code.splitlines() if line.strip() and not line.startswith(NOT_RUN)]
        elif steps and steps[-1].startswith("python - "):  # the session of the block before goes on
            steps[-1] = steps[-1].removesuffix("PYTHON") + code + "PYTHON"
        else:
            steps.append(f"python - <<'PYTHON'\n{code}PYTHON")
    return "\n".join(steps)


def test_getting_started_runs_as_written_in_a_fresh_shell_after_make_demo(demo, tmp_path):
    """A shell that has not activated .venv (its PATH without the environment's bin, as a new terminal's) finds no
    ``optiscope``; the page's steps, activation first, then run as written and leave what the page says."""
    activate = Path(sys.prefix, "bin", "activate")
    if not activate.is_file():
        pytest.skip(f"the tests run in {sys.prefix}, not a virtual environment (make test's .venv) to activate")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(sys.prefix, target_is_directory=True)  # where make demo installed optiscope
    own_bin = Path(sys.prefix, "bin").resolve()
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != own_bin
    )
    env = {"PATH": path, "HOME": str(tmp_path), "LANG": "C.UTF-8", "COLUMNS": "100"}
    script = "set -euo pipefail\n! command -v optiscope\n" + shell_steps(PAGE)
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "source .venv/bin/activate" in script  # the page says how to activate, and this ran it
    assert (checkout / "runs" / "rare-tokens" / "results.json").is_file()
    assert (checkout / "runs" / "first-loop" / "metrics.jsonl").is_file()
    assert done.stdout.splitlines()[-1].endswith("runs/report.html")
    assert (checkout / "runs" / "report.html").read_text().startswith("<!DOCTYPE html>")
