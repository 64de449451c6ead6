"""Job fault tests on real parts: a private PostgreSQL cluster stopped mid-job, a private Redis
down at submit, a Celery worker (`python -m worker`) killed mid-chunk and killed again (a model
that crashes its process). Each ends with every result stored exactly once."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from app.jobs.leases import LOST
from app.jobs.unavailable import store_health
from app.main import create_app
from app.settings import Settings
from tests.app.test_jobs import lines, wait
from tests.conftest import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "breast-cancer-mlp"


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL server binaries (initdb) are not installed; run scripts/setup.sh")
    return found[-1].parent


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of this test module only (initdb in a temp folder, its own port):
    stopping it disturbs no other user of the machine's server."""

    folder: Path
    port: int

    def _run(self, *args: str) -> None:
        command = [str(_pg_bin() / args[0]), *args[1:]]
        if os.geteuid() == 0:  # the server refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        self._run("initdb", "-D", str(self.folder / "data"), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-o", options, "-l", log, "-w",
                  "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")

    def database(self) -> str:
        """A fresh database; its SQLAlchemy URL."""
        name = f"faults_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name).replace("postgresql://", "postgresql+psycopg://")

    def dsn(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    folder = Path(tempfile.mkdtemp(prefix="attr-pg-"))
    os.chmod(folder, 0o755)
    server = PrivatePostgres(folder, free_port())
    server.init()
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped already
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Setup:
    redis: RedisServer
    database_url: str
    model_dir: Path
    logs: Path
    workers: list[subprocess.Popen[bytes]]

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "REDIS_URL": self.redis.url,
            "DATABASE_URL": self.database_url,
            "MODEL_DIR": str(self.model_dir),
            "JOB_VISIBILITY_TIMEOUT_S": "5",
            "JOB_LEASE_S": "3",
            "JOB_SWEEP_INTERVAL_S": "1",
            "LOAD_MODELS_ON_START": "false",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def worker(self, **extra: str) -> subprocess.Popen[bytes]:
        """A real Celery worker process; its log goes to a file named in failures."""
        log = (self.logs / f"worker-{len(self.workers)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "--log-level", "info"],
            cwd=ROOT,
            env=self.env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(proc)
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
        """Until the worker is connected to the broker and consuming."""
        log = self.logs / f"worker-{self.workers.index(proc)}.log"
        deadline = time.monotonic() + timeout
        while " ready." not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, self.worker_log()
            time.sleep(0.1)

    def client(self) -> TestClient:
        settings = Settings(
            model_dir=self.model_dir,
            redis_url=self.redis.url,
            database_url=self.database_url,
            job_queue="celery",
            job_visibility_timeout_s=5,
            load_models_on_start=False,
        )
        # Not make_client: an unstarted client on the worker processes' Redis and database,
        # started and stopped inside each fault test; its registry comes from the settings
        return TestClient(create_app(settings))

    def worker_log(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.logs.glob("worker-*.log")))


@pytest.fixture()
def setup(
    postgres: PrivatePostgres, redis_server: RedisServer, model_dir: Path, tmp_path: Path
) -> Iterator[Setup]:
    s = Setup(redis_server, postgres.database(), model_dir, tmp_path, [])
    try:
        yield s
    finally:
        for w in s.workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=15)


def audit(rows: int, budget: int, chunk: int) -> dict[str, Any]:
    inputs = [[10.0 + 0.05 * i] * 30 for i in range(rows)]
    return {"model": MODEL, "inputs": inputs, "budget": budget, "chunk_size": chunk}


def progress(client: TestClient, job_id: str, at_least: int, timeout: float, s: Setup) -> None:
    deadline = time.monotonic() + timeout
    while client.get(f"/v2/jobs/{job_id}").json()["progress"]["done"] < at_least:
        assert time.monotonic() < deadline, f"no progress from the worker:\n{s.worker_log()}"
        time.sleep(0.05)


def finished_once(client: TestClient, job_id: str, total: int, s: Setup) -> dict[str, Any]:
    """The job succeeded with one result per instance, each stored once."""
    status = wait(client, job_id, timeout=40)
    assert status["status"] == "succeeded", f"{status}\n{s.worker_log()}"
    assert [r["index"] for r in lines(client, job_id)] == list(range(total))
    assert status["progress"]["done"] == total
    assert status["summary"]["errors"] == 0, lines(client, job_id)[0]
    return status


def test_postgres_stopped_mid_job(setup: Setup, postgres: PrivatePostgres) -> None:
    """The worker's writes fail for 15 s: the chunk keeps its results and retries for
    JOB_STORE_RETRY_S, then goes back to the queue (not acknowledged as done); the API answers
    503 job_store_unavailable meanwhile and readiness's check says so."""
    setup.worker(JOB_STORE_RETRY_S="2")
    body = audit(rows=60, budget=6000, chunk=10)
    with setup.client() as client:
        job_id = client.post("/v2/jobs", json=body).json()["id"]
        progress(client, job_id, 10, 30, setup)
        postgres.stop()
        try:
            time.sleep(1)
            r = client.get(f"/v2/jobs/{job_id}")
            assert r.status_code == 503 and r.json()["code"] == "job_store_unavailable", r.text
            assert r.headers["retry-after"] == "5"
            assert client.get("/v2/jobs").status_code == 503
            assert client.post("/v2/jobs", json=body).status_code == 503
            assert store_health(client.app.state.jobs)["ok"] is False  # type: ignore[attr-defined]
            ready = client.get("/v2/health/ready").json()
            assert ready["status"] == "degraded" and ready["jobs"]["ok"] is False, ready
            time.sleep(14)
        finally:
            postgres.start()  # always: the module's other tests use it
        assert store_health(client.app.state.jobs) == {"ok": True}  # type: ignore[attr-defined]
        assert client.get("/v2/health/ready").json()["jobs"] == {"ok": True}
        finished_once(client, job_id, 60, setup)


def test_redis_down_at_submit(setup: Setup) -> None:
    """503 with Retry-After and the job's id; the stored job runs once the broker is back, and
    the same Idempotency-Key returns it."""
    setup.wait_ready(setup.worker())  # connected: it has to find the broker again
    body = audit(rows=20, budget=6000, chunk=10)
    key = {"Idempotency-Key": "faults-redis-down"}
    with setup.client() as client:
        setup.redis.stop()
        try:
            r = client.post("/v2/jobs", json=body, headers=key)
        finally:
            setup.redis.start()  # the same port
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "job_queue_unavailable" and r.headers["retry-after"]
        job_id = r.json()["detail"]["id"]
        again = client.post("/v2/jobs", json=body, headers=key)
        assert again.status_code == 202 and again.json()["id"] == job_id
        assert again.headers["idempotent-replayed"] == "true"
        finished_once(client, job_id, 20, setup)


def holder(s: Setup, job_id: str, other_than: str | None, timeout: float = 90) -> str:
    """The holder ("<pid>-<random>") of chunk 0 once it has one other than `other_than`."""
    deadline = time.monotonic() + timeout
    query = "SELECT holder FROM job_chunks WHERE job_id = %s AND idx = 0"
    with psycopg.connect(s.database_url.replace("+psycopg", ""), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query, (job_id,)).fetchone()
            if row is not None and row[0] is not None and row[0] != other_than:
                return str(row[0])
            time.sleep(0.05)
    raise AssertionError(f"chunk 0 has no new holder:\n{s.worker_log()}")


def kill_holder(s: Setup, token: str) -> None:
    """SIGKILL the worker process that holds the chunk (as a crash would end it)."""
    pid = int(token.split("-")[0])
    proc = next(w for w in s.workers if w.pid == pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_worker_killed_mid_chunk(setup: Setup) -> None:
    """The worker running a chunk is killed (SIGKILL) inside it, after its first write; the
    other worker's sweeper finds the chunk's lapsed lease and queues it again."""
    for _ in range(2):
        setup.worker()
    body = audit(rows=40, budget=6000, chunk=20)
    with setup.client() as client:
        job_id = client.post("/v2/jobs", json=body).json()["id"]
        token = holder(setup, job_id, None)
        progress(client, job_id, 10, 40, setup)  # chunk 0 or 1 has written once
        kill_holder(setup, token)
        finished_once(client, job_id, 40, setup)


def test_a_chunk_that_kills_its_worker_fails_the_job(setup: Setup) -> None:
    """A chunk whose worker dies each time (as one whose model crashes the process would) is
    tried JOB_MAX_ATTEMPTS times; then the job fails with that message and no worker runs it
    again (no crash loop)."""
    for _ in range(3):
        setup.worker(JOB_MAX_ATTEMPTS="2")
    body = audit(rows=40, budget=20000, chunk=40)
    with setup.client() as client:
        job_id = client.post("/v2/jobs", json=body).json()["id"]
        token = None
        for _ in range(2):  # each attempt dies as soon as it holds the chunk
            token = holder(setup, job_id, token)
            kill_holder(setup, token)
        status = wait(client, job_id, timeout=30)
        assert status["status"] == "failed", f"{status}\n{setup.worker_log()}"
        assert status["error"] == f"chunk 0 failed 2 times; the last: {LOST}"
        assert status["progress"]["done"] < 40
        assert sum(w.poll() is None for w in setup.workers) == 1  # the third one lives on


def test_a_broker_restart_loses_no_job(setup: Setup) -> None:
    """Redis restarts without persistence while a worker runs chunk 0 and the other chunks wait
    in it: their messages are gone. The worker's sweeper sees the broker's new run_id and
    queues them again at once, though JOB_VISIBILITY_TIMEOUT_S (300 s here) has not passed:
    the job finishes within a minute of the broker coming back, each row stored once."""
    proc = setup.worker(JOB_VISIBILITY_TIMEOUT_S="300")
    setup.wait_ready(proc)
    body = audit(rows=40, budget=6000, chunk=8)
    with setup.client() as client:
        job_id = client.post("/v2/jobs", json=body).json()["id"]
        holder(setup, job_id, None)  # chunk 0 runs; chunks 1-4 wait in Redis
        setup.redis.stop()
        setup.redis.start()  # the same port, empty
        back = time.monotonic()
        deadline = back + 60
        while (status := client.get(f"/v2/jobs/{job_id}").json())["status"] != "succeeded":
            assert time.monotonic() < deadline, f"{status}\n{setup.worker_log()}"
            time.sleep(0.2)
        assert [r["index"] for r in lines(client, job_id)] == list(range(40))
        assert status["progress"]["done"] == 40
        assert "the broker restarted" in setup.worker_log()
