"""The client's errors: every failure it reports is an XaiError with a one-line message."""

from __future__ import annotations

from typing import Any


class XaiError(Exception):
    """Anything the client reports: the message is one line, fit for a terminal."""


class Unreachable(XaiError):
    """No answer from the server (refused, unknown host, timed out)."""


class JobTimeout(XaiError, TimeoutError):
    """A job did not finish within the time waited for it."""


class ServiceError(XaiError):
    """A 4xx/5xx answer: the service's message, machine code and HTTP status."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        message = body.get("error") if isinstance(body, dict) else str(body)[:200]
        if status == 401:
            message = f"{message} (set XAI_API_KEY or pass api_key / --api-key)"
        super().__init__(f"{status} {self.code}: {message}")


class JobFailed(XaiError):
    """An audit that ended `failed` (every row failed, or the job as a whole): the message is
    the server's `error`; `status` is the job's final status (GET /v2/jobs/{id}), with the
    summary's `errors` count and `first_errors` when the rows failed."""

    def __init__(self, message: str, status: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status

    @property
    def job_id(self) -> str | None:
        return self.status.get("id")


class JobCancelled(JobFailed):
    """An audit that ended `cancelled` (a JobFailed: `except JobFailed` catches both)."""


class NoExplanations(XaiError):
    """An audit's results hold no explanation to convert (every row failed): the message
    names the first row's error."""


class AuditRowsFailed(UserWarning):
    """Warned by `audit()` when a job ends `succeeded_with_errors`: some rows failed (the
    server's message); the result holds the others, and `AuditResult.errors` the failures."""
