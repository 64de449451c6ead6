"""Model workers hold no secret (issue 39): a real server started with API_KEYS, a database URL
and another secret in its environment runs a user model; the writable memory of the zygote
and of the worker (/proc/PID/mem) holds none of the key table, the key's digest, the URL or the
secret, while the server's own memory, scanned the same way, holds them (the scan can find)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import httpx
import pytest

from tests.app.test_sandbox_http import _cmdline, _descendants, _listens
from tests.conftest import running_server
from tests.sandbox_models import form, mlp, scripted_bytes

SECRET = "key-secret-7f3a9c1e5b"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()
MARKERS = {
    "the key table's tenant name": b"tenant-zq81x4",
    "the key's sha256 digest": DIGEST.encode(),
    "the database URL": b"jobs-db-w93kd2",
    "another secret in the environment": b"aws-secret-p0m2v7",
}


def writable_memory(pid: int) -> bytes:
    """The process's writable private mappings (heap, anonymous memory, stacks, data)."""
    out = bytearray()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            perms = fields[1]
            if "r" not in perms or "w" not in perms or end - start > 1 << 31:
                continue
            try:
                mem.seek(start)
                out += mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue  # a guard page or a mapping gone meanwhile
    return bytes(out)


def found(memory: bytes) -> list[str]:
    return [what for what, marker in MARKERS.items() if marker in memory]


@pytest.mark.skipif(os.geteuid() != 0, reason="reading another user's memory needs root")
def test_a_workers_memory_holds_no_secret(model_dir: Path, tmp_path: Path) -> None:
    keys = [{"name": "tenant-zq81x4", "sha256": DIGEST, "scopes": ["explain", "admin"]}]
    env = {
        "REDIS_URL": None,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "API_KEYS": json.dumps(keys),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs-db-w93kd2.db'}",
        "USER_MODEL_DIR": str(tmp_path / "user"),
        "AWS_SECRET_ACCESS_KEY": "aws-secret-p0m2v7",
        "LOAD_BACKGROUND_MODELS": "false",
    }
    headers = {"Authorization": f"Bearer {SECRET}"}
    with (
        running_server(env, timeout_s=600) as url,
        httpx.Client(base_url=url, timeout=120, headers=headers) as http,
    ):
        files = {"file": ("m.pt", scripted_bytes(mlp()))}
        r = http.post("/v2/repository/models", data=form("secrets-mlp"), files=files)
        assert r.status_code == 201, r.text
        tensor = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 0.0, 0.0]}
        assert http.post("/v2/models/secrets-mlp/infer", json={"inputs": [tensor]}).is_success
        server = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _listens(int(p), url))
        # the zygote (the forkserver) and its forks, the workers (their command line is its)
        forks = [p for p in _descendants(server) if "forkserver" in _cmdline(p)]
        zygotes = [p for p in forks if _descendants(p)]
        assert len(zygotes) == 1, forks
        workers = _descendants(zygotes[0])
        assert workers, "no model worker"
        assert set(found(writable_memory(server))) == set(MARKERS)  # the scan finds them
        for pid in [*zygotes, *workers]:
            memory = writable_memory(pid)
            assert len(memory) > 1 << 20, pid  # it read the process
            assert found(memory) == [], (pid, _cmdline(pid))
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert not re.search(rb"API_KEYS|DATABASE_URL|AWS_SECRET", environ), pid
