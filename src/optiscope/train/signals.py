"""Ctrl-C and SIGTERM as requests to stop after the current step, so the checkpoint is a complete one.

Inside ``stop_requests()`` the first SIGINT or SIGTERM only sets a flag: the training loop finishes the
step it is in, writes a checkpoint of that complete state and raises ``Interrupted``. A signal that has
come before stops at once (``KeyboardInterrupt``: a second Ctrl-C); the last periodic checkpoint is intact,
because every checkpoint is written atomically. The first of each kind is the same request, not a second one:
a job scheduler that sends SIGTERM to every process of a job reaches a sweep's workers as well as the sweep,
which passes its stop on to them as SIGINT. Outside the main thread (where Python cannot install handlers)
the signals keep their default behaviour.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Interrupted(KeyboardInterrupt):
    """The run stopped on request after a complete step; its checkpoint resumes it exactly.

    ``train`` raises it after the first Ctrl-C (SIGINT) or SIGTERM, once the step in progress is complete and its
    checkpoint written. It is a ``KeyboardInterrupt``, so code that stops on Ctrl-C stops on it too; the command
    line exits 130, and ``--resume`` continues the run bit for bit.

    Args:
        label: the run's label (``Run.label``); kept as ``self.label``.
        step: the last step taken, the checkpoint's; kept as ``self.step``.

    Examples:
        >>> from optiscope.train import Interrupted
        >>> stop = Interrupted("adam@0.001", 120)
        >>> print(stop)
        adam@0.001: stopped after step 120; its checkpoint resumes it exactly (--resume)
        >>> isinstance(stop, KeyboardInterrupt), stop.step
        (True, 120)

    Notes:
        A signal of a kind that came before (a second Ctrl-C) stops at once with a plain ``KeyboardInterrupt``;
        the last periodic checkpoint is intact, because every checkpoint is written atomically. The first SIGINT
        and the first SIGTERM are one request, not two: a job scheduler that sends SIGTERM to every process of a
        job reaches a sweep's workers as well as the sweep, which passes its stop on to them as SIGINT. Outside
        the main thread (where Python cannot install handlers) the signals keep their default behaviour. It
        pickles as it was made, so a sweep's pool worker can send it back.
    """

    def __init__(self, label: str, step: int) -> None:
        self.label, self.step = label, step
        super().__init__(f"{label}: stopped after step {step}; its checkpoint resumes it exactly (--resume)")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as it was made: a sweep's pool worker sends it back
        return type(self), (self.label, self.step)


class StopRequest:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    @property
    def requested(self) -> bool:
        return bool(self.seen)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in self.seen:
            raise KeyboardInterrupt  # a signal that came before: stop now
        self.seen.add(signum)


@contextmanager
def stop_requests() -> Iterator[StopRequest]:
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """For the block, SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does (in the main thread; elsewhere nothing
    changes): a command stopped by ``kill`` or a job scheduler ends as an interrupted one (exit 130, saying what is
    saved) instead of vanishing mid-way. Within it, ``stop_requests`` still takes both signals for the training
    loop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
