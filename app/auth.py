"""API keys with scopes: stored as SHA-256 digests, compared in constant time.

Configure API_KEYS as JSON: [{"name": "ops", "sha256": "<hex digest>", "scopes": ["admin"]}].
`python -m app.auth KEY` prints a key's digest. Scopes: explain (explain, infer, read),
jobs (also explain), admin (everything: register and remove models, train, metrics).
With no keys configured every route is open (local use), and the service logs so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SCOPES = ("explain", "jobs", "admin")
GRANTS = {"explain": {"explain"}, "jobs": {"explain", "jobs"}, "admin": set(SCOPES)}
PUBLIC = ("/v2/health/", "/docs", "/redoc", "/openapi.json")


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return any(scope in GRANTS[s] for s in self.scopes)


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
        if needed is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        presented = headers.get(b"x-api-key", b"").decode() or None
        bearer = headers.get(b"authorization", b"").decode()
        if bearer.lower().startswith("bearer "):
            presented = bearer[7:].strip()
        key = find_key(self.keys, presented)
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
            scope.setdefault("state", {})["api_key"] = key
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


if __name__ == "__main__":
    print(digest(sys.argv[1]).hex())
