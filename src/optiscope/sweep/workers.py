"""The processes of the local pool, and how a sweep that stops stops them.

A sweep stopped by Ctrl-C, SIGTERM or an error asks each of its workers once to stop its trial: it sets the
pool's ``stopping`` event, then sends each worker SIGINT, which the training loop takes as its request to stop
after a complete step, with that step's checkpoint (``train.signals``). The event keeps a worker from starting
another trial afterwards: the pool hands a worker the next queued trial as soon as its last one ended (Python's
``ProcessPoolExecutor`` queues one call more than it has workers, and a call already queued cannot be
cancelled), and a worker that took its trial just before the signal came had not yet installed the handler that
turns it into a stop. The sweep then waits for its workers, at most ``STOP_GRACE_SECONDS``; one still running
past that is killed, from its last periodic checkpoint.

Each worker is a process group of its own, so a terminal's Ctrl-C reaches the sweep alone, and asks each worker
once (a second request would stop it at once, without its last steps' checkpoint). It ignores SIGINT while it
runs no trial, and SIGTERM from outside (a scheduler signalling every process of a job), whose stop the sweep
passes on as SIGINT; a SIGTERM that comes during training is the same request as that SIGINT
(``train.signals``: only the same signal twice stops at once). A worker started with SIGINT blocked
(``quietly_submitted``) keeps it blocked until it is in its own group, so a Ctrl-C while the worker imports torch
does not reach it either. A worker whose sweep was killed outright (SIGKILL) notices that its parent is gone,
stops its trial the same way, starts no other and exits.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import suppress
from typing import Any

from .trial import Trial, run_trial

#: how often a worker looks whether its sweep is still there (seconds)
PARENT_POLL_SECONDS = 0.2
#: how long a stopping sweep waits for its workers to stop their trials before it kills them (seconds)
STOP_GRACE_SECONDS = 120.0

#: set in a worker while it runs a trial (or is about to)
_busy = threading.Event()
#: set in a worker once its sweep is gone
_orphaned = threading.Event()
#: the pool's event, set by a sweep that is stopping (``start_worker`` keeps it)
_stopping: Any = None


def quietly_submitted(pool: ProcessPoolExecutor, trial: Trial) -> Future:
    """``pool.submit(run_in_worker, trial)`` with SIGINT blocked in this thread meanwhile: a worker it starts
    inherits the blocked signal and keeps it until ``start_worker`` has moved it to a process group of its own.
    A Ctrl-C in that moment waits, and reaches this process once the worker has started."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(run_in_worker, trial)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def start_worker(parent: int, stopping: Any) -> None:
    """A worker's set-up (the pool's ``initializer``): a process group of its own, SIGINT and SIGTERM ignored
    while it runs no trial, and a watch on ``parent``, the sweep. ``stopping``: the pool's event."""
    global _stopping
    _stopping = stopping
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=stop_when_orphaned, args=(parent,), name="optiscope-parent-watch", daemon=True).start()


def run_in_worker(trial: Trial) -> dict[str, Any]:
    """``run_trial`` in a worker, where a SIGINT stops the trial as it stops ``optiscope run``; none starts once
    the sweep is stopping or gone (it raises ``KeyboardInterrupt`` instead, as an interrupted trial does)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _busy.set()
    try:  # checked after the handler is in place: a stop requested since is seen here or by the handler
        if _orphaned.is_set() or (_stopping is not None and _stopping.is_set()):
            raise KeyboardInterrupt
        return run_trial(trial)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _busy.clear()


def stop_when_orphaned(parent: int) -> None:
    """Once ``parent`` is gone (killed outright: a sweep that stops stops its workers itself), stop this worker's
    trial after a complete step, as a SIGINT does, and end the process: nobody is left to give it work or to
    read its record (the sweep's ``--resume`` runs the trial on from its checkpoint)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    _orphaned.set()  # before looking at _busy: a trial taken from now on does not start
    if _busy.is_set():
        os.kill(os.getpid(), signal.SIGINT)
        while _busy.is_set():
            time.sleep(PARENT_POLL_SECONDS)
    os._exit(0)


def stop_workers(pool: ProcessPoolExecutor, stopping: Any) -> None:
    """Set ``stopping`` (the pool's event), ask every worker of ``pool`` once to stop its trial (SIGINT), and
    wait until each has ended, killing any still running after ``STOP_GRACE_SECONDS``. A Ctrl-C while waiting
    asks them again, which stops them at once (their last periodic checkpoints are intact), and is raised."""
    stopping.set()
    # the pool's own table of its processes: Python 3.11 offers no public handle on them (3.14 adds
    # ProcessPoolExecutor.terminate_workers); a worker that has ended is not signalled (its pid may be reused)
    workers = [w for w in list((getattr(pool, "_processes", None) or {}).values()) if w.is_alive()]
    try:
        signal_each(workers, signal.SIGINT)
        # the workers end once their trials have and the pool has told them to (shutdown, without waiting here)
        pool.shutdown(wait=False, cancel_futures=True)
        left = wait_for_exit(workers, STOP_GRACE_SECONDS)
        signal_each(left, signal.SIGKILL)
    except KeyboardInterrupt:
        signal_each([w for w in workers if w.is_alive()], signal.SIGINT)
        raise
    pool.shutdown(wait=True)


def signal_each(workers: list[Any], signum: int) -> None:
    for worker in workers:
        with suppress(ProcessLookupError):
            os.kill(worker.pid, signum)


def wait_for_exit(workers: list[Any], seconds: float) -> list[Any]:
    """Wait up to ``seconds`` for ``workers`` (multiprocessing processes) to exit; returns those still running."""
    deadline = time.monotonic() + seconds
    running = list(workers)
    while running and (left := deadline - time.monotonic()) > 0:
        ended = multiprocessing.connection.wait([w.sentinel for w in running], timeout=left)
        running = [w for w in running if w.sentinel not in ended]
    return running
