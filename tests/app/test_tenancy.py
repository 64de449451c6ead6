"""Tenants: jobs belong to the key that submitted them, idempotency keys are per key, the cache
is shared or per key (CACHE_SCOPE), readiness without a key counts models, the access log
names the key. Real Redis and PostgreSQL; keys as API_KEYS configures them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.auth import digest
from app.jobs.store import JobStore
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.conftest import ROOT, RedisServer, free_port

PG = os.environ.get("PG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
KEYS = {"alice": ["jobs"], "bob": ["jobs"], "root": ["admin"]}
SECRET = {name: f"tenancy-{name}-{uuid.uuid4().hex}" for name in KEYS}
API_KEYS = json.dumps(
    [{"name": n, "sha256": digest(SECRET[n]).hex(), "scopes": s} for n, s in KEYS.items()]
)
ROWS = [[10.0 + 0.1 * i] * 30 for i in range(6)]
AUDIT = {"model": "breast-cancer-mlp", "inputs": ROWS, "budget": 8000, "chunk_size": 3}


def h(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRET[name]}"}


def pg_database() -> Iterator[str]:
    """A fresh database on the local PostgreSQL server (SQLAlchemy URL), dropped afterwards."""
    name = f"attr_tenancy_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server = RedisServer()
    server.start()
    yield server.url
    server.stop()


@pytest.fixture()
def postgres_url() -> Iterator[str]:
    yield from pg_database()


# Not make_client: an unstarted client per call on a shared Redis and Postgres, started and stopped
# inside a test; make_client's clients stay started until the module ends
def tenancy_app(
    model_dir: Path, registry: ModelRegistry, redis: str, db: str, **kw: Any
) -> TestClient:
    settings = Settings(
        model_dir=model_dir,
        api_keys=API_KEYS,
        redis_url=redis,
        database_url=db,
        job_queue="inprocess",
        **kw,
    )
    return TestClient(create_app(settings, registry))


def wait(client: TestClient, job_id: str, who: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/v2/jobs/{job_id}", headers=h(who)).json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            return dict(status)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {status}")


def assert_unknown(r: Any, job_id: str) -> None:
    """Another key's job answers as an unknown one: 404, nothing about it."""
    assert r.status_code == 404, r.text
    assert r.json() == {"error": f"unknown job {job_id!r}", "code": "unknown_job"}


def test_a_job_is_its_keys_and_the_admins(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    with tenancy_app(model_dir, registry, redis_url, postgres_url) as client:
        r = client.post("/v2/jobs", json=AUDIT, headers=h("alice"))
        assert r.status_code == 202
        job_id = r.json()["id"]
        assert wait(client, job_id, "alice")["status"] == "succeeded"
        # bob: not in his list, and every route of it is 404
        assert job_id not in {j["id"] for j in client.get("/v2/jobs", headers=h("bob")).json()}
        for path in ["", "/results", "/results?format=csv", "/results?format=parquet", "/plot"]:
            assert_unknown(client.get(f"/v2/jobs/{job_id}{path}", headers=h("bob")), job_id)
        assert_unknown(client.delete(f"/v2/jobs/{job_id}", headers=h("bob")), job_id)
        # alice and root see it, its results too
        for who in ("alice", "root"):
            listed = client.get("/v2/jobs", headers=h(who)).json()
            assert {j["id"]: j["owner"] for j in listed}[job_id] == "alice"
            results = client.get(f"/v2/jobs/{job_id}/results", headers=h(who))
            assert results.status_code == 200 and len(results.text.splitlines()) == len(ROWS)
            assert not any("error" in json.loads(x) for x in results.text.splitlines())
            plot = client.get(f"/v2/jobs/{job_id}/plot?format=vega", headers=h(who))
            assert plot.status_code == 200, plot.text
        bobs = client.post("/v2/jobs", json=AUDIT, headers=h("bob")).json()["id"]
        assert {j["id"] for j in client.get("/v2/jobs", headers=h("alice")).json()} == {job_id}
        assert {j["id"] for j in client.get("/v2/jobs", headers=h("root")).json()} == {
            job_id,
            bobs,
        }
        wait(client, bobs, "bob")


def test_cancel_is_the_owners_and_the_admins(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    # No job threads: jobs stay queued, so a cancel has something to cancel.
    with tenancy_app(model_dir, registry, redis_url, postgres_url, job_workers=0) as client:
        alices = client.post("/v2/jobs", json=AUDIT, headers=h("alice")).json()["id"]
        assert_unknown(client.delete(f"/v2/jobs/{alices}", headers=h("bob")), alices)
        assert client.get(f"/v2/jobs/{alices}", headers=h("alice")).json()["status"] == "queued"
        r = client.delete(f"/v2/jobs/{alices}", headers=h("root"))
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        # an admin's training job: no jobs key cancels it (nor sees it)
        train = {"kind": "learn-baseline", "model": "diabetes-mlp", "parameters": {"iterations": 1}}
        r = client.post("/v2/jobs", json=train, headers=h("root"))
        assert r.status_code == 202
        training = r.json()["id"]
        for who in ("alice", "bob"):
            assert_unknown(client.delete(f"/v2/jobs/{training}", headers=h(who)), training)
        assert client.get(f"/v2/jobs/{training}", headers=h("root")).json()["status"] == "queued"
        own = client.post("/v2/jobs", json=AUDIT, headers=h("bob")).json()["id"]
        r = client.delete(f"/v2/jobs/{own}", headers=h("bob"))
        assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_idempotency_keys_are_per_key(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    with tenancy_app(model_dir, registry, redis_url, postgres_url, job_workers=0) as client:
        same = {"Idempotency-Key": "audit-1"}
        first = client.post("/v2/jobs", json=AUDIT, headers=h("alice") | same)
        other = client.post("/v2/jobs", json=AUDIT, headers=h("bob") | same)
        assert first.status_code == other.status_code == 202
        assert first.json()["id"] != other.json()["id"]
        assert "idempotent-replayed" not in other.headers
        for who, job in (("alice", first), ("bob", other)):
            again = client.post("/v2/jobs", json=AUDIT, headers=h(who) | same)
            assert again.status_code == 202 and again.json()["id"] == job.json()["id"]
            assert again.headers["idempotent-replayed"] == "true"
        # a key name of any length still fits the column (scoped keys are digests)
        long_key = {"Idempotency-Key": "k" * 200}
        r = client.post("/v2/jobs", json=AUDIT, headers=h("alice") | long_key)
        assert r.status_code == 202


OLD_JOBS = """CREATE TABLE jobs (
    id VARCHAR(32) PRIMARY KEY, kind VARCHAR(32) NOT NULL, model VARCHAR(200) NOT NULL,
    status VARCHAR(16) NOT NULL, total INTEGER NOT NULL, done INTEGER NOT NULL,
    chunk_size INTEGER NOT NULL, request TEXT NOT NULL, summary TEXT, error TEXT,
    idempotency_key VARCHAR(200) UNIQUE, created_at FLOAT NOT NULL, started_at FLOAT,
    finished_at FLOAT)"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_database_from_before_owners_keeps_working(
    backend: str,
    tmp_path: Path,
    model_dir: Path,
    registry: ModelRegistry,
    redis_url: str,
) -> None:
    """The column is added at start; the old rows (no owner) are the admin's."""
    databases = pg_database() if backend == "postgresql" else iter([f"sqlite:///{tmp_path}/j.db"])
    url = next(databases)
    try:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text(OLD_JOBS))
            conn.execute(
                text(
                    "INSERT INTO jobs VALUES ('old1', 'audit', 'diabetes-mlp', 'queued', 4, 0, 2,"
                    " '{}', NULL, NULL, 'audit-1', 1.0, NULL, NULL)"
                )
            )
        engine.dispose()
        assert JobStore(url).get("old1") is not None  # opening it migrates it
        assert JobStore(url).get("old1", owner="alice") is None  # twice: a no-op
        with tenancy_app(model_dir, registry, redis_url, url, job_workers=0) as client:
            assert client.get("/v2/jobs/old1", headers=h("root")).json()["status"] == "queued"
            assert_unknown(client.get("/v2/jobs/old1", headers=h("alice")), "old1")
            r = client.post(
                "/v2/jobs", json=AUDIT, headers=h("alice") | {"Idempotency-Key": "audit-1"}
            )
            assert r.status_code == 202 and r.json()["id"] != "old1"
            assert client.delete("/v2/jobs/old1", headers=h("root")).json()["status"] == (
                "cancelled"
            )
    finally:
        next(databases, None)  # drops the PostgreSQL database


def explain(client: TestClient, who: str, row: list[float]) -> str:
    r = client.post(
        "/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [row]}, headers=h(who)
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-cache"].lower() == r.json()["meta"]["cache"]
    return str(r.json()["meta"]["cache"])


@pytest.mark.parametrize("scope", ["shared", "key"])
def test_cache_scope(
    scope: str, model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    """shared: bob's first request of what alice asked is a hit; key: a miss, then his own."""
    row = [50.0, 1, 25.0, 90.0, 180, 100, 50, 4, 4.5, 90.0 + uuid.uuid4().int % 1000 / 1000]
    with tenancy_app(model_dir, registry, redis_url, postgres_url, cache_scope=scope) as c:
        assert explain(c, "alice", row) == "miss"
        assert explain(c, "alice", row) == "hit"  # the second: the remembered key (KeyMemo)
        assert explain(c, "bob", row) == ("hit" if scope == "shared" else "miss")
        assert explain(c, "bob", row) == "hit"
        assert explain(c, "alice", row) == "hit"


def test_audits_hit_only_their_owners_answers_with_cache_scope_key(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    rows = [[11.0 + 0.01 * i + uuid.uuid4().int % 1000 / 1e5] * 30 for i in range(4)]
    body = {**AUDIT, "inputs": rows}
    with tenancy_app(model_dir, registry, redis_url, postgres_url, cache_scope="key") as c:
        hits = {}
        for n, who in enumerate(("alice", "alice", "bob")):
            job = c.post("/v2/jobs", json=body, headers=h(who)).json()["id"]
            hits[n] = wait(c, job, who)["summary"].get("cache_hits", 0)
        assert hits == {0: 0, 1: len(rows), 2: 0}


def test_readiness_without_a_key_counts_models(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    with tenancy_app(model_dir, registry, redis_url, postgres_url) as client:
        names = list(client.get("/v2/models", headers=h("alice")).json())
        names = [m["name"] if isinstance(m, dict) else m for m in names]
        assert "diabetes-mlp" in names
        keyed = client.get("/v2/health/ready", headers=h("alice")).json()
        assert set(keyed["models"]) >= {"diabetes-mlp"}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = client.get("/v2/health/ready", headers=headers)
            assert r.status_code in (200, 503)
            counts = r.json()["models"]
            assert set(counts) == {"loaded", "loading", "failed"}
            assert sum(counts.values()) == len(keyed["models"])
            assert counts["loaded"] == sum(1 for m in keyed["models"].values() if m["loaded"])
            assert not any(name in r.text for name in names), r.text
            assert set(r.json()["cache"]) == {"backend", "ok"}


def test_access_log_names_the_key_never_the_secret(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "MODEL_DIR": str(model_dir),
        "API_KEYS": API_KEYS,
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp_path / "user-models"),
        "LOAD_MODELS_ON_START": "false",
    }
    env.pop("REDIS_URL", None)
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port), "--log-level", "info"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "server not ready"
                time.sleep(0.2)
            asks = {
                "t-alice": ("GET", "/v2/jobs", {"X-API-Key": SECRET["alice"]}),
                "t-root": ("GET", "/v2/jobs", h("root")),
                "t-forbidden": ("GET", "/metrics", h("bob")),  # 403: the key is still named
                "t-wrong": ("GET", "/v2/jobs", {"Authorization": "Bearer wrong"}),
                "t-none": ("GET", "/v2/jobs", {}),
                "t-public": ("GET", "/v2/health/live", h("alice")),
            }
            status = {}
            for rid, (method, path, headers) in asks.items():
                r = httpx.request(method, url + path, headers={**headers, "X-Request-ID": rid})
                status[rid] = r.status_code
            assert status == {
                "t-alice": 200,
                "t-root": 200,
                "t-forbidden": 403,
                "t-wrong": 401,
                "t-none": 401,
                "t-public": 200,
            }
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    written = log_path.read_text()
    records = [json.loads(line) for line in written.splitlines() if line.strip()]
    access = {r["request_id"]: r for r in records if r["logger"] == "app.access"}
    assert {rid: access[rid]["key"] for rid in asks} == {
        "t-alice": "alice",
        "t-root": "root",
        "t-forbidden": "bob",
        "t-wrong": "-",
        "t-none": "-",
        "t-public": "alice",
    }
    for name, secret in SECRET.items():
        assert secret not in written and digest(secret).hex() not in written, name


def test_a_key_that_is_not_utf8_is_a_401_and_names_nothing(
    model_dir: Path, registry: ModelRegistry, redis_url: str, postgres_url: str
) -> None:
    with tenancy_app(model_dir, registry, redis_url, postgres_url, job_workers=0) as client:
        for header in ("Authorization", "X-API-Key"):
            r = client.get("/v2/jobs", headers={header.encode(): b"Bearer \xff\xfe\xc3"})
            assert r.status_code == 401 and r.json()["code"] == "unauthorized"
            ready = client.get("/v2/health/ready", headers={header.encode(): b"\xff"})
            assert ready.status_code in (200, 503) and "ready" in ready.json()
