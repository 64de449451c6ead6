"""Operations: request ids (echoed, generated, in the explain answer and in every log line),
structured JSON logs from a real server process, and the Prometheus metrics (HTTP requests per
route and status, explain latency per status, queue depth, worker heartbeats)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.jobs.queue import CeleryQueue
from app.jobs.store import JobStore
from app.metrics import HEARTBEAT_PREFIX, Heartbeat, JobCollector
from tests.conftest import ROOT, RedisServer, free_port

ROW = [50, 1, 25.0, 90.0, 200, 100, 50, 4, 5.0, 90]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_request_id_is_echoed_and_becomes_the_answer_id(client: TestClient) -> None:
    r = client.post(
        "/v2/models/diabetes-mlp/explain/shapley",
        json={"inputs": [ROW]},
        headers={"X-Request-ID": "trace-42.a:b"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "trace-42.a:b"
    assert r.json()["id"] == "trace-42.a:b"
    # an id in the body wins for the body (the request's own field), the header still echoes
    r = client.post(
        "/v2/models/diabetes-mlp/explain/shapley",
        json={"inputs": [ROW], "id": "body-id"},
        headers={"X-Request-ID": "header-id"},
    )
    assert r.json()["id"] == "body-id" and r.headers["x-request-id"] == "header-id"


def test_request_ids_are_made_when_missing_or_unsafe(client: TestClient) -> None:
    seen = set()
    for header in ({}, {"X-Request-ID": "has spaces"}, {"X-Request-ID": "x" * 201}):
        r = client.get("/v2/health/live", headers=header)
        rid = r.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", rid), rid
        seen.add(rid)
    assert len(seen) == 3


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("get", "/v2/models/no-such-model", None, 404),
        ("post", "/v2/models/diabetes-mlp/explain/shapley", {"inputs": "x"}, 422),
        ("get", "/no/such/route", None, 404),
    ],
)
def test_errors_carry_the_request_id_too(
    client: TestClient, method: str, path: str, body: Any, status: int
) -> None:
    r = client.request(method, path, json=body, headers={"X-Request-ID": "err-1"})
    assert r.status_code == status and r.headers["x-request-id"] == "err-1"


def test_http_and_explain_metrics_by_route_and_status(client: TestClient) -> None:
    client.post("/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [ROW]})
    client.get("/v2/models/no-such-model")
    client.get("/random/path/abc")
    got = samples(client.get("/metrics").text)
    explain = (
        "http_requests_total",
        (
            ("method", "POST"),
            ("route", "/v2/models/{model}/explain/shapley"),
            ("status", "200"),
        ),
    )
    assert got[explain] >= 1
    missing = (
        "http_requests_total",
        (("method", "GET"), ("route", "/v2/models/{model}"), ("status", "404")),
    )
    assert got[missing] >= 1
    # unknown paths share one label value: no unbounded label sets from scanners
    unmatched = (
        "http_requests_total",
        (("method", "GET"), ("route", "<unmatched>"), ("status", "404")),
    )
    assert got[unmatched] >= 1
    assert not any("/random/path" in str(labels) for _, labels in got)
    count = [
        v
        for (name, labels), v in got.items()
        if name == "http_request_duration_seconds_count" and ("status", "200") in labels
    ]
    assert count and sum(count) >= 1
    assert got[("job_queue_depth", (("backend", "inprocess"),))] == 0
    latency = (
        "explain_request_duration_seconds_count",
        (("explainer", "shapley"), ("model", "diabetes-mlp"), ("status", "200")),
    )
    assert got[latency] >= 1
    # A typo in a model name is not a new series of the explain metrics.
    for typo in ("diabetes-mpl", "diabetes-mlp2"):
        client.post(f"/v2/models/{typo}/explain/shapley", json={"inputs": [ROW]})
    got = samples(client.get("/metrics").text)
    typos = (
        "explain_requests_total",
        (("explainer", "shapley"), ("model", "<unknown>"), ("status", "404")),
    )
    assert got[typos] >= 2
    assert not any("diabetes-mpl" in str(labels) for _, labels in got)


def test_inprocess_queue_metrics_follow_a_job(client: TestClient) -> None:
    r = client.post(
        "/v2/jobs",
        json={"model": "diabetes-mlp", "inputs": [ROW, ROW], "chunk_size": 1},
    )
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    for _ in range(300):
        if client.get(f"/v2/jobs/{job}").json()["status"] == "succeeded":
            break
        time.sleep(0.1)
    got = samples(client.get("/metrics").text)
    assert got[("workers_alive", ())] >= 1  # the in-process job threads
    assert got[("jobs_unfinished", (("status", "running"),))] == 0


def test_celery_queue_depth_and_worker_heartbeats(tmp_path: Path) -> None:
    server = RedisServer()
    server.start()
    try:
        queue = CeleryQueue(server.url, 60)
        for chunk in range(3):  # no worker is running: the tasks wait in Redis
            queue.submit("job-x", chunk)
        store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
        registry = CollectorRegistry()
        registry.register(JobCollector(queue, store, server.url))
        got = samples(generate_latest(registry).decode())
        assert got[("job_queue_depth", (("backend", "celery"),))] == 3
        assert got[("workers_alive", ())] == 0

        Heartbeat(server.url, "w1").beat()
        import redis

        stale = time.time() - 120  # a worker that stopped beating two minutes ago
        redis.Redis.from_url(server.url).set(f"{HEARTBEAT_PREFIX}w0", repr(stale))
        got = samples(generate_latest(registry).decode())
        beat = got[("worker_heartbeat_timestamp_seconds", (("worker", "w1"),))]
        assert abs(beat - time.time()) < 10
        assert got[("worker_heartbeat_timestamp_seconds", (("worker", "w0"),))] == stale
        assert got[("workers_alive", ())] == 1
        queue.close()
    finally:
        server.stop()


def test_json_logs_of_a_real_server(model_dir: Path, tmp_path: Path) -> None:
    """Every line the server writes is a JSON object; the access line of a request names its
    id, route, status, model and explainer."""
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "LOAD_MODELS_ON_START": "false",  # the explain request loads the one model it needs
    }
    env.pop("REDIS_URL", None)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port), "--log-level", "info"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "server not ready"
                time.sleep(0.2)
            r = httpx.post(
                f"{url}/v2/models/diabetes-mlp/explain/shapley",
                json={"inputs": [ROW]},
                headers={"X-Request-ID": "log-test-1"},
                timeout=60,
            )
            assert r.status_code == 200
            httpx.get(f"{url}/v2/models/nope", headers={"X-Request-ID": "log-test-2"})
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line parses
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    access = {r["request_id"]: r for r in records if r["logger"] == "app.access"}
    ok = access["log-test-1"]
    assert ok["status"] == 200 and ok["route"] == "/v2/models/{model}/explain/shapley"
    assert ok["model"] == "diabetes-mlp" and ok["explainer"] == "shapley"
    assert ok["method"] == "POST" and ok["duration_ms"] > 0
    assert access["log-test-2"]["status"] == 404
    assert any(r["logger"].startswith("uvicorn") for r in records)  # uvicorn's lines too
