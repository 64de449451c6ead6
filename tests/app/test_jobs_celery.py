"""Audits on real parts: Celery workers over Redis, PostgreSQL, a worker killed with -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.app.test_jobs import lines, wait
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PG = os.environ.get("PG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture()
def postgres_url() -> Iterator[str]:
    """A fresh database on the local PostgreSQL server, dropped afterwards."""
    name = f"attr_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    yield PG.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    admin.close()


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker", "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_killed_worker_loses_nothing(
    redis_server: RedisServer, postgres_url: str, registry: ModelRegistry, model_dir: Path
) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": postgres_url,
        "MODEL_DIR": str(model_dir),
        "JOB_VISIBILITY_TIMEOUT_S": "5",
    }
    workers = [start_worker(env), start_worker(env)]
    settings = Settings(
        model_dir=model_dir,
        redis_url=redis_server.url,
        database_url=postgres_url,
        job_queue="celery",
    )
    rows = [[10.0 + 0.05 * i] * 30 for i in range(120)]
    body = {"model": "breast-cancer-mlp", "inputs": rows, "budget": 12000, "chunk_size": 10}
    try:
        # Not make_client: the API process restarts mid-job on the same Redis and Postgres;
        # make_client's clients stay started until the module ends
        with TestClient(create_app(settings, registry)) as client:
            job_id = client.post("/v2/jobs", json=body).json()["id"]
            deadline = time.monotonic() + 120
            while client.get(f"/v2/jobs/{job_id}").json()["progress"]["done"] < 15:
                assert time.monotonic() < deadline, "no progress from the workers"
                time.sleep(0.1)
            workers[0].send_signal(signal.SIGKILL)  # mid-chunk, most likely
            workers[0].wait()
        # The API process restarts while the job runs: the job stays visible and finishes.
        with TestClient(create_app(settings, registry)) as client:
            status = client.get(f"/v2/jobs/{job_id}").json()
            assert status["status"] in ("running", "succeeded")
            status = wait(client, job_id, timeout=240)
            assert status["status"] == "succeeded", status
            results = lines(client, job_id)
            assert [r["index"] for r in results] == list(range(120))  # exactly one each
            assert status["progress"]["done"] == 120
            assert status["summary"]["errors"] == 0
            # Same Idempotency-Key, same job; a new audit of the same rows is all cache hits.
            key = {"Idempotency-Key": f"k-{job_id}"}
            first = client.post("/v2/jobs", json=body, headers=key).json()["id"]
            assert client.post("/v2/jobs", json=body, headers=key).json()["id"] == first
            again = wait(client, first, timeout=120)
            assert again["summary"]["cache_hits"] == 120
            assert json.dumps(lines(client, first)[7]["explanation"]) == json.dumps(
                results[7]["explanation"]
            )
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    w.kill()
