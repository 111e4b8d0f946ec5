"""Where trials run: a local process pool, or Ray tasks on a cluster. Both run ``trial.run_trial`` on
each trial and yield the records as the trials finish; the sweep writes every file itself.

Local: ``workers`` processes started with ``spawn`` (a fresh interpreter: no state inherited from the
parent, torch's thread pool included). One worker runs the trials in this process, one after another (no
pool to start). Every trial runs on ``trial.TRIAL_THREADS`` torch threads in every backend, so that where
it ran never changes its result.

A sweep that stops (Ctrl-C, SIGTERM, an error) stops its workers before it ends: each gets one SIGINT, the
training loop's request to stop after a complete step with its checkpoint, and the sweep waits for them, so
that ``--resume`` finds no trial folder still in use. The workers sit in process groups of their own, so a
terminal's Ctrl-C reaches the sweep alone and each worker is asked once (a second request would stop it at once,
without its last steps' checkpoint). A worker whose sweep was killed outright (SIGKILL) notices that its parent
is gone, stops its trial the same way and exits.

Ray: each trial is a Ray task asking for one CPU, on the cluster at ``address`` (``ray.init(address)``)
or, without one, on a local Ray instance started here — so a user with many machines uses Ray's
scheduler, not ours.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from multiprocessing import get_context
from typing import Any

from ..errors import UserError
from .trial import Trial, crashed, run_trial

BACKENDS = ("local", "ray")


class Local:
    """Trials in this process (one worker) or on a pool of ``workers`` spawned processes, started once
    for the whole sweep (its workers import torch once, not once per round of trials).

    A pool worker that dies (killed by the kernel for its memory, or exiting) breaks the whole pool, and
    which trial it was running is unknown: the trials left unfinished (the round's queued ones too, which the
    broken pool fails alike) run again one at a time, each alone in a fresh worker, and one that still kills
    its worker is that trial's crash, as on Ray. Alone, a trial killed only for the memory that trials beside
    it took now finishes; the price is the rest of that round run serially (the next round has a pool again)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool = self.new_pool(workers) if workers > 1 else None

    @staticmethod
    def new_pool(workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers, mp_context=get_context("spawn"), initializer=start_worker, initargs=(os.getpid(),)
        )

    def run(self, trials: Sequence[Trial]) -> Iterator[dict[str, Any]]:
        if self.pool is None:
            for trial in trials:
                yield run_trial(trial)
            return
        unfinished = yield from self.in_pool(trials)
        if not unfinished:
            return
        self.pool.shutdown()
        self.pool = self.new_pool(self.workers)  # for the rounds to come
        for trial in unfinished:
            alone = self.new_pool(1)
            started = time.perf_counter()
            try:
                yield alone.submit(run_in_worker, trial).result()
            except BrokenProcessPool as e:
                yield crashed(trial, e, time.perf_counter() - started)
            except BaseException:
                stop_workers(alone)
                raise
            finally:
                alone.shutdown(cancel_futures=True)

    def in_pool(self, trials: Sequence[Trial]) -> Generator[dict[str, Any], None, list[Trial]]:
        """Yields the records of ``trials`` run on the pool; returns those a dead worker left unfinished."""
        futures = {self.pool.submit(run_in_worker, trial): i for i, trial in enumerate(trials)}
        unfinished = []
        try:
            for future in as_completed(futures):
                try:
                    record = future.result()
                except BrokenProcessPool:
                    unfinished.append(futures[future])
                    continue
                yield record
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [trials[i] for i in sorted(unfinished)]

    def stop(self) -> None:
        """Stop the trials running now (the sweep is stopping: interrupted, or an error)."""
        if self.pool is not None:
            stop_workers(self.pool)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


#: how often a pool worker looks whether its sweep is still there (seconds)
PARENT_POLL_SECONDS = 0.2
#: set in a pool worker while it runs a trial
_busy = threading.Event()


def start_worker(parent: int) -> None:
    """A pool worker's set-up: a process group of its own (a terminal's Ctrl-C goes to the sweep, which asks
    each worker once), SIGINT ignored while idle (an idle worker has nothing to stop; ``run_in_worker`` takes it
    while a trial runs), and a watch on ``parent``, the sweep."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=stop_when_orphaned, args=(parent,), name="optiscope-parent-watch", daemon=True).start()


def run_in_worker(trial: Trial) -> dict[str, Any]:
    """``run_trial`` in a pool worker, where a SIGINT stops the trial as it stops ``optiscope run``."""
    _busy.set()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
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
    if _busy.is_set():
        os.kill(os.getpid(), signal.SIGINT)
        while _busy.is_set():
            time.sleep(PARENT_POLL_SECONDS)
    os._exit(0)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Ask every worker of ``pool`` once to stop its trial (SIGINT: after a complete step, with its checkpoint)
    and wait until they have all ended. A second Ctrl-C while waiting asks them again, which stops them at once
    (their last periodic checkpoints are intact), and ends the wait."""
    # the pool's own table of its processes: Python 3.11 offers no public handle on them (3.14 adds
    # ProcessPoolExecutor.terminate_workers)
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for worker in workers:
        with suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGINT)
    try:
        pool.shutdown(wait=True, cancel_futures=True)
    except KeyboardInterrupt:
        for worker in workers:
            with suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGINT)
        raise


class Ray:
    """Each trial a Ray task asking for one CPU, on the cluster at ``address`` or on a local instance
    started here (with ``workers`` CPUs) when Ray is not running in this process yet."""

    def __init__(self, workers: int, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--backend ray needs Ray: pip install 'optiscope[ray]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        self.task = ray.remote(num_cpus=1)(run_trial)

    def run(self, trials: Sequence[Trial]) -> Iterator[dict[str, Any]]:
        submitted = time.perf_counter()  # a trial whose worker died is timed from here: its own start is unknown
        pending = {self.task.remote(trial): trial for trial in trials}
        # a worker that died (killed for its memory, its node lost) is its trial's crash, as a MemoryError
        # raised in it is; an exception that ``run_trial`` raised is optiscope's own and stops the sweep
        errors = self.ray.exceptions
        died = (errors.WorkerCrashedError, errors.OutOfMemoryError, errors.NodeDiedError, errors.LocalRayletDiedError)
        try:
            while pending:
                (ref,), _ = self.ray.wait(list(pending), num_returns=1)
                trial = pending.pop(ref)
                try:
                    record = self.ray.get(ref)
                except died as e:
                    record = crashed(trial, e, time.perf_counter() - submitted)
                yield record
        except BaseException:
            for ref in pending:
                self.ray.cancel(ref, force=True)
            raise

    def stop(self) -> None:
        """Nothing to do: ``run`` cancels its pending tasks when the sweep stops."""

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


@contextmanager
def open_backend(backend: str = "local", workers: int = 1, address: str | None = None) -> Iterator[Local | Ray]:
    """A backend whose ``run(trials)`` yields each trial's record as the trial finishes."""
    runner = Ray(workers, address) if backend == "ray" else Local(workers)
    try:
        yield runner
    except BaseException:
        runner.stop()
        raise
    finally:
        runner.close()
