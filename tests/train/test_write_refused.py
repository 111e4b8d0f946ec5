"""A training run whose files the machine will not let be written (a full disk, a file-size limit): bad input
naming the file (exit 2), not an internal error, and the run resumes once it can write again."""

import resource
import signal
import subprocess
import sys

from optiscope import runs
from support import write_tiny_corpus

TINY = [
    *("--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4"),
    *("--eval-every", "5", "--eval-batches", "2", "--log-every", "5", "--checkpoint-every", "5"),
    *("--sample-tokens", "8", "--prompts", "the", "--quiet", "--steps", "10", "--optimizers", "adamw"),
]


def limited():
    """In the child: files of at most 40 KiB, a write past that failing with EFBIG (as on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, resource.RLIM_INFINITY))


def test_a_run_that_cannot_write_its_files_is_bad_input_and_resumes(tmp_path):
    text, out = write_tiny_corpus(tmp_path / "tiny.txt"), tmp_path / "run"
    argv = [sys.executable, "-m", "optiscope", "run", "lm", "--out", str(out), "--text", str(text), *TINY]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot write {out}" in line and "(File too large)" in line and "bug" not in line
    assert not (out / runs.ERROR_LOG).exists()
    resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert runs.read_json(out / runs.RESULTS)["runs"]["adamw"]["step"] == 10
