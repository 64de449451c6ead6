"""An upload in no format the server reads is refused from its first bytes: the real server
(python -m app) answers 400 to a request that declares 2 GiB and has sent 64 KiB of it, over a
raw loopback socket that sends nothing more (the answer cannot wait for the rest)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import running_server

BOUNDARY = "sniffBOUNDARY"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    env = {"MODEL_DIR": str(model_dir), "REDIS_URL": None, "LOAD_BACKGROUND_MODELS": "false"}
    with running_server(env, timeout_s=600) as url:
        yield url


def head(filename: str, declared: int) -> bytes:
    """The request line, headers and the form up to the file part's first byte."""
    form = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="job"\r\n\r\n'
        f"{json.dumps({'model': 'diabetes-mlp'})}\r\n"
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"'
        "\r\nContent-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return (
        "POST /v2/jobs/upload HTTP/1.1\r\nHost: test\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(form) + declared}\r\n\r\n"
    ).encode() + form


def answer_after(url: str, first: bytes, filename: str, declared: int) -> tuple[int, dict]:  # type: ignore[type-arg]
    """Send the head and `first` bytes of a `declared`-byte file, then only read."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head(filename, declared) + first)
        raw = b""
        while b"\r\n\r\n" not in raw or not raw.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)  # a timeout here: the server waited for the rest
            if not chunk:
                break
            raw += chunk
    status = int(raw.split(b" ", 2)[1])
    return status, json.loads(raw.split(b"\r\n\r\n", 1)[1])


def test_binary_file_refused_from_its_first_bytes(server: str) -> None:
    block = bytes(range(256)) * 256  # 64 KiB with NUL bytes
    status, body = answer_after(server, block, "rows.bin", 2 * 1024**3)
    assert status == 400 and body["code"] == "unsupported_upload", body
    assert "neither CSV, JSON lines nor Parquet" in body["error"]


def test_text_in_no_format_refused_from_its_first_bytes(server: str) -> None:
    text = b"id;name;score\n" * 5000  # 70 kB of text that is no format read here (no .csv name)
    status, body = answer_after(server, text, "export.txt", 2 * 1024**3)
    assert status == 400 and body["code"] == "unsupported_upload", body
    assert ".csv" in body["error"] and ".parquet" in body["error"]
