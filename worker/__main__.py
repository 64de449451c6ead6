"""python -m worker [--concurrency N]: run job chunks from the Redis queue, and sweep (queue
again the chunks that no worker holds: app/jobs/sweeper.py)."""

from __future__ import annotations

import argparse
import logging
from functools import partial

from celery import Task

from app.cache import MemoryCache, RedisCache
from app.jobs.queue import TASK_NAME
from app.jobs.runner import JobContext, run_chunk
from app.jobs.store import JobStore
from app.jobs.sweeper import Sweeper
from app.metrics import Heartbeat, Metrics
from app.service import ExplainService
from app.settings import Settings
from models.registry import ModelRegistry
from models.store import ModelStore
from worker.celery_app import make_celery, redis_epoch


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    settings = Settings()
    if not settings.redis_url:
        raise SystemExit("REDIS_URL must be set for a worker")
    import torch

    torch.set_num_threads(settings.torch_threads)
    cache = (
        RedisCache(settings.redis_url, settings.cache_ttl_s, settings.cache_timeout_s)
        if settings.redis_url
        else MemoryCache(settings.cache_max_entries)
    )
    # Registered models and Salvage artifacts come from the database every API process shares.
    registry = ModelRegistry(
        settings.model_dir,
        store=ModelStore(settings.database_url, settings.user_model_dir),
        device=settings.device,
    )
    store = JobStore(settings.database_url)
    service = ExplainService(settings, registry, cache, Metrics())
    service.jobs = store
    ctx = JobContext(service, store)
    app = make_celery(settings.redis_url, settings.job_visibility_timeout_s)
    Heartbeat(settings.redis_url).start()  # /metrics: worker_heartbeat_timestamp_seconds

    @app.task(name=TASK_NAME, bind=True, max_retries=None)
    def chunk_task(
        self: Task, job_id: str, chunk: int, previous: str | None = None, retries: int = 0
    ) -> None:
        """One chunk; a chunk that could not write or whose attempt failed (attempts left)
        goes back to the queue after its backoff, not acknowledged as done."""
        retry = run_chunk(ctx, job_id, chunk, previous, retries)
        if retry is not None:
            raise self.retry(
                countdown=retry.delay_s,
                kwargs={"previous": retry.previous, "retries": retries + 1},
            )

    def enqueue(job_id: str, chunk: int) -> None:
        app.send_task(TASK_NAME, args=[job_id, chunk])

    lost_after_s = float(settings.job_visibility_timeout_s)
    epoch = partial(redis_epoch, settings.redis_url)
    Sweeper(ctx, enqueue, lost_after_s, settings.job_sweep_interval_s, epoch).start()

    app.worker_main(
        [
            "worker",
            "--pool=solo" if args.concurrency == 1 else "--pool=threads",
            f"--concurrency={args.concurrency}",
            f"--loglevel={args.log_level.upper()}",
        ]
    )


if __name__ == "__main__":
    main()
