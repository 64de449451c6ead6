"""Typed API errors and the one handler that renders {"error": ..., "code": ...}."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from explainers.games import ExplainerError
from models.base import ModelError

log = logging.getLogger(__name__)
DETAIL_BYTES = 200  # how much of a binary body a validation error echoes


class ErrorBody(BaseModel):
    """Every error response."""

    error: str
    code: str
    detail: Any | None = None


class ApiError(Exception):
    """An error with an HTTP status and a machine-readable code."""

    status = 400
    code = "bad_request"
    admin_detail: Any = None  # shown (as detail.remote) only to admin keys: a remote's answer

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.detail = detail
        self.headers = headers

    def with_status(self, status: int) -> ApiError:
        self.status = status
        return self


class InvalidInput(ApiError):
    code = "invalid_input"


class Unprocessable(ApiError):
    status = 422
    code = "validation_error"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class NotReady(ApiError):
    status = 503
    code = "not_ready"


class Overloaded(ApiError):
    """Too much heavy work is waiting: come back later (503 with Retry-After)."""

    status = 503
    code = "overloaded"


class KeyBusy(ApiError):
    """This key has its share of heavy work queued or running (429 with Retry-After); other
    keys go on (app/fair.py)."""

    status = 429
    code = "key_busy"


class GatewayTimeout(ApiError):
    status = 504
    code = "timeout"


class ShuttingDown(ApiError):
    """The server stopped this explanation because it is shutting down (SIGTERM): retry, on
    another instance behind a load balancer."""

    status = 503
    code = "shutting_down"


def from_library(exc: Exception) -> ApiError:
    """An error of the explainers or models package as an API error: each carries its own
    `status` and `code` (explainers/games/errors.py, models/base.py); a remote model's own
    answer goes to admin keys only. Anything else is re-raised (a bug: a 500)."""
    if not isinstance(exc, ExplainerError | ModelError):
        raise exc
    retry = getattr(exc, "retry_after_s", None)  # e.g. a model worker in its restart backoff
    headers = None if retry is None else {"Retry-After": str(max(1, math.ceil(retry)))}
    error = ApiError(exc.public_message(), code=exc.code, headers=headers)
    error.admin_detail = getattr(exc, "remote_detail", None)
    return error.with_status(exc.status)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in [
        (400, "Bad input"),
        (401, "Missing or invalid API key (when keys are configured)"),
        (403, "The API key lacks the route's scope"),
        (404, "Unknown model or explainer"),
        (409, "Conflict with the service's state (e.g. nothing trained yet)"),
        (413, "Payload too large"),
        (422, "Request does not match the schema"),
        (429, "Rate limit exceeded (Retry-After says when to retry)"),
        (503, "Not ready, overloaded or shutting down (Retry-After)"),
        (502, "A remote model's endpoint failed or answered something unusable"),
        (
            504,
            "timeout_ms (or the server's DEFAULT_TIMEOUT_MS) passed before an answer (no "
            "partial estimate possible)",
        ),
    ]
}


def _body(
    message: str,
    code: str,
    detail: Any = None,
    status: int = 400,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    content: dict[str, Any] = {"error": message, "code": code}
    if detail is not None:
        try:  # an error handler must never fail: bytes and odd objects become text
            content["detail"] = jsonable_encoder(detail, custom_encoder={bytes: _bytes_text})
        except Exception:  # the detail is a courtesy; the answer must go out
            log.warning("error detail not serialisable; dropped", exc_info=True)
    try:
        return JSONResponse(content, status_code=status, headers=headers)
    except UnicodeEncodeError:  # a lone surrogate echoed from the request: JSON's \ud800 escape
        response = JSONResponse(None, status_code=status)
        response.body = json.dumps(content, ensure_ascii=True, default=str).encode()
        response.init_headers(headers)  # Content-Length of the escaped body
        return response


def _bytes_text(value: bytes) -> str:
    """Bytes echoed in an error detail (a binary body): lossy text, bounded."""
    text = value[:DETAIL_BYTES].decode("utf-8", errors="replace")
    return text + ("..." if len(value) > DETAIL_BYTES else "")


def _validation_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic's errors without `ctx` (may hold exceptions) and with bounded `input` echoes."""
    out = []
    for error in errors:
        entry = {k: v for k, v in error.items() if k != "ctx"}
        value = entry.get("input")
        if isinstance(value, (bytes, bytearray)):
            entry["input"] = _bytes_text(bytes(value))
        out.append(entry)
    return out


def _allowed_methods(request: Request) -> list[str]:
    """Methods of all routes whose path matches the request's (Starlette lists one route's)."""
    scope = {**request.scope, "method": "GET"}
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _admin(request: Request) -> bool:
    """Whether the request's key has the admin scope (an open service: every caller has)."""
    key = (request.scope.get("state") or {}).get("api_key")
    if key is None:  # no key presented: open only when no keys are configured
        settings = getattr(request.app.state, "settings", None)
        return settings is not None and not settings.api_keys
    return bool(key.allows("admin"))


def install(app: FastAPI) -> None:
    """Register the exception handlers on `app`."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        detail = exc.detail
        if exc.admin_detail is not None and _admin(request):
            detail = {"remote": exc.admin_detail} if detail is None else detail
        return _body(exc.message, exc.code, detail, exc.status, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc.errors())
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _body(f"{where}: {first.get('msg', 'invalid')}", "validation_error", errors, 422)

    @app.exception_handler(ValidationError)
    async def pydantic_error(_: Request, exc: ValidationError) -> JSONResponse:
        errors = _validation_errors(exc.errors())
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "")
        return _body(message or "invalid", "validation_error", errors, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:  # RFC 9110: Allow lists every method of every route here
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return _body(
            str(exc.detail),
            codes.get(exc.status_code, "http_error"),
            None,
            exc.status_code,
            headers or None,
        )

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _body("internal server error", "internal_error", None, 500)
