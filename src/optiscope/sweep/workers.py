"""The local backend's process pool, and how a sweep that stops stops its workers.

A ``WorkerPool`` is a ``ProcessPoolExecutor`` of spawned processes set up by ``start_worker``, with an event,
``stopping``, that tells its workers to start no further trial. Stopping a pool (the sweep was interrupted or
failed, or one of the pool's workers died and broke it) sets that event, then asks each live worker once, by
SIGINT, to stop its trial: the training loop takes it as its request to stop after a complete step, with that
step's checkpoint (``train.signals``). The event is needed because the executor hands a worker the next queued
trial as soon as its last one ends (Python's executor queues one call more than it has workers, and a call once
queued cannot be cancelled), and because a worker that took its trial just before the signal came had not yet
installed the handler that turns the signal into a stop. Then the pool waits for its workers, at most
``STOP_GRACE_SECONDS``; one still running past that is killed, from its last periodic checkpoint. A second
Ctrl-C meanwhile asks the workers again, which stops them at once (``train.signals``), and a third kills them:
no worker is ever left for the interpreter's exit to wait on.

Each worker is a process group of its own, so that a terminal's Ctrl-C reaches the sweep alone and each worker
is asked once. While it starts (spawned, it imports torch for seconds before ``start_worker`` runs) it holds
SIGINT blocked, inherited from the sweep's thread that started it (``submit``), and it ignores SIGINT
whenever it runs no trial. A worker whose sweep was killed outright (SIGKILL) notices that its parent is gone,
stops its trial the same way, starts no other and exits.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any

from .trial import Trial, run_trial

#: how often a worker looks whether its sweep is still there (seconds)
PARENT_POLL_SECONDS = 0.2
#: how long a stopping pool waits for its workers to stop their trials before it kills them (seconds)
STOP_GRACE_SECONDS = 120.0
#: after a second Ctrl-C (the workers asked to stop at once), how long before they are killed (seconds)
AT_ONCE_GRACE_SECONDS = 10.0

#: set in a worker while it runs a trial (or is about to)
_busy = threading.Event()
#: set in a worker once its sweep is gone
_orphaned = threading.Event()
#: the worker's pool's ``stopping`` event (``start_worker`` keeps it)
_stopping: Any = None


class WorkerPool:
    """``workers`` spawned processes (``start_worker``) that run trials, and the event that stops them."""

    def __init__(self, workers: int, context: Any) -> None:
        self.stopping = context.Event()
        self.executor = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=start_worker, initargs=(os.getpid(), self.stopping)
        )

    def submit(self, trial: Trial) -> Future:
        """``run_in_worker(trial)`` on the pool. A worker started meanwhile inherits SIGINT blocked (see the
        module's docstring); a Ctrl-C or SIGTERM that comes meanwhile is acted on once the call is made, not
        raised inside the executor, where it could leave a worker half-started."""
        with signals_held():
            return self.executor.submit(run_in_worker, trial)

    def stop(self) -> None:
        """Set ``stopping``, ask every live worker once to stop its trial (SIGINT) and wait until each has
        ended, killing any still running after ``STOP_GRACE_SECONDS``. A Ctrl-C while waiting asks them again
        (stop at once), waits ``AT_ONCE_GRACE_SECONDS``, kills what is left and is raised; one more kills them
        now."""
        self.stopping.set()
        # the executor's own table of its processes: Python 3.11 offers no public handle on them (3.14 adds
        # ProcessPoolExecutor.terminate_workers); one that has ended is not signalled (``signal_each``)
        workers = list((getattr(self.executor, "_processes", None) or {}).values())
        try:
            signal_each(workers, signal.SIGINT)
            # they end once their trials have and the executor has told them to (shutdown, not waited for here)
            self.executor.shutdown(wait=False, cancel_futures=True)
            wait_for_exit(workers, STOP_GRACE_SECONDS)
        except KeyboardInterrupt:
            try:
                self.executor.shutdown(wait=False, cancel_futures=True)
                signal_each(workers, signal.SIGINT)
                wait_for_exit(workers, AT_ONCE_GRACE_SECONDS)
            finally:  # past the grace, or a third Ctrl-C
                signal_each(workers, signal.SIGKILL)
            raise
        signal_each(workers, signal.SIGKILL)  # those still running past the grace

    def close(self) -> None:
        """Shut the pool down once its trials have ended."""
        self.executor.shutdown(cancel_futures=True)


@contextmanager
def signals_held() -> Iterator[None]:
    """For the block, SIGINT blocked in this thread (a process started meanwhile inherits the mask) and, in the
    main thread, SIGINT and SIGTERM noted instead of acted on (torch's threads do not block them, and Python runs
    its handlers in the main thread whichever thread received the signal); after, each noted signal is raised
    again under the handler restored."""
    noted: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, lambda signum, frame: noted.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: one set outside Python
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)


def start_worker(parent: int, stopping: Any) -> None:
    """A worker's set-up (the executor's ``initializer``): a process group of its own, SIGINT ignored while it
    runs no trial and then unblocked, and a watch on ``parent``, the sweep. ``stopping``: its pool's event."""
    global _stopping
    _stopping = stopping
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=stop_when_orphaned, args=(parent,), name="optiscope-parent-watch", daemon=True).start()


def run_in_worker(trial: Trial) -> dict[str, Any]:
    """``run_trial`` in a worker, where a SIGINT stops the trial as it stops ``optiscope run``; none starts once
    its pool is stopping or its sweep is gone (it raises ``KeyboardInterrupt`` instead, as an interrupted trial
    does)."""
    _busy.set()  # while SIGINT is still ignored: nothing can interrupt it before the try
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # checked after the handler is in place: a stop requested since is seen here or by the handler
        if _orphaned.is_set() or (_stopping is not None and _stopping.is_set()):
            raise KeyboardInterrupt
        return run_trial(trial)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _busy.clear()


def stop_when_orphaned(parent: int) -> None:
    """Once ``parent`` is gone (killed outright: a sweep that stops stops its workers itself), stop this worker's
    trial after a complete step, as a SIGINT does, and end the process (after ``STOP_GRACE_SECONDS`` at most):
    nobody is left to give it work or to read its record (the sweep's ``--resume`` runs the trial on from its
    checkpoint)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    _orphaned.set()  # before looking at _busy: a trial taken from now on does not start
    if _busy.is_set():
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while _busy.is_set() and time.monotonic() < deadline:
            time.sleep(PARENT_POLL_SECONDS)
    os._exit(0)


def signal_each(workers: list[Any], signum: int) -> None:
    """Send ``signum`` to each of ``workers`` (multiprocessing processes) that has not ended."""
    for worker in workers:
        if worker.exitcode is None:
            with suppress(ProcessLookupError):
                os.kill(worker.pid, signum)


def wait_for_exit(workers: list[Any], seconds: float) -> None:
    """Wait up to ``seconds`` for ``workers`` (multiprocessing processes) to exit."""
    deadline = time.monotonic() + seconds
    running = list(workers)
    while running and (left := deadline - time.monotonic()) > 0:
        ended = multiprocessing.connection.wait([w.sentinel for w in running], timeout=left)
        running = [w for w in running if w.sentinel not in ended]
