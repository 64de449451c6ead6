"""Slow clients are cut off (issue 39): the real server (python -m app) closes a connection that
has not finished its request headers HEADER_TIMEOUT_S after it opened or after its last
answer, and closes at once connections past MAX_CONNECTIONS_PER_CLIENT from one address, while
the health route keeps answering."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import running_server

CAP = 8


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    env = {
        "MODEL_DIR": str(model_dir),
        "REDIS_URL": None,
        "LOAD_BACKGROUND_MODELS": "false",
        "HEADER_TIMEOUT_S": "1",
        "MAX_CONNECTIONS_PER_CLIENT": str(CAP),
    }
    with running_server(env, timeout_s=600) as url:
        yield url


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (EOF or reset), None if it stayed open."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_half_sent_headers_are_cut_off(server: str) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n")  # no end of headers
        took = closed_within(sock, 6)
    assert took is not None and took < 4, took
    # a keep-alive connection that answered once, then starts a request and stalls
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b"200 OK" in sock.recv(4096)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        took = closed_within(sock, 6)
    assert took is not None and took < 4, took


def test_a_request_sent_in_time_is_answered(server: str) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        time.sleep(0.3)
        sock.sendall(b"Host: t\r\n\r\n")
        assert b"200 OK" in sock.recv(4096)


def test_connections_past_the_cap_are_closed_and_others_answer(server: str) -> None:
    held = [connect(server) for _ in range(CAP)]
    try:
        for sock in held:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
            assert b"200 OK" in sock.recv(4096)  # keep-alive: open and counted
        with connect(server) as extra:
            took = closed_within(extra, 3)
        assert took is not None and took < 1, took
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)  # the server counts them closed
    assert httpx.get(f"{server}/v2/health/live", timeout=5).status_code == 200
