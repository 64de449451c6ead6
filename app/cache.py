"""Response cache: a Redis implementation and an in-process LRU (the embedded default)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Protocol

import redis

log = logging.getLogger(__name__)


def cache_key(parts: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of everything that determines an answer."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return "attr:v1:" + hashlib.sha256(blob.encode()).hexdigest()


class Cache(Protocol):
    backend: str

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...

    def health(self) -> dict[str, Any]: ...


class MemoryCache:
    """Thread-safe LRU of serialized answers, bounded by entry count."""

    backend = "memory"

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def health(self) -> dict[str, Any]:
        return {"backend": self.backend, "ok": True, "entries": len(self._data)}


class CacheUnavailable(Exception):
    """The cache backend did not answer; the caller goes on uncached."""


class RedisCache:
    """Redis-backed cache with short timeouts so an outage never stalls a request."""

    backend = "redis"

    def __init__(self, url: str, ttl_s: int, timeout_s: float) -> None:
        self.ttl_s = ttl_s
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.last_error: str | None = None

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
        except redis.RedisError as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise CacheUnavailable(self.last_error) from exc
        self.last_error = None
        return result

    def get(self, key: str) -> str | None:
        value = self._call(self.client.get, key)
        return None if value is None else bytes(value).decode()

    def set(self, key: str, value: str) -> None:
        self._call(self.client.set, key, value, self.ttl_s)

    def health(self) -> dict[str, Any]:
        try:
            self._call(self.client.ping)
        except CacheUnavailable:
            return {"backend": self.backend, "ok": False, "error": self.last_error}
        return {"backend": self.backend, "ok": True}
