"""What a job's code runs with: the service, the job store, its chunk leases, a cancel watch,
and result writes that outlast a short job-database outage."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.jobs.leases import ChunkStore
from app.jobs.store import FINISHED, JobStore
from app.jobs.unavailable import JobStoreUnavailable
from app.service import ExplainService
from explainers.games import Cancelled

log = logging.getLogger(__name__)
CANCEL_POLL_S = 0.2  # how stale a running chunk's view of its job's cancel flag may be


@dataclass
class JobContext:
    service: ExplainService
    store: JobStore
    chunks: ChunkStore = field(init=False)

    def __post_init__(self) -> None:
        self.chunks = ChunkStore(self.store)


def cancelled(ctx: JobContext, job_id: str) -> bool:
    """Whether the job was cancelled, finished elsewhere or deleted (its status column alone)."""
    status = ctx.store.status(job_id)
    return status is None or status in FINISHED


class CancelWatch:
    """Whether a job was cancelled (or finished elsewhere), asking the store at most every
    CANCEL_POLL_S seconds: explainers call it before every model call. While the job database
    does not answer, the last answer stands (the chunk keeps computing)."""

    def __init__(self, ctx: JobContext, job_id: str) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.asked = -float("inf")
        self.cancelled = False

    def __call__(self, fresh: bool = False) -> bool:
        now = time.monotonic()
        if not self.cancelled and (fresh or now - self.asked >= CANCEL_POLL_S):
            self.asked = now
            with contextlib.suppress(JobStoreUnavailable):  # the last answer stands
                self.cancelled = cancelled(self.ctx, self.job_id)
        return self.cancelled


def backoff_s(attempt: int, cap_s: float = 10.0) -> float:
    """Seconds before retry `attempt` (0, 1, ...): 0.5, 1, 2, ... up to `cap_s`."""
    return float(min(cap_s, 0.5 * 2 ** min(attempt, 10)))


def store_results(ctx: JobContext, job_id: str, results: Mapping[int, dict[str, Any] | str]) -> int:
    """ctx.store.add_results, retried with backoff while the job database is unavailable, for
    up to JOB_STORE_RETRY_S (the computed results are kept meanwhile); then
    JobStoreUnavailable reaches the runner, which puts the chunk back in the queue."""
    give_up = time.monotonic() + ctx.service.settings.job_store_retry_s
    attempt = 0
    while True:
        try:
            return ctx.store.add_results(job_id, results)
        except JobStoreUnavailable:
            if time.monotonic() >= give_up:
                raise
            if ctx.service.stopping.is_set():
                raise Cancelled("the server is shutting down") from None
            delay = backoff_s(attempt, cap_s=5.0)
            log.warning(
                "job %s: results not stored yet (database down); again in %.1f s", job_id, delay
            )
            time.sleep(delay)
            attempt += 1
