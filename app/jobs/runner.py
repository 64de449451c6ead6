"""The job code: one chunk of instances at a time, idempotent, the same in every queue. What a
chunk does depends on the job's kind (app/jobs/kinds.py).

A chunk is claimed before it runs and holds a lease while it runs (app/jobs/leases.py). What
the caller (a queue) does next is the return value: None (nothing: done, cancelled, failed
for good, or another worker holds it) or a Retry (run it again after `delay_s`): the job
database did not answer, or an attempt failed and attempts are left. A chunk is never
dropped because a write failed, and never retried past JOB_MAX_ATTEMPTS failed attempts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from app.auth import acting_as
from app.errors import ApiError
from app.jobs.audit import top_k_bootstrap
from app.jobs.context import CancelWatch, JobContext, backoff_s
from app.jobs.kinds import kind
from app.jobs.leases import failed_message
from app.jobs.store import FINISHED, Job
from app.jobs.unavailable import JobStoreUnavailable
from explainers.games import Cancelled
from explainers.games.deadlines import any_of, stop_when

log = logging.getLogger(__name__)
__all__ = ["CancelWatch", "JobContext", "Retry", "complete_job", "run_chunk", "top_k_bootstrap"]


@dataclass(frozen=True)
class Retry:
    """Run the chunk again after `delay_s`, passing `previous` to run_chunk: the token of an
    attempt that could not give the chunk up (the database was down), so that it is not
    counted as failed."""

    delay_s: float
    previous: str | None = None


class Lease:
    """Renews a claimed chunk's lease every third of JOB_LEASE_S while the block runs."""

    def __init__(self, ctx: JobContext, job_id: str, chunk: int, token: str) -> None:
        self.ctx, self.job_id, self.chunk, self.token = ctx, job_id, chunk, token
        self.lease_s = ctx.service.settings.job_lease_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._renew, name="job-lease", daemon=True)

    def _renew(self) -> None:
        while not self.stop.wait(self.lease_s / 3):
            try:
                if not self.ctx.chunks.renew(self.job_id, self.chunk, self.token, self.lease_s):
                    log.warning("job %s chunk %d: lease lost", self.job_id, self.chunk)
                    return  # another worker took it over; results are idempotent
            except JobStoreUnavailable:
                pass  # try again at the next renewal

    def __enter__(self) -> Lease:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        self.thread.join()


def run_chunk(
    ctx: JobContext, job_id: str, chunk: int, previous: str | None = None, retries: int = 0
) -> Retry | None:
    """Claim the chunk, compute its missing results, finish the job when all are stored.
    `retries`: how many times this chunk was handed back by a Retry (for the backoff)."""
    settings = ctx.service.settings
    token = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"  # names the process that holds it
    try:
        claim = ctx.chunks.claim(
            job_id, chunk, token, settings.job_lease_s, settings.job_max_attempts, previous
        )
    except JobStoreUnavailable:
        return Retry(backoff_s(retries), previous)
    if claim.state == "failed":
        log.error("job %s failed: %s", job_id, claim.error)
        return None
    if claim.state == "done":  # the job's finishing write may have failed: try it
        return complete_job(ctx, job_id, retries)
    if claim.state != "claimed" or claim.job is None:
        return None
    try:
        with Lease(ctx, job_id, chunk, token):
            complete = _run(ctx, claim.job, chunk)
    except Cancelled:
        why = "the server is shutting down" if ctx.service.stopping.is_set() else "cancelled"
        log.info("job %s chunk %d stopped: %s", job_id, chunk, why)
        with contextlib.suppress(JobStoreUnavailable):  # else its lease lapses: swept
            ctx.chunks.release(job_id, chunk, token)
        return None
    except JobStoreUnavailable:
        log.warning("job %s chunk %d: job database unavailable; queued again", job_id, chunk)
        return Retry(backoff_s(retries), token)
    except Exception as exc:
        return _failed(ctx, claim.job, chunk, token, exc, retries)
    try:
        if not complete:  # stopped early (a trainer told of a shutdown or cancel)
            ctx.chunks.release(job_id, chunk, token)
            return None
        ctx.chunks.complete(job_id, chunk)
    except JobStoreUnavailable:
        return Retry(backoff_s(retries), token)  # runs again: its results are all stored
    return complete_job(ctx, job_id, retries)


def _run(ctx: JobContext, job: Job, chunk: int) -> bool:
    """Run the chunk's missing instances; whether all its results are stored now."""
    indices = job.chunk(chunk)
    stored = ctx.store.stored_indices(job.id, indices)  # one query, not one per instance
    todo = [i for i in indices if i not in stored]
    # A cancel reaches the explainers at their next model call (sampling: the next round); so
    # does the server's shutdown: the chunk gives its lease up and runs again at the next
    # start (in-process queue) or on another worker (the sweeper queues it).
    watch = stop_when(any_of(CancelWatch(ctx, job.id), ctx.service.stopping.is_set))
    with watch, acting_as(job.owner):  # as its owner: CACHE_SCOPE=key scopes its cache use
        kind(job.kind).run(ctx, job, todo)
    return not todo or len(ctx.store.stored_indices(job.id, indices)) == len(indices)


def _failed(
    ctx: JobContext, job: Job, chunk: int, token: str, exc: Exception, retries: int
) -> Retry | None:
    """An attempt raised: the job fails at once for a client error (4xx: the same input
    fails again), after JOB_MAX_ATTEMPTS failed attempts for anything else (a crashed model
    worker, an out-of-memory); until then the chunk runs again after a backoff."""
    error = f"{type(exc).__name__}: {exc}"
    log.error("job %s chunk %d failed: %s", job.id, chunk, error, exc_info=exc)
    try:
        failures = ctx.chunks.fail(job.id, chunk, token, error)
        final = isinstance(exc, ApiError) and exc.status < 500
        if final or failures >= ctx.service.settings.job_max_attempts:
            message = error if final else failed_message(chunk, failures, error)
            ctx.store.finish(job.id, "failed", error=message)
            return None
    except JobStoreUnavailable:
        return Retry(backoff_s(retries), token)
    return Retry(backoff_s(failures))


def final_status(summary: dict[str, Any], total: int) -> tuple[str, str | None]:
    """A finished job's status and error from its summary's failed rows (`errors`, and
    `first_errors` to quote)."""
    errors = int(summary.get("errors") or 0)
    if not errors:
        return "succeeded", None
    first = (summary.get("first_errors") or [{}])[0]
    quoted = f"row {first.get('index')}: {first.get('error')} ({first.get('code')})"
    if errors >= total:
        return "failed", f"all {total} rows failed; first: {quoted}"
    return "succeeded_with_errors", f"{errors} of {total} rows failed; first: {quoted}"


def complete_job(ctx: JobContext, job_id: str, retries: int = 0) -> Retry | None:
    """Finish the job once every result is stored: succeeded, succeeded_with_errors (some
    rows failed) or failed (every row did), with its summary."""
    try:
        done = ctx.store.add_results(job_id, {})
        job = ctx.store.get(job_id)
        if job is not None and job.status not in FINISHED and done >= job.total:
            done = ctx.store.recount(job_id)  # the one full count, at the end
        if job is not None and job.status not in FINISHED and done >= job.total:
            summary = kind(job.kind).summarise(ctx.store, job)
            status, error = final_status(summary, job.total)
            ctx.store.finish(job_id, status, summary=summary, error=error)
    except JobStoreUnavailable:
        return Retry(backoff_s(retries))  # the claim finds the chunk done and tries again
    return None
