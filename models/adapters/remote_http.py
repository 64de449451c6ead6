"""The network side of remote models: credentials taken out of URLs, the REMOTE_MODEL_HOSTS
policy checked at every connection, and a total deadline per request.

- `split_credentials("http://user:pass@host/...")` -> the URL without userinfo and an
  `Authorization: Basic` header; messages only ever name `display_url` (no userinfo, no query).
- `HostPolicy`: an empty list allows hosts whose every address is globally routable (loopback,
  link-local 169.254/16 and fe80::/10 with the cloud metadata address, private ranges, CGNAT,
  multicast and unspecified addresses are refused); a list allows only the hosts it names
  (`host`, `host:port`, `*.domain[:port]`, an IP network `10.0.0.0/8`), whatever they resolve
  to. The check runs in the connection itself, on the addresses then connected to (a name that
  resolves elsewhere after registration - DNS rebinding - is checked again).
- A request's deadline (`deadline(seconds)`) bounds every connect, write and read of the
  request, headers and body included: a remote trickling a byte at a time is cut off at the
  deadline, not after a per-read timeout that each byte renews.
"""

from __future__ import annotations

import base64
import fnmatch
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_local = threading.local()  # the running request's deadline (time.monotonic()), per thread


class HostRefused(httpcore.ConnectError):
    """A connection to an address REMOTE_MODEL_HOSTS does not allow (never attempted)."""


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without userinfo, {"Authorization": "Basic ..."} when it had some)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return clean, {"Authorization": f"Basic {token}"}


def display_url(url: str) -> str:
    """The URL as messages name it: scheme, host, port and path (no userinfo, no query)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _address(text: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback
    return ip


def refused_kind(ip: IPAddress) -> str | None:
    """Why an address is refused without a listing (None: globally routable)."""
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local (cloud metadata)"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True)
class _Entry:
    host: str  # lower-case name or IP text, may hold '*'; empty for a network
    port: int | None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None


def _parse_entry(raw: str) -> _Entry:
    text = raw.strip().lower()
    if "/" in text:
        return _Entry("", None, ipaddress.ip_network(text, strict=False))
    if text.startswith("["):  # [v6] or [v6]:port
        host, _, rest = text[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
        return _Entry(str(ipaddress.ip_address(host)), port)
    if text.count(":") > 1:  # a bare IPv6 address
        return _Entry(str(ipaddress.ip_address(text)), None)
    host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"REMOTE_MODEL_HOSTS entry {raw!r} has no host")
    ip = _address(host)
    return _Entry(str(ip) if ip is not None else host, int(port_text) if port_text else None)


class HostPolicy:
    """Which hosts remote models may reach: REMOTE_MODEL_HOSTS (comma-separated)."""

    def __init__(self, hosts: str | Iterable[str] = "") -> None:
        items = hosts.split(",") if isinstance(hosts, str) else list(hosts)
        try:
            self.entries = tuple(_parse_entry(h) for h in items if h.strip())
        except ValueError as exc:
            raise ValueError(f"REMOTE_MODEL_HOSTS: {exc}") from None

    def __repr__(self) -> str:
        return f"HostPolicy({len(self.entries)} entries)"

    def _listed(self, host: str, port: int, addresses: list[IPAddress]) -> bool:
        name = host.lower().strip("[]")
        ip = _address(name)
        canonical = str(ip) if ip is not None else name
        for e in self.entries:
            if e.port is not None and e.port != port:
                continue
            if e.network is not None:
                if addresses and all(a in e.network for a in addresses):
                    return True
            elif fnmatch.fnmatchcase(canonical, e.host):
                return True
        return False

    def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of host:port a connection may use; raises HostRefused with the
        reason (addresses named: only admins see it, at registration) when none."""
        try:
            infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from None
        found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        addresses = [a for a in (_address(f) for f in found) if a is not None]
        if self.entries:
            if self._listed(host, port, addresses):
                return found
            raise HostRefused(f"{host}:{port} is not listed in REMOTE_MODEL_HOSTS")
        bad = [(str(a), refused_kind(a)) for a in addresses if refused_kind(a)]
        if bad or not addresses:
            shown = ", ".join(f"{a} ({why})" for a, why in bad) or "no address"
            raise HostRefused(
                f"{host}:{port} resolves to {shown}: list it in REMOTE_MODEL_HOSTS to allow it"
            )
        return found

    def check_url(self, url: str) -> None:
        """Raise HostRefused (or ConnectError: unresolvable) unless `url`'s host is allowed."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.resolve(parts.hostname or "", port)


# --- the deadline -----------------------------------------------------------------------------


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every network operation of requests made in this block (this thread) ends by now +
    seconds; nested blocks keep the earlier deadline."""
    previous = getattr(_local, "deadline", None)
    mine = time.monotonic() + seconds
    _local.deadline = mine if previous is None else min(previous, mine)
    try:
        yield
    finally:
        _local.deadline = previous


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    end = getattr(_local, "deadline", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A socket stream whose reads and writes end by the running request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's sockets, connected only to addresses the policy allows, under the deadline."""

    def __init__(self, policy: HostPolicy | None) -> None:
        self._sync = httpcore.SyncBackend()
        self._policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        targets = [host] if self._policy is None else self._policy.resolve(host, port)
        last: Exception | None = None
        for target in targets:  # the checked addresses themselves: no second resolution
            try:
                stream = self._sync.connect_tcp(
                    target,
                    port,
                    _bounded(timeout, httpcore.ConnectTimeout),
                    local_address,
                    socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            return _Stream(stream)
        raise last or httpcore.ConnectError(f"no address for {host}")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("remote models connect over TCP only")

    def sleep(self, seconds: float) -> None:
        self._sync.sleep(seconds)


class PolicyTransport(httpx.HTTPTransport):
    """httpx's transport on the policy-checking, deadline-bounded backend."""

    def __init__(self, policy: HostPolicy | None) -> None:
        super().__init__(retries=0)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_Backend(policy),
        )


def make_client(policy: HostPolicy | None, timeout_s: float) -> httpx.Client:
    """A client for remote models: no proxies from the environment (they would resolve and
    connect past the policy), no redirects followed, the policy transport."""
    return httpx.Client(
        transport=PolicyTransport(policy),
        timeout=httpx.Timeout(timeout_s),
        trust_env=False,
        follow_redirects=False,
    )
