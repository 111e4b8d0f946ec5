"""The console while training: one progress bar per run, then one line saying how it ended."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

#: seconds between two progress lines when the console is not a terminal (a file, a pipe, a CI log)
EVERY = 20.0


def progress_line(label: str, step: int, total: int, loss: float, elapsed: float) -> str:
    """One line of a run's progress, for a console that cannot redraw a bar.

    Args:
        label: the run's name (``adam@0.05``).
        step: steps done.
        total: steps the run will take.
        loss: the last step's training loss (nan and inf are written as such).
        elapsed: seconds since the run started, or resumed.

    Returns:
        ``"label: step 40/300, loss 2.913, 12 s"``.

    Example:
        >>> progress_line("adam", 40, 300, 2.9131, 12.4)
        'adam: step 40/300, loss 2.913, 12 s'
    """
    shown = f"{loss:.3f}" if math.isfinite(loss) else str(loss)
    return f"{label}: step {step}/{total}, loss {shown}, {elapsed:.0f} s"


class Progress:
    """A progress bar per run (``start`` … ``update`` … ``finish``), drawn only when ``enabled``.

    The bar disappears when the run ends and leaves the run's summary line; notes (a divergence) are
    printed as they happen. Disabled, it prints nothing at all (``--quiet``, other ranks, library use).
    On a console that is not a terminal (a file, a pipe, a CI log), where a bar cannot be redrawn and
    rich would print nothing until the end, it prints a ``progress_line`` every ``every`` seconds instead.

    Args:
        console: where to print; a new one on stdout when None.
        enabled: False prints nothing.
        every: seconds between two progress lines on a console that is not a terminal.
        clock: seconds from an arbitrary origin (``time.monotonic``).
    """

    def __init__(
        self,
        console: Console | None = None,
        enabled: bool = True,
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console or Console(soft_wrap=True)
        self.enabled = enabled
        self.every = every
        self.clock = clock
        self._bar: RichProgress | None = None
        self._task = None
        # not a terminal: the run's label and steps, when it started and when its last line was said (None: idle)
        self._run: tuple[str, int, float] = ("", 0, 0.0)
        self._said: float | None = None

    def start(self, label: str, total: int, completed: int) -> None:
        if not self.enabled:
            return
        if not self.console.is_terminal:
            self._said = self.clock()
            self._run = (label, total, self._said)
            return
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(escape(label), total=total, completed=completed, loss="…")

    def update(self, step: int, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step, loss=f"{loss:.3f}" if math.isfinite(loss) else str(loss))
        elif self._said is not None and self.clock() - self._said >= self.every:
            self._said = self.clock()
            label, total, started = self._run
            self.console.print(escape(progress_line(label, step, total, loss, self._said - started)), highlight=False)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(escape(text), style="bold red", highlight=False)

    def stop(self) -> None:
        self._said = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, line: str) -> None:
        self.stop()
        if self.enabled:
            self.console.print(escape(line), highlight=False)
