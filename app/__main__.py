"""python -m app --host 127.0.0.1 --port 8000: run the service (settings from the environment).

WEB_CONCURRENCY API processes (uvicorn workers) share one listening socket. Unset, it is the
number of cores when REDIS_URL is set (the cache, jobs, registered models and rate limits are
then shared through Redis and the database) and 1 in embedded mode, where the cache, the job
queue and the rate-limit counters live in the process: more processes are refused there.
With several processes, each computes on max(1, cores // processes) explanation threads
unless EXPLAIN_WORKERS says otherwise (TORCH_THREADS stays 1): processes x threads <= cores;
Prometheus metrics are summed over the processes (prometheus_client's multiprocess mode, in a
fresh PROMETHEUS_MULTIPROC_DIR unless one is given).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import math
import os
import socket
import tempfile
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from app.logging import configure as configure_logging
from app.readiness import PROCESSES_ENV, READY_DIR_ENV

SHUTDOWN_BACKSTOP_S = 2.0  # past SHUTDOWN_GRACE_S: uvicorn cancels requests still running
LOG_ENV = ("ATTRIBUTION_LOG_LEVEL", "ATTRIBUTION_LOG_FORMAT")  # handed to worker processes
SUPERVISOR_ENV = "ATTRIBUTION_SUPERVISOR"  # the pid that started the workers


def processes(environ: dict[str, str] | os._Environ[str], cores: int) -> int:
    """How many API processes to run; raises SystemExit for an unsafe request."""
    raw = environ.get("WEB_CONCURRENCY", "").strip()
    shared = bool(environ.get("REDIS_URL"))
    if not raw:
        return cores if shared else 1
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"WEB_CONCURRENCY must be a positive integer, not {raw!r}")
    if int(raw) > 1 and not shared:
        raise SystemExit(
            f"WEB_CONCURRENCY={raw} needs REDIS_URL: in embedded mode the cache, the job queue "
            "and the rate limits live in one process"
        )
    return int(raw)


class NoDelayHTTP(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol with TCP_NODELAY on every connection, a header deadline and a cap
    on connections per client address (issue 39).

    TCP_NODELAY: a worker gets the shared listening socket back from its parent with proto 0,
    so asyncio does not set it on accepted connections itself; without it an answer's second
    write waits for the delayed ACK: 44 ms per request (measured: 22 requests/s on one
    connection).

    Slow clients: uvicorn has no header timeout (a connection that sends half a request line
    stays open), so a connection whose request headers are not complete HEADER_TIMEOUT_S after
    it opened, or after its last answer while it sends the next request, is closed; a client
    address with MAX_CONNECTIONS_PER_CLIENT open connections (per API process) has further
    ones closed at once. Behind a proxy every connection comes from the proxy's address: raise
    the cap there (the compose nginx has its own limits)."""

    _open: ClassVar[dict[str, int]] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        timeout, cap = connection_limits()
        if cap and self._open.get(self._peer, 0) >= cap:
            self._peer = ""  # not counted
            transport.close()
            return
        if self._peer:
            self._open[self._peer] = self._open.get(self._peer, 0) + 1
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._watch(None, timeout)

    def _watch(self, cycle: object, timeout: float) -> None:
        """Close the connection if, `timeout` s from now, it still has not started a request
        after `cycle` (None: the first)."""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._watched = cycle
        if timeout > 0:
            self._header_timer = asyncio.get_running_loop().call_later(
                timeout, self._headers_late, cycle
            )

    def _headers_late(self, cycle: object) -> None:
        self._header_timer = None
        if getattr(self, "cycle", None) is cycle and not self.transport.is_closing():
            self.transport.close()  # its request headers did not arrive in time

    def data_received(self, data: bytes) -> None:
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.response_complete and self._watched is not cycle:
            self._watch(cycle, connection_limits()[0])  # the next request's headers
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
        peer = getattr(self, "_peer", "")
        if peer:
            left = self._open.get(peer, 1) - 1
            if left > 0:
                self._open[peer] = left
            else:
                self._open.pop(peer, None)
        if hasattr(self, "transport"):
            super().connection_lost(exc)


@functools.cache
def connection_limits() -> tuple[float, int]:
    """(HEADER_TIMEOUT_S, MAX_CONNECTIONS_PER_CLIENT) of this process's settings."""
    from app.settings import Settings

    settings = Settings()
    return float(settings.header_timeout_s), int(settings.max_connections_per_client)


def worker_app() -> Any:
    """The app of one worker process (uvicorn --factory): logging as the parent asked."""
    from app.main import create_app
    from app.settings import Settings

    configure_logging(os.environ.get(LOG_ENV[0], "info"), os.environ.get(LOG_ENV[1], "json"))
    return create_app(Settings())


def loopback(host: str) -> bool:
    """Whether `host` (the --host address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def open_refusal(host: str, api_keys: str | None, allow_open: bool) -> str | None:
    """Why a start is refused: no API_KEYS on an address others can reach, without ALLOW_OPEN=1
    (every route would answer anyone, the admin routes included); None when it may start."""
    if (api_keys or "").strip() or allow_open or loopback(host):
        return None
    return (
        f"python -m app: --host {host} serves other machines, and API_KEYS is unset: every "
        "route, model registration included, would answer anyone. Set API_KEYS (docs/security.md"
        "), or ALLOW_OPEN=1 to serve an open service on purpose, or --host 127.0.0.1.\n"
    )


def check_settings(parser: argparse.ArgumentParser, host: str) -> float:
    """Stop the start, before any worker is spawned, on a setting this machine cannot honour
    (DEVICE=cuda without a CUDA device, ...) or an open service on a network address: one line
    per setting, exit status 2. Returns SHUTDOWN_GRACE_S."""
    from pydantic import ValidationError

    from app.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        lines = [
            f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        parser.exit(2, "python -m app: invalid settings\n" + "\n".join(lines) + "\n")
    refusal = open_refusal(host, settings.api_keys, settings.allow_open)
    if refusal is not None:
        parser.exit(2, refusal)
    return settings.shutdown_grace_s


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    args = parser.parse_args()
    configure_logging(args.log_level, args.log_format)
    grace = check_settings(parser, args.host)
    # SIGTERM: running requests get SHUTDOWN_GRACE_S (then app/main.py cancels explanations,
    # which answer 503), and uvicorn cancels whatever still runs a little later; never an
    # open-ended "Waiting for connections to close".
    backstop = math.ceil(grace + SHUTDOWN_BACKSTOP_S)
    cores = os.cpu_count() or 1
    workers = processes(os.environ, cores)
    if workers == 1:
        uvicorn.run(
            worker_app(),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            log_config=None,  # keep our handlers (JSON lines with request ids)
            http=NoDelayHTTP,
            timeout_graceful_shutdown=backstop,
        )
        return
    # Workers are spawned (fresh interpreters): what they need goes through the environment.
    os.environ.setdefault("EXPLAIN_WORKERS", str(max(1, cores // workers)))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="attr-metrics-"))
    os.environ[LOG_ENV[0]], os.environ[LOG_ENV[1]] = args.log_level, args.log_format
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    # Ready only once every process is (a probe reaches any of them): app/readiness.py.
    os.environ[READY_DIR_ENV] = tempfile.mkdtemp(prefix="attr-ready-")
    os.environ[PROCESSES_ENV] = str(workers)
    uvicorn.run(
        "app.__main__:worker_app",
        factory=True,
        workers=workers,
        http="app.__main__:NoDelayHTTP",
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,
        timeout_graceful_shutdown=backstop,
    )


if __name__ == "__main__":
    main()
