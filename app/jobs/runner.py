"""The job code: one chunk of instances at a time, idempotent, the same in every queue. What a
chunk does depends on the job's kind (app/jobs/kinds.py)."""

from __future__ import annotations

import logging

from app.jobs.audit import top_k_bootstrap
from app.jobs.context import CancelWatch, JobContext
from app.jobs.kinds import kind
from app.jobs.store import FINISHED
from explainers.games import Cancelled
from explainers.games.deadlines import any_of, stop_when

log = logging.getLogger(__name__)
__all__ = ["CancelWatch", "JobContext", "run_chunk", "top_k_bootstrap"]


def run_chunk(ctx: JobContext, job_id: str, chunk: int) -> None:
    """Compute the missing results of one chunk; finish the job when all are stored."""
    job = ctx.store.get(job_id)
    if job is None or job.status in FINISHED:
        return
    ctx.store.mark_running(job_id)
    indices = job.chunk(chunk)
    stored = ctx.store.stored_indices(job_id, indices)  # one query, not one per instance
    todo = [i for i in indices if i not in stored]
    try:
        # A cancel reaches the explainers at their next model call (sampling: the next round);
        # so does the server's shutdown: the chunk stays unfinished and runs again at the next
        # start (in-process queue) or on another worker (its task is redelivered).
        with stop_when(any_of(CancelWatch(ctx, job_id), ctx.service.stopping.is_set)):
            kind(job.kind).run(ctx, job, todo)
    except Cancelled:
        why = "the server is shutting down" if ctx.service.stopping.is_set() else "cancelled"
        log.info("job %s chunk %d stopped: %s", job_id, chunk, why)
        return
    except Exception as exc:
        log.exception("job %s chunk %d failed", job_id, chunk)
        ctx.store.finish(job_id, "failed", error=f"{type(exc).__name__}: {exc}")
        return
    done = ctx.store.add_results(job_id, {})
    if done >= job.total:
        ctx.store.finish(job_id, "succeeded", summary=kind(job.kind).summarise(ctx.store, job))
