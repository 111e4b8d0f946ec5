"""The training console: a bar on a terminal; elsewhere (a file, a pipe, a CI log) a line every so often,
so that a long run is never silent for minutes."""

import io

from rich.console import Console

from optiscope.train.progress import Progress


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_not_a_terminal_prints_a_line_every_interval():
    out, clock = io.StringIO(), Clock()
    progress = Progress(Console(file=out, soft_wrap=True), every=20.0, clock=clock)
    progress.start("adam@0.05", 300, 0)
    for step in range(1, 301):
        clock.now += 0.5  # 150 s in all: a line at 20, 40, … 140 s
        progress.update(step, 3.0 - step / 100)
    progress.finish("adam@0.05: finished")
    lines = out.getvalue().splitlines()
    assert len(lines) == 7 + 1, lines
    assert lines[0] == "adam@0.05: step 40/300, loss 2.600, 20 s"
    assert lines[-2] == "adam@0.05: step 280/300, loss 0.200, 140 s"
    assert lines[-1] == "adam@0.05: finished"


def test_a_diverged_loss_is_said_as_such():
    out, clock = io.StringIO(), Clock()
    progress = Progress(Console(file=out, soft_wrap=True), every=1.0, clock=clock)
    progress.start("sgd", 10, 4)  # resumed at step 4
    clock.now += 1.0
    progress.update(5, float("nan"))
    assert out.getvalue() == "sgd: step 5/10, loss nan, 1 s\n"


def test_disabled_or_on_a_terminal_prints_no_lines():
    for console, enabled in (
        (Console(file=io.StringIO()), False),
        (Console(file=io.StringIO(), force_terminal=True), True),
    ):
        clock = Clock()
        progress = Progress(console, enabled=enabled, every=1.0, clock=clock)
        progress.start("sgd", 10, 0)
        for step in range(1, 11):
            clock.now += 5.0
            progress.update(step, 1.0)
        progress.stop()
        assert "step 5/10, loss" not in console.file.getvalue()
