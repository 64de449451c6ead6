"""What a job's code runs with: the service, the job store, and a cancel watch."""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.jobs.store import FINISHED, JobStore
from app.service import ExplainService

CANCEL_POLL_S = 0.2  # how stale a running chunk's view of its job's cancel flag may be


@dataclass
class JobContext:
    service: ExplainService
    store: JobStore


def cancelled(ctx: JobContext, job_id: str) -> bool:
    """Whether the job was cancelled, finished elsewhere or deleted."""
    job = ctx.store.get(job_id)
    return job is None or job.status in FINISHED


class CancelWatch:
    """Whether a job was cancelled (or finished elsewhere), asking the store at most every
    CANCEL_POLL_S seconds: explainers call it before every model call."""

    def __init__(self, ctx: JobContext, job_id: str) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.asked = -float("inf")
        self.cancelled = False

    def __call__(self, fresh: bool = False) -> bool:
        now = time.monotonic()
        if not self.cancelled and (fresh or now - self.asked >= CANCEL_POLL_S):
            self.asked = now
            self.cancelled = cancelled(self.ctx, self.job_id)
        return self.cancelled
