"""Per-key rate limits (the `limits` library: moving window, in memory or in Redis).

The limit applies per API key, or per client address when the service runs open. With Redis
configured the counters are shared by every API process; when Redis does not answer, requests
are let through (the cache and readiness already report the outage) rather than refused.
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)
EXEMPT = ("/v2/health/", "/metrics")


def parse_limits(spec: str | None) -> list[RateLimitItem]:
    """`"100/second; 2000/minute"` -> limits; empty or None -> no limit."""
    if not spec or not spec.strip():
        return []
    return list(parse_many(spec))


def make_storage(redis_url: str | None) -> Storage:
    if redis_url:
        storage = storage_from_string(redis_url, socket_timeout=0.2, socket_connect_timeout=0.2)
        assert isinstance(storage, Storage)  # a redis:// URL gives the synchronous storage
        return storage
    return MemoryStorage()


def scope_identity(scope: Scope) -> str:
    """Who a request is for limits and fair shares: `key:<name>` with API keys, else
    `addr:<client address>`."""
    key = scope.get("state", {}).get("api_key")
    if key is not None:
        return f"key:{key.name}"
    client = scope.get("client")
    return f"addr:{client[0] if client else 'unknown'}"


class RateLimit:
    """429 with Retry-After once a key (or client address) exceeds any of its limits."""

    def __init__(self, app: ASGIApp, items: list[RateLimitItem], storage: Storage) -> None:
        self.app = app
        self.items = items
        self.limiter = MovingWindowRateLimiter(storage)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.items or scope["path"].startswith(EXEMPT):
            await self.app(scope, receive, send)
            return
        who = scope_identity(scope)
        for item in self.items:
            try:
                if self.limiter.hit(item, "attr", who):
                    continue
                # Only refusals need the window (one more storage round trip).
                reset = self.limiter.get_window_stats(item, "attr", who).reset_time
            except Exception as exc:  # shared storage down: fail open, say so in the log
                log.warning("rate-limit storage unavailable, not limiting: %s", exc)
                break
            retry = max(1, math.ceil(reset - time.time()))
            response = JSONResponse(
                {
                    "error": f"rate limit of {item} exceeded; retry in {retry} s",
                    "code": "rate_limited",
                },
                status_code=429,
                headers={"Retry-After": str(retry)},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
