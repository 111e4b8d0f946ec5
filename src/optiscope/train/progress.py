"""The console while training: one progress bar per run, then one line saying how it ended."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    """A progress bar per run (``start`` … ``update`` … ``finish``), drawn only when ``enabled``.

    The bar disappears when the run ends and leaves the run's summary line; notes (a divergence) are
    printed as they happen. Disabled, it prints nothing at all (``--quiet``, other ranks, library use).
    """

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console(soft_wrap=True)
        self.enabled = enabled
        self._bar: RichProgress | None = None
        self._task = None

    def start(self, label: str, total: int, completed: int) -> None:
        if not self.enabled:
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

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(escape(text), style="bold red", highlight=False)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, line: str) -> None:
        self.stop()
        if self.enabled:
            self.console.print(escape(line), highlight=False)
