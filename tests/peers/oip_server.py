"""A small real Open Inference Protocol server in a thread, for the faults MLServer does not
make: it requires Basic auth, can answer 500 with a body that echoes secrets, trickle its
answer a byte at a time, and change its outputs and its metadata version while running.

The model: `m` reads rows of 3 numbers and answers `scale * sum(row)` (one output, FP32).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET_BODY = "REMOTE-INTERNAL-DETAIL-7f3a"  # what a failing remote says: admins only


@dataclass
class PeerState:
    """What the server does now (tests change it while it runs)."""

    user: str | None = None  # Basic auth required when set
    password: str | None = None
    mode: str = "ok"  # ok | fail500 | trickle | trickle_headers | deep | bigint
    scale: float = 1.0
    version: str = "1"
    trickle_s: float = 0.5  # seconds between two bytes when trickling
    infers: int = 0
    auth_seen: list[str] = field(default_factory=list)


@dataclass
class OipPeer:
    url: str  # http://127.0.0.1:port
    state: PeerState

    def model_url(self, userinfo: str | None = None) -> str:
        base = self.url if userinfo is None else self.url.replace("://", f"://{userinfo}@", 1)
        return f"{base}/v2/models/m"


def _handler(state: PeerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _authorised(self) -> bool:
            got = self.headers.get("Authorization", "")
            state.auth_seen.append(got)
            if state.user is None:
                return True
            token = base64.b64encode(f"{state.user}:{state.password}".encode()).decode()
            if got == f"Basic {token}":
                return True
            self._send(401, {"error": "unauthorised"})
            return False

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _trickle(self, raw: bytes) -> None:
            for i in range(len(raw)):
                try:
                    self.wfile.write(raw[i : i + 1])
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up
                time.sleep(state.trickle_s)

        def do_GET(self) -> None:
            if not self._authorised():
                return
            if self.path.rstrip("/") != "/v2/models/m":
                self._send(404, {"error": "no such model"})
                return
            self._send(
                200,
                {
                    "name": "m",
                    "versions": [state.version],
                    "platform": "peer",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
                },
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self._authorised():
                return
            state.infers += 1
            if state.mode == "fail500":
                echo = f"{SECRET_BODY}; you sent {self.headers.get('Authorization')}"
                self._send(500, {"error": echo})
                return
            tensor = body["inputs"][0]
            rows, width = tensor["shape"][0], tensor["shape"][1]
            data = tensor["data"]
            out = [state.scale * sum(data[r * width : (r + 1) * width]) for r in range(rows)]
            answer = {
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [rows, 1], "data": out}]
            }
            raw = json.dumps(answer).encode()
            if state.mode == "deep":  # JSON nested past any parser's recursion
                raw = b'{"outputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            elif state.mode == "bigint":  # a 5000-digit integer
                raw = raw.replace(b'"data": [', b'"data": [' + b"9" * 5000 + b", ", 1)
            if state.mode == "trickle_headers":
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                self._trickle(head + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if state.mode == "trickle":
                self._trickle(raw)
                self.close_connection = True
                return
            self.wfile.write(raw)

    return Handler


@contextmanager
def oip_peer(state: PeerState | None = None) -> Iterator[OipPeer]:
    """The server on a free loopback port, stopped after."""
    state = state or PeerState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield OipPeer(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        server.shutdown()
        server.server_close()
