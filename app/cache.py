"""Response cache: a Redis implementation and an in-process LRU (the embedded default).

CACHE_SCOPE (app/settings.py): `shared`, one cache for every API key, so that a cache hit (meta
`cache: "hit"`, `X-Cache: HIT`, a fast answer) tells a key that some key asked the same
question of the same model version before; `key`, the requesting key's name is part of every
cache key (`scope_part`), so each key hits only on what it asked itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio

from app.auth import current_key_name

log = logging.getLogger(__name__)
ID_SLOT = b'"id": ""'  # where a stored answer's per-request id goes (json.dumps' separators)


def cache_key(parts: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of everything that determines an answer."""
    return key_of(json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str))


def key_of(canonical: str) -> str:
    """The key of a canonical JSON text (cache_key's)."""
    return "attr:v1:" + hashlib.sha256(canonical.encode()).hexdigest()


def scope_tag(scope: str) -> str:
    """Whose answers the running request may be served: the key's name with CACHE_SCOPE=key,
    "" when shared (or when the service is open: no keys, no tenants). A job acts as its owner
    (app/auth.py acting_as)."""
    return (current_key_name() or "") if scope == "key" else ""


def scope_part(scope: str) -> dict[str, str]:
    """The part of cache_key's input that scopes it (nothing when shared: keys as before)."""
    tag = scope_tag(scope)
    return {"api_key": tag} if tag else {}


def spliced(blob: bytes, request_id: str, cache: str, was: str = "miss") -> bytes | None:
    """An answer's JSON (ExplainResponse.to_json, id "" and meta.cache `was`) with this
    request's id and meta.cache `cache` spliced in, without decoding and re-encoding it; None
    when the blob is not in that layout.

    json.dumps escapes quotes inside strings, so the first `"id": ""` is the top-level id (third
    key, after two strings) and the first `"cache": "<was>"` after it is meta.cache (meta's
    first keys before it are scalars).
    """
    if not blob.startswith(b'{"model_name": '):
        return None
    slot = b'"cache": "' + was.encode() + b'"'  # hit, miss or bypass: nothing to escape
    at = blob.find(ID_SLOT)
    flag = blob.find(slot, at)
    if at < 0 or flag < 0:
        return None
    return b"".join(
        (
            blob[:at],
            b'"id": ',
            json.dumps(request_id).encode(),
            blob[at + len(ID_SLOT) : flag],
            b'"cache": "',
            cache.encode(),
            b'"',
            blob[flag + len(slot) :],
        )
    )


def hit_answer(blob: bytes, request_id: str) -> bytes | None:
    """A stored answer (stored on a miss) as this request's hit."""
    return spliced(blob, request_id, "hit")


class Cache(Protocol):
    backend: str

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...

    async def aget(self, key: str) -> bytes | None:
        """`get` for the event loop: never blocks it (raises CacheUnavailable)."""
        ...

    def get_many(self, keys: list[str]) -> list[str | None]:
        """One round trip for many keys (MGET)."""
        ...

    def set_many(self, items: dict[str, str]) -> None:
        """One round trip for many entries (SETs with the TTL in one MULTI/EXEC)."""
        ...

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

    async def aget(self, key: str) -> bytes | None:
        value = self.get(key)  # a dict look-up under a lock held only for dict operations
        return None if value is None else value.encode()

    def get_many(self, keys: list[str]) -> list[str | None]:
        return [self.get(k) for k in keys]

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def set_many(self, items: dict[str, str]) -> None:
        for key, value in items.items():
            self.set(key, value)

    def health(self) -> dict[str, Any]:
        return {"backend": self.backend, "ok": True, "entries": len(self._data)}


class LocalHits:
    """A small LRU of recent Redis hits in the process, each for `ttl_s` (so that an emptied
    Redis stops being answered for within that time); 0 entries: off."""

    max_bytes = 64 * 1024  # larger answers always come from Redis

    def __init__(self, entries: int, ttl_s: float) -> None:
        self.entries = entries
        self.ttl_s = ttl_s
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        if not self.entries:
            return None
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            if item[0] < time.monotonic():
                del self._data[key]
                return None
            self._data.move_to_end(key)
            return item[1]

    def put(self, key: str, value: bytes) -> None:
        if not self.entries or len(value) > self.max_bytes:
            return
        with self._lock:
            self._data[key] = (time.monotonic() + self.ttl_s, value)
            self._data.move_to_end(key)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)


class CacheUnavailable(Exception):
    """The cache backend did not answer; the caller goes on uncached."""


AsyncGet = Callable[[str], Awaitable[bytes | None]]


def async_getter(url: str, timeout_s: float) -> AsyncGet:
    """GET for the event loop: LeanGet for redis:// URLs, redis.asyncio for the rest (TLS,
    unix sockets)."""
    if urlsplit(url).scheme == "redis":
        return LeanGet(url, timeout_s).get
    client = redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )

    async def get(key: str) -> bytes | None:
        value = await client.get(key)
        return value.encode() if isinstance(value, str) else value

    return get


def resp(*args: bytes) -> bytes:
    """One command in the Redis protocol (RESP)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class LeanGet:
    """GET over persistent asyncio connections of one event loop, for the cache-hit path.

    redis.asyncio spends ~56 us of CPU per GET here (retries, observability hooks, pool
    bookkeeping), this ~21 us: a quarter of a hit's whole budget. One command, RESP2 replies
    (bulk string, nil, error); AUTH and SELECT from the URL when a connection opens; a
    connection that failed is dropped, and a pooled one found dead is replaced once.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        query = parse_qs(parts.query)
        self.db = int(query["db"][0] if "db" in query else parts.path.lstrip("/") or 0)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        setup = []
        if self.password is not None:
            user = [self.username.encode()] if self.username else []
            setup.append(resp(b"AUTH", *user, self.password.encode()))
        if self.db:
            setup.append(resp(b"SELECT", str(self.db).encode()))
        writer.write(b"".join(setup))
        for _ in setup:
            line = await reader.readline()
            if not line.startswith(b"+"):
                writer.close()
                raise CacheUnavailable(line.decode(errors="replace").strip() or "closed")
        return reader, writer

    async def get(self, key: str) -> bytes | None:
        async with asyncio.timeout(self.timeout_s):
            while True:
                pooled = bool(self._idle)
                reader, writer = self._idle.pop() if pooled else await self._open()
                try:
                    writer.write(resp(b"GET", key.encode()))
                    line = await reader.readline()
                    if line.startswith(b"$"):
                        size = int(line[1:])
                        value = None if size < 0 else (await reader.readexactly(size + 2))[:-2]
                        self._idle.append((reader, writer))
                        return value
                except OSError:
                    writer.close()
                    if pooled:
                        continue  # the server closed it while idle (a restart): a new one
                    raise
                except BaseException:  # cancelled or timed out mid-reply: unusable
                    writer.close()
                    raise
                writer.close()
                if pooled and not line:
                    continue  # closed while idle
                raise CacheUnavailable(line.decode(errors="replace").strip() or "closed")


class RedisCache:
    """Redis-backed cache with short timeouts so an outage never stalls a request."""

    backend = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: int,
        timeout_s: float,
        local_entries: int = 0,
        local_ttl_s: float = 60.0,
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        # Asyncio connections belong to one event loop: one getter per loop that asks.
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGet]
        self._async = weakref.WeakKeyDictionary()
        self.last_error: str | None = None
        # Answers Redis returned lately, kept in the process for `local_ttl_s` (see aget).
        self.local = LocalHits(local_entries, local_ttl_s)

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

    async def aget(self, key: str) -> bytes | None:
        """Redis's answer, or a copy of one it gave in the last `local_ttl_s`: a stored answer
        never changes (its key hashes everything that determines it), and a round trip costs
        ~70 us of CPU under load, a third of a hit's total. Only hits are kept locally."""
        value = self.local.get(key)
        if value is not None:
            return value
        loop = asyncio.get_running_loop()
        getter = self._async.get(loop)
        if getter is None:
            getter = self._async[loop] = async_getter(self.url, self.timeout_s)
        try:
            value = await getter(key)
        except (CacheUnavailable, TimeoutError, redis.RedisError, OSError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise CacheUnavailable(self.last_error) from exc
        self.last_error = None
        if value is not None:
            self.local.put(key, value)
        return value

    def get_many(self, keys: list[str]) -> list[str | None]:
        if not keys:
            return []
        values = self._call(self.client.mget, keys)
        return [None if v is None else bytes(v).decode() for v in values]

    def set(self, key: str, value: str) -> None:
        self._call(self.client.set, key, value, self.ttl_s)

    def set_many(self, items: dict[str, str]) -> None:
        if not items:
            return

        def write() -> None:
            # One round trip, all or nothing; INFO commandstats counts it as one EXEC.
            pipe = self.client.pipeline(transaction=True)
            for key, value in items.items():
                pipe.set(key, value, ex=self.ttl_s)
            pipe.execute()

        self._call(write)

    def health(self) -> dict[str, Any]:
        try:
            self._call(self.client.ping)
        except CacheUnavailable:
            return {"backend": self.backend, "ok": False, "error": self.last_error}
        return {"backend": self.backend, "ok": True}
