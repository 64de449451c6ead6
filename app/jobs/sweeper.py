"""The sweeper: every JOB_SWEEP_INTERVAL_S it queues again the chunks of unfinished jobs that
no worker holds and that no queue will deliver (app/jobs/leases.py, `stale`), and finishes jobs
whose chunks are all done. It runs in every Celery worker (`python -m worker`) and in each API
process whose in-process queue took a chunk; several at once are safe: each re-queue is a
compare-and-set on the chunk's row, so one sweeper queues each chunk."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.jobs.context import JobContext
from app.jobs.runner import complete_job
from app.jobs.unavailable import JobStoreUnavailable

log = logging.getLogger(__name__)


class Sweeper:
    """`enqueue(job_id, chunk)` puts a chunk in the queue (raises if the broker is down);
    `lost_after_s`: how long a queued chunk may wait unclaimed before its message is taken
    for lost (Celery: JOB_VISIBILITY_TIMEOUT_S; None in process, where a queue's chunks are
    lost only with its process, whose restart queues them again)."""

    def __init__(
        self,
        ctx: JobContext,
        enqueue: Callable[[str, int], None],
        lost_after_s: float | None,
        interval_s: float,
        epoch: Callable[[], str | None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.epoch = epoch
        self.seen: str | None = None  # the broker's epoch at the last pass that read one
        self.lost_before: float | None = None  # when a restart was last seen (time.time())
        self.enqueue = enqueue
        self.lost_after_s = lost_after_s
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def sweep(self) -> int:
        """One pass; the number of chunks queued again."""
        if self.restarted():
            log.warning("sweeper: the broker restarted; chunks waiting in it are queued again")
            self.lost_before = time.time()
        stale, complete = self.ctx.chunks.stale(self.lost_after_s, self.lost_before)
        for job_id in complete:
            complete_job(self.ctx, job_id)
        queued = 0
        for chunk in stale:
            if not self.ctx.chunks.requeue(chunk):
                continue  # another sweeper queued it
            try:
                self.enqueue(chunk.job_id, chunk.idx)
            except Exception as exc:  # the broker is down: this chunk and the rest wait
                log.warning("sweeper: job %s chunk %d not queued: %s", chunk.job_id, chunk.idx, exc)
                self.ctx.chunks.unqueued(chunk.job_id, chunk.idx)
                break
            queued += 1
        if queued:
            log.info("sweeper: %d chunks queued again", queued)
        return queued

    def restarted(self) -> bool:
        """Whether the broker's epoch changed since the last pass that read one."""
        if self.epoch is None:
            return False
        try:
            now = self.epoch()
        except Exception:  # the broker is down: nothing to compare yet
            return False
        changed = now is not None and self.seen is not None and now != self.seen
        if now is not None:
            self.seen = now
        return changed

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sweep()
            except JobStoreUnavailable:
                pass  # the next pass, once the database answers
            except Exception:
                log.exception("sweeper pass failed")
            self.stopping.wait(self.interval_s)

    def start(self) -> None:
        """Sweep now and then every interval, in a daemon thread."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="job-sweeper", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=10)
