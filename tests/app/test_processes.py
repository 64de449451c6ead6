"""Several API processes under one `python -m app` (WEB_CONCURRENCY=2): an answer computed by
one process is a cache hit on the other (through Redis), a model registered through one is
explained by the other (through the database), metrics are summed over both; and the rules
for how many processes run."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.__main__ import processes
from tests.app.test_jobs_celery import postgres_url  # noqa: F401 (a fixture)
from tests.app.test_repository import form, scripted
from tests.conftest import ROOT, RedisServer, free_port

pytestmark = pytest.mark.slow

ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
EXPLAIN = "/v2/models/diabetes-mlp/explain/shapley"


def test_how_many_processes() -> None:
    assert processes({"REDIS_URL": "redis://x"}, cores=8) == 8  # shared state: one per core
    assert processes({}, cores=8) == 1  # embedded: the cache and job queue live in-process
    assert processes({"REDIS_URL": "redis://x", "WEB_CONCURRENCY": "3"}, cores=8) == 3
    assert processes({"WEB_CONCURRENCY": "1"}, cores=8) == 1
    with pytest.raises(SystemExit, match="needs REDIS_URL"):
        processes({"WEB_CONCURRENCY": "2"}, cores=8)
    with pytest.raises(SystemExit, match="positive integer"):
        processes({"REDIS_URL": "redis://x", "WEB_CONCURRENCY": "0"}, cores=8)


def test_one_of_sibling_processes_resumes_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.main import resumes_here

    monkeypatch.delenv("ATTRIBUTION_SUPERVISOR", raising=False)
    assert resumes_here() and resumes_here()  # a lone process always resumes
    monkeypatch.setenv("ATTRIBUTION_SUPERVISOR", f"test-{os.getpid()}-{time.time_ns()}")
    assert resumes_here()  # the first takes the lock
    assert not resumes_here()  # a sibling (another open file: flock refuses it) does not


class Server:
    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def records(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def served_by(self, request_id: str, timeout_s: float = 10) -> int:
        """The pid whose access line names `request_id` (written just after the answer)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for r in self.records():
                if r.get("logger") == "app.access" and r.get("request_id") == request_id:
                    return int(r["pid"])
            assert time.monotonic() < deadline, f"no access line for {request_id}"
            time.sleep(0.05)

    def post(self, path: str, request_id: str, **kwargs: Any) -> tuple[httpx.Response, int]:
        """On a new connection each time, so that either process may accept it."""
        headers = {"X-Request-ID": request_id}
        r = httpx.post(self.url + path, headers=headers, timeout=60, **kwargs)
        return r, self.served_by(request_id)


@pytest.fixture()
def server(
    redis_server: RedisServer,
    postgres_url: str,  # noqa: F811 (the fixture imported above)
    model_dir: Path,
    tmp_path: Path,
) -> Iterator[Server]:
    port = free_port()
    env = {
        **os.environ,
        "WEB_CONCURRENCY": "2",
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": postgres_url,
        "MODEL_DIR": str(model_dir),
        "USER_MODEL_DIR": str(tmp_path / "user-models"),
        "JOB_QUEUE": "inprocess",
        "LOAD_BACKGROUND_MODELS": "false",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port), "--log-level", "info"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            yield Server(url, log)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def from_other(
    server: Server, first_pid: int, path: str, body: Any, prefix: str, timeout_s: float = 30
) -> tuple[httpx.Response, int]:
    """A 200 answer from a process other than `first_pid`: batches of 8 concurrent requests on
    new connections (one at a time, one idle process may win every accept)."""
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(8) as pool:
        for batch in itertools.count():
            ids = [f"{prefix}-{batch}-{k}" for k in range(8)]
            answers = list(pool.map(lambda rid: server.post(path, rid, json=body), ids))
            for r, pid in answers:
                if pid != first_pid and r.status_code == 200:
                    return r, pid
            assert time.monotonic() < deadline, [(pid, r.text[:80]) for r, pid in answers]
            time.sleep(0.1)
    raise AssertionError("unreachable")


def test_two_processes_share_hits_models_and_metrics(server: Server) -> None:
    body = {"inputs": [ROW], "seed": 11}
    first, pid = server.post(EXPLAIN, "computed", json=body)
    assert first.json()["meta"]["cache"] == "miss"
    hit, other = from_other(server, pid, EXPLAIN, body, "again")
    assert hit.json()["meta"]["cache"] == "hit" and hit.json()["id"].startswith("again-")
    assert hit.json()["data"] == first.json()["data"]

    # a model registered through one process is explained by the other (its view of the
    # store is up to ~1 s stale: 404 until then)
    background = np.array([[0.0, 1.0, 2.0, 3.0], [2.0, 3.0, 0.0, 1.0]])
    csv = "a,b,c,d\n" + "\n".join(",".join(str(v) for v in row) for row in background) + "\n"
    registered, reg_pid = server.post(
        "/v2/repository/models",
        "register",
        data=form(),
        files={"file": ("m.pt", scripted([1.0, -2.0, 0.5, 3.0])), "background": ("b.csv", csv)},
    )
    assert registered.status_code == 201, registered.text
    path = "/v2/models/linear-user/explain/shapley"
    answer, _ = from_other(server, reg_pid, path, {"inputs": [[1, 2, 3, 4]]}, "user")
    values = answer.json()["data"]["explanations"][0]["values"]
    expected = np.array([1.0, -2.0, 0.5, 3.0]) * (np.array([1, 2, 3, 4]) - background.mean(0))
    np.testing.assert_allclose(values, expected, atol=1e-5)

    # /metrics sums both processes: every explain request either of them served is counted
    access = [r for r in server.records() if r.get("logger") == "app.access"]
    assert {r["pid"] for r in access} == {pid, other} | {reg_pid}
    text = httpx.get(server.url + "/metrics", timeout=30).text
    lookups = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("explain_cache_requests_total{")
    )
    # (a 404 for a model not yet seen makes no look-up)
    assert lookups == sum("/explain/" in r["route"] and r["status"] == 200 for r in access)


def test_ready_only_once_every_process_is(server: Server) -> None:
    """The fixture saw one 200: from then on every process answers ready (a probe reaches any
    of them), including the one that was still loading its models when the first said so."""
    answers: list[tuple[int, int]] = []

    def probe(rid: str) -> httpx.Response:  # a new connection: either process may accept it
        return httpx.get(f"{server.url}/v2/health/ready", headers={"X-Request-ID": rid}, timeout=30)

    with ThreadPoolExecutor(8) as pool:
        for batch in range(4):
            ids = [f"ready-{batch}-{k}" for k in range(8)]
            for r, rid in zip(pool.map(probe, ids), ids, strict=True):
                answers.append((r.status_code, server.served_by(rid)))
    assert all(code == 200 for code, _ in answers), answers
    assert len({pid for _, pid in answers}) == 2  # both processes were asked


def test_readiness_counts_live_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.readiness import PROCESSES_ENV, READY_DIR_ENV, mark_ready, processes_waiting

    monkeypatch.setenv(READY_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PROCESSES_ENV, "2")
    assert processes_waiting() == (0, 2)
    mark_ready()
    assert (tmp_path / str(os.getpid())).exists() and processes_waiting() == (1, 2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / str(dead.pid)).touch()  # a process that marked itself, then died
    assert processes_waiting() == (1, 2)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / str(alive.pid)).touch()
        assert processes_waiting() is None
    finally:
        alive.kill()
        alive.wait()
    monkeypatch.delenv(PROCESSES_ENV)
    assert processes_waiting() is None  # one process answers for itself
