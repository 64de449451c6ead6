"""Where chunks run: Celery workers over Redis, or a thread pool in this process."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from app.jobs.runner import JobContext, run_chunk

log = logging.getLogger(__name__)
TASK_NAME = "attribution.run_chunk"


class Queue(Protocol):
    backend: str

    def submit(self, job_id: str, chunk: int) -> None: ...

    def close(self) -> None: ...


class InProcessQueue:
    """The embedded default: the same job code on a bounded thread pool."""

    backend = "inprocess"

    def __init__(self, ctx: JobContext, workers: int) -> None:
        self.ctx = ctx
        # workers=0: jobs are accepted and stored but run only after a restart with workers.
        self.pool = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job") if workers else None
        )

    def submit(self, job_id: str, chunk: int) -> None:
        if self.pool is None:
            return
        future = self.pool.submit(run_chunk, self.ctx, job_id, chunk)
        future.add_done_callback(_log_failure)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def _log_failure(future: Any) -> None:
    if future.exception() is not None:
        log.error("job chunk crashed", exc_info=future.exception())


class CeleryQueue:
    """Chunks become Celery tasks on Redis; `python -m worker` processes run them."""

    backend = "celery"

    def __init__(self, broker_url: str, visibility_timeout_s: int) -> None:
        from worker.celery_app import make_celery

        self.app = make_celery(broker_url, visibility_timeout_s)

    def submit(self, job_id: str, chunk: int) -> None:
        self.app.send_task(TASK_NAME, args=[job_id, chunk])

    def close(self) -> None:
        self.app.close()
