"""API keys with scopes: stored as SHA-256 digests, compared in constant time.

Configure API_KEYS as JSON: [{"name": "ops", "sha256": "<hex digest>", "scopes": ["admin"]}].
`python -m app.auth KEY` prints a key's digest. Scopes: explain (explain, infer, read),
jobs (also explain), admin (everything: register and remove models, train, metrics).
With no keys configured every route is open (local use), and the service logs so.

The key that made a request is its tenant: jobs belong to it (app/jobs/routes.py), the access
log names it (app/logging.py) and, with CACHE_SCOPE=key, cached answers are its own. Its name
follows the request into worker threads as a context variable (`current_key_name`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SCOPES = ("explain", "jobs", "admin")
GRANTS = {"explain": {"explain"}, "jobs": {"explain", "jobs"}, "admin": set(SCOPES)}
PUBLIC = ("/v2/health/", "/docs", "/redoc", "/openapi.json")
KEY_NAME: ContextVar[str | None] = ContextVar("api_key_name", default=None)


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return any(scope in GRANTS[s] for s in self.scopes)


# The key of the running HTTP request (None when open, and in jobs, which act by KEY_NAME)
KEY: ContextVar[ApiKey | None] = ContextVar("api_key", default=None)


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(raw: str | None) -> list[ApiKey]:
    """Keys from the API_KEYS JSON; a malformed value is a start-up error, not an open door."""
    if not raw:
        return []
    entries = json.loads(raw)
    keys = []
    for entry in entries:
        scopes = frozenset(entry["scopes"])
        if not scopes or not scopes <= set(SCOPES):
            raise ValueError(f"API key {entry.get('name')!r}: scopes must be among {SCOPES}")
        keys.append(ApiKey(entry["name"], bytes.fromhex(entry["sha256"]), scopes))
    return keys


def current_key_name() -> str | None:
    """The name of the key the running request (or job) acts for; None when open."""
    return KEY_NAME.get()


@contextmanager
def acting_as(name: str | None) -> Iterator[None]:
    """Run as key `name` (a job's owner while its chunk runs: the cache scope follows it)."""
    token = KEY_NAME.set(name)
    try:
        yield
    finally:
        KEY_NAME.reset(token)


def is_admin(key: ApiKey | None) -> bool:
    """Whether a request sees every tenant's jobs: an admin key, or no keys configured."""
    return key is None or "admin" in key.scopes


def presented_key(scope: Scope) -> str | None:
    """The secret a request carries: `Authorization: Bearer ...` or `X-API-Key`."""
    headers = dict(scope["headers"])
    presented = headers.get(b"x-api-key", b"").decode("utf-8", "replace") or None
    bearer = headers.get(b"authorization", b"").decode("utf-8", "replace")
    if bearer.lower().startswith("bearer "):
        presented = bearer[7:].strip()
    return presented


def required_scope(method: str, path: str) -> str | None:
    """The scope a route needs; None for public routes."""
    if path.startswith(PUBLIC) or path == "/" or path.startswith("/static/"):
        return None  # the web page and its files hold no data; its API calls send a key
    if path.startswith("/v2/repository/") or path == "/metrics":
        return "admin"
    if path.startswith("/v2/jobs"):
        return "jobs"
    return "explain"


def find_key(keys: list[ApiKey], presented: str | None) -> ApiKey | None:
    """The key matching `presented`; every stored digest is compared, in constant time."""
    if not presented:
        return None
    wanted = digest(presented)
    found = None
    for key in keys:
        if hmac.compare_digest(wanted, key.digest):
            found = key
    return found


class ApiKeyAuth:
    """401 without a valid key, 403 without the route's scope; the key goes to scope['state']."""

    def __init__(self, app: ASGIApp, keys: list[ApiKey]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        needed = required_scope(scope["method"], scope["path"])
        key = find_key(self.keys, presented_key(scope))
        if key is not None:  # the access log names it, a refusal included
            scope.setdefault("state", {})["api_key"] = key
        if needed is None:
            # Public routes answer without a key; one that comes is valid or ignored (the
            # readiness route names models only to a key holder: app/readiness.py).
            await self._call(key, scope, receive, send)
            return
        if key is None:
            response = JSONResponse(
                {"error": "missing or invalid API key", "code": "unauthorized"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        elif not key.allows(needed):
            response = JSONResponse(
                {"error": f"this key lacks the {needed!r} scope", "code": "forbidden"},
                status_code=403,
            )
        else:
            await self._call(key, scope, receive, send)
            return
        await response(scope, receive, send)

    async def _call(self, key: ApiKey | None, scope: Scope, receive: Receive, send: Send) -> None:
        token = KEY_NAME.set(None if key is None else key.name)
        held = KEY.set(key)
        try:
            await self.app(scope, receive, send)
        finally:
            KEY.reset(held)
            KEY_NAME.reset(token)


def may_use(owner: str | None, shared: bool) -> bool:
    """Whether the running request's key may use a model registered by key `owner`: its owner,
    an admin, anyone when the model is shared or has no owner (registered open), or when the
    service runs open (no key) or a job runs (checked when it was submitted)."""
    key = KEY.get()
    return key is None or owner is None or shared or key.name == owner or is_admin(key)


if __name__ == "__main__":
    print(digest(sys.argv[1]).hex())
