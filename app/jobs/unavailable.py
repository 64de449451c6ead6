"""When the job database or the job queue cannot be reached: typed 503 errors (routes answer
JSON with Retry-After, never 500) and the job database's health for readiness."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import InterfaceError, OperationalError

from app.errors import ApiError

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
# SQLITE_FULL ("database or disk is full") too: the write is retried once space is back
SQLITE_UNAVAILABLE = (
    "database is locked",
    "unable to open database",
    "disk I/O error",
    "database or disk is full",
)


class JobStoreUnavailable(ApiError):
    """The job database did not answer (down, restarting, unreachable): come back later."""

    status = 503
    code = "job_store_unavailable"

    def __init__(self, message: str = "the job database is unavailable; retry shortly") -> None:
        super().__init__(message, headers={"Retry-After": str(RETRY_AFTER_S)})


class QueueUnavailable(ApiError):
    """The job queue's broker did not take a chunk. The job is stored as queued and the
    sweeper queues it once the broker answers again (the same Idempotency-Key returns it)."""

    status = 503
    code = "job_queue_unavailable"

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"the job queue is unavailable; job {job_id} is stored and runs once it is back "
            "(retry with the same Idempotency-Key to get it)",
            detail={"id": job_id, "status": "queued"},
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def _unreachable(ctx: ExceptionContext) -> None:
    """Connection-level failures (refused, reset, server shutting down; SQLite: locked past
    its busy timeout) become JobStoreUnavailable; constraint and SQL errors keep their types."""
    connection_error = isinstance(ctx.sqlalchemy_exception, OperationalError | InterfaceError)
    if ctx.dialect.name == "sqlite":  # its OperationalError also means "no such column" etc.
        message = str(ctx.original_exception)
        connection_error = any(m in message for m in SQLITE_UNAVAILABLE)
    if ctx.is_disconnect or ctx.connection is None or connection_error:
        log.warning("job database unavailable: %s", ctx.original_exception)
        raise JobStoreUnavailable() from ctx.sqlalchemy_exception


def watch_engine(engine: Engine) -> None:
    """Raise JobStoreUnavailable for this engine's connection failures (also at connect)."""
    event.listen(engine, "handle_error", _unreachable)


def store_health(store: Any) -> dict[str, Any]:
    """{"ok": True} when the job database answers a query, else {"ok": False, "error": ...}
    (for readiness: "degraded", job routes answer 503 meanwhile)."""
    try:
        with store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except JobStoreUnavailable:
        return {"ok": False, "error": "job database unreachable: job routes answer 503"}
    return {"ok": True}
