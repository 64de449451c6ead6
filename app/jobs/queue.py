"""Where chunks run: Celery workers over Redis, or a thread pool in this process.

Either way a chunk that could not write (job database down) or whose attempt failed is run
again after a backoff (runner.Retry), and a sweeper (app/jobs/sweeper.py) queues the chunks
that no worker holds and no queue will deliver. A submission the broker refuses is a 503
(QueueUnavailable); the stored job is queued by the sweeper once the broker is back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Protocol

import kombu.exceptions
import redis

from app.jobs.runner import JobContext, Retry, run_chunk
from app.jobs.sweeper import Sweeper
from app.jobs.unavailable import JobStoreUnavailable, QueueUnavailable

log = logging.getLogger(__name__)
TASK_NAME = "attribution.run_chunk"
CLOSE_WAIT_S = 5.0  # how long close() waits for running chunks to give their leases up
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.RedisError, OSError)


class Queue(Protocol):
    backend: str

    def submit(self, job_id: str, chunk: int) -> None: ...

    def close(self) -> None: ...


class InProcessQueue:
    """The embedded default: the same job code on a bounded thread pool. Its sweeper starts
    with the first chunk it takes (a restart's resume or a submission)."""

    backend = "inprocess"

    def __init__(self, ctx: JobContext, workers: int) -> None:
        self.ctx = ctx
        # workers=0: jobs are accepted and stored but run only after a restart with workers.
        self.pool = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job") if workers else None
        )
        self.lock = threading.Lock()
        self.waiting: set[tuple[str, int]] = set()  # in the pool, not started: not twice
        self.running: set[Future[None]] = set()
        self.timers: set[threading.Timer] = set()
        self.closed = False
        settings = ctx.service.settings
        self.sweeper = Sweeper(ctx, self._enqueue, None, settings.job_sweep_interval_s)

    def submit(self, job_id: str, chunk: int) -> None:
        if self.pool is None:
            return
        self.sweeper.start()
        self._enqueue(job_id, chunk)

    def _enqueue(
        self, job_id: str, chunk: int, previous: str | None = None, retries: int = 0
    ) -> None:
        if self.pool is None:
            return
        with self.lock:
            if self.closed or (job_id, chunk) in self.waiting:
                return
            self.waiting.add((job_id, chunk))
            future = self.pool.submit(self._run, job_id, chunk, previous, retries)
            self.running.add(future)
        future.add_done_callback(self._done)

    def _run(self, job_id: str, chunk: int, previous: str | None, retries: int) -> None:
        with self.lock:
            self.waiting.discard((job_id, chunk))
        retry = run_chunk(self.ctx, job_id, chunk, previous, retries)
        if retry is not None:
            self._later(retry, job_id, chunk, retries + 1)

    def _later(self, retry: Retry, job_id: str, chunk: int, retries: int) -> None:
        """Run the chunk again after the retry's backoff."""

        def again() -> None:
            with self.lock:
                self.timers.discard(timer)
            self._enqueue(job_id, chunk, retry.previous, retries)

        timer = threading.Timer(retry.delay_s, again)
        timer.daemon = True
        with self.lock:
            if self.closed:
                return
            self.timers.add(timer)
        timer.start()

    def _done(self, future: Future[None]) -> None:
        with self.lock:
            self.running.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("job chunk crashed", exc_info=future.exception())

    def close(self) -> None:
        """Stop taking chunks; running ones stop at their next model call (the service is
        stopping) and give their leases up, so the next start runs them at once."""
        with self.lock:
            self.closed = True
            timers, running = list(self.timers), list(self.running)
        for timer in timers:
            timer.cancel()
        self.sweeper.stop()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            wait(running, timeout=CLOSE_WAIT_S)


class CeleryQueue:
    """Chunks become Celery tasks on Redis; `python -m worker` processes run them (and sweep).
    `ctx`: the API process's job context, so that a chunk the broker refused is marked
    unqueued and the next sweep queues it (without it, after JOB_VISIBILITY_TIMEOUT_S)."""

    backend = "celery"

    def __init__(
        self, broker_url: str, visibility_timeout_s: int, ctx: JobContext | None = None
    ) -> None:
        from worker.celery_app import make_celery

        self.app = make_celery(broker_url, visibility_timeout_s)
        self.ctx = ctx

    def submit(self, job_id: str, chunk: int) -> None:
        try:
            self.app.send_task(TASK_NAME, args=[job_id, chunk])
        except BROKER_ERRORS as exc:
            log.warning("job %s chunk %d not queued: broker unavailable: %s", job_id, chunk, exc)
            if self.ctx is not None:
                # if the database is down too, its wait runs out after the visibility timeout
                with contextlib.suppress(JobStoreUnavailable):
                    self.ctx.chunks.unqueued(job_id, chunk)
            raise QueueUnavailable(job_id) from None

    def close(self) -> None:
        self.app.close()
