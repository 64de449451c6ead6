"""Structured JSON logs and request ids.

Every request gets an id: the caller's `X-Request-ID` when it is a sane token, else a new one.
The response echoes it in `X-Request-ID`, explain answers carry it as `id`, and every log line
written while the request runs has it as `request_id` (a context variable follows the request
into worker threads). One access line per request: method, route, status, duration, model,
explainer, and `key`: the name of the API key that made it (app/auth.py), "-" when it carried
no valid key or the service is open. Never the secret or its digest.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
HEADER = b"x-request-id"
SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")  # no spaces or quotes: safe in logs, headers
access_log = logging.getLogger("app.access")
INTERNAL_ERROR = b'{"error": "internal server error", "code": "internal_error"}'


def current_request_id() -> str | None:
    return REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


def json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{asctime}{levelname}{name}{message}{request_id}{process}",  # pid: several API processes
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"},
        datefmt="%Y-%m-%dT%H:%M:%S%z",
    )


def configure(level: str = "info", fmt: str = "json") -> None:
    """Root logging to stderr, JSON by default; uvicorn's loggers go through the same handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(json_formatter())
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s %(process)d [%(request_id)s] %(message)s"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # our access line has more


def key_name(scope: Scope) -> str:
    """The access line's `key`: the presented key's name (from API_KEYS), else "-"."""
    key = (scope.get("state") or {}).get("api_key")
    name = getattr(key, "name", None)
    return name if isinstance(name, str) else "-"


def _route(scope: Scope) -> str:
    """The route template (bounded label values), not the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    raw = str(scope.get("path", ""))
    return "/static" if raw.startswith("/static/") else "<unmatched>"


class RequestContext:
    """Request id in, request id out; an access log line and HTTP metrics per request."""

    def __init__(self, app: ASGIApp, metrics: Any = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = dict(scope["headers"]).get(HEADER, b"").decode("latin-1")
        request_id = presented if SANE_ID.match(presented) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        status = 500
        started = finished = False
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, started, finished
            if message["type"] == "http.response.start":
                status = int(message["status"])
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Answered here, with the request id, and not re-raised: Starlette's outer
            # ServerErrorMiddleware re-raises to the server, which closes the connection of an
            # answer already started. A half-sent answer can only end with the connection.
            logging.getLogger(__name__).exception("unhandled error")
            if not started:
                await send_with_id(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(INTERNAL_ERROR)).encode()),
                        ],
                    }
                )
                await send_with_id({"type": "http.response.body", "body": INTERNAL_ERROR})
            elif not finished:
                raise
        finally:
            elapsed = time.perf_counter() - start
            route = _route(scope)
            params = scope.get("path_params") or {}
            explainer = params.get("explainer")
            if explainer is None and "/explain/" in route:
                explainer = route.split("/explain/", 1)[1].split("/", 1)[0]
            if self.metrics is not None:
                self.metrics.http_requests.labels(scope["method"], route, str(status)).inc()
                self.metrics.http_duration.labels(scope["method"], route, str(status)).observe(
                    elapsed
                )
            access_log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                    "model": params.get("model"),
                    "explainer": explainer,
                    "client": (scope.get("client") or ("", 0))[0],
                    "key": key_name(scope),
                },
            )
            REQUEST_ID.reset(token)
