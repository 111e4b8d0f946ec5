"""Where trials run: a local process pool, or Ray tasks on a cluster. Both run ``trial.run_trial`` on
each trial and yield the records as the trials finish; the sweep writes every file itself.

Local: ``workers`` processes started with ``spawn`` (a fresh interpreter: no state inherited from the
parent, torch's thread pool included). One worker runs the trials in this process, one after another (no
pool to start). Every trial runs on ``trial.TRIAL_THREADS`` torch threads in every backend, so that where
it ran never changes its result.

A sweep that stops (Ctrl-C, SIGTERM, an error) stops its workers before it ends, each after a complete step
with its checkpoint, so that ``--resume`` finds no trial folder still in use; a worker whose sweep was killed
outright stops by itself (``workers``).

Ray: each trial is a Ray task asking for one CPU, on the cluster at ``address`` (``ray.init(address)``)
or, without one, on a local Ray instance started here — so a user with many machines uses Ray's
scheduler, not ours.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any

from ..errors import UserError
from .trial import Trial, crashed, run_trial
from .workers import WorkerPool

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
        self.context = get_context("spawn")
        self.pool = WorkerPool(workers, self.context) if workers > 1 else None
        self.alone: WorkerPool | None = None  # the pool of one rerunning a trial that a broken pool left

    def run(self, trials: Sequence[Trial]) -> Iterator[dict[str, Any]]:
        if self.pool is None:
            for trial in trials:
                yield run_trial(trial)
            return
        unfinished = yield from self.in_pool(trials)
        if not unfinished:
            return
        self.pool.close()
        self.pool = WorkerPool(self.workers, self.context)  # for the rounds to come
        for trial in unfinished:
            self.alone = WorkerPool(1, self.context)
            started = time.perf_counter()
            try:
                yield self.alone.submit(trial).result()
            except BrokenProcessPool as e:
                yield crashed(trial, e, time.perf_counter() - started)
            except BaseException:  # stopped before close() would wait for the trial to finish
                self.alone.stop()
                raise
            finally:
                self.alone.close()
                self.alone = None

    def in_pool(self, trials: Sequence[Trial]) -> Generator[dict[str, Any], None, list[Trial]]:
        """Yields the records of ``trials`` run on the pool; returns those a dead worker left unfinished. Once
        one has died, the pool is stopped: the executor fails every call it had not finished, so the trials its
        other workers run are stopped after a step (each to run again from its checkpoint) rather than finished
        for nothing, and the trial it had queued does not start."""
        assert self.pool is not None
        futures = {self.pool.submit(trial): i for i, trial in enumerate(trials)}
        unfinished = []
        try:
            for future in as_completed(futures):
                try:
                    record = future.result()
                except BrokenProcessPool:
                    if not unfinished:
                        self.pool.stop()
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
        for pool in (self.pool, self.alone):
            if pool is not None:
                pool.stop()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


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
