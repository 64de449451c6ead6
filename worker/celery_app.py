"""The Celery application: Redis broker, late acknowledgement so a killed worker's chunk runs
again elsewhere (results are idempotent per instance, so a rerun never duplicates); the
chunk leases and the sweeper (app/jobs/leases.py, sweeper.py) catch what redelivery misses."""

from __future__ import annotations

from celery import Celery


def make_celery(broker_url: str, visibility_timeout_s: int) -> Celery:
    app = Celery("attribution", broker=broker_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # a broker that does not answer: the submission is a 503 within seconds
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s,
            "socket_connect_timeout": 5,
        },
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
    )
    return app


def redis_epoch(url: str) -> str | None:
    """The broker's identity: Redis's run_id, new at every restart (the sweeper's `epoch`)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        return str(client.info("server")["run_id"])
    finally:
        client.close()
