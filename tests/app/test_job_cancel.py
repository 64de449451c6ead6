"""DELETE /v2/jobs/{id} of a running job: queued chunks don't run, a sampling explainer stops
at its next model call, and nothing is stored after the cancel (in-process queue and Celery)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.jobs.runner import CancelWatch, JobContext
from app.main import create_app
from app.settings import Settings
from explainers.games import Cancelled, check_deadline, has_deadline, stop_when
from models.registry import ModelRegistry
from tests.app.test_jobs import lines, wait
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parents[2]
ROWS = [[10.0 + 0.1 * i] * 30 for i in range(40)]
# One instance of 11 s or more (16M model rows: 160k coalitions x 100 background rows).
LONG = {"model": "breast-cancer-mlp", "inputs": [[11.11] * 30], "budget": 16_000_000}
SHORT = {"model": "diabetes-mlp", "inputs": [[50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]]}
FREED_S = 4  # a cancelled instance frees its worker within this (uncancelled: 7 s or more)
STOPPED_S = 2.0  # the model's last forward pass starts within this after the cancel


def test_stop_when_raises_at_the_next_check() -> None:
    flag = {"stop": False}
    assert not has_deadline()
    with stop_when(lambda: flag["stop"]):
        assert has_deadline()  # long rounds are cut into short model calls
        check_deadline()
        flag["stop"] = True
        with pytest.raises(Cancelled):
            check_deadline()
    check_deadline()  # outside the block nothing is watched


def running(client: TestClient, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] == "running":
            return dict(status)
        assert status["status"] == "queued", status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never started")


def cancel_interrupts_a_long_instance(client: TestClient, calls: list[float] | None = None) -> None:
    """The long instance stops mid-sampling: the one worker is free for the next job long
    before the instance could have finished, and the cancelled job stores nothing. `calls`:
    times of the model's forward passes, when this process runs them."""
    job_id = client.post("/v2/jobs", json=LONG).json()["id"]
    running(client, job_id)
    time.sleep(1.0)  # inside the sampling rounds by now
    r = client.delete(f"/v2/jobs/{job_id}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    cancelled_at = time.monotonic()
    after = wait(client, client.post("/v2/jobs", json=SHORT).json()["id"], timeout=120)
    assert after["status"] == "succeeded"
    assert time.monotonic() - cancelled_at < FREED_S, "the cancelled instance ran on"
    if calls is not None:
        assert calls and calls[0] < cancelled_at, "the instance never reached the model"
        # the next check after the cancel: one poll of the store plus one short model call
        assert calls[-1] < cancelled_at + STOPPED_S, calls[-1] - cancelled_at
    status = client.get(f"/v2/jobs/{job_id}").json()
    assert status["status"] == "cancelled" and status["progress"]["done"] == 0
    assert lines(client, job_id) == []


def test_cancel_in_process(tmp_path: Path, registry: ModelRegistry, model_dir: Path) -> None:
    settings = Settings(
        model_dir=model_dir,
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        job_workers=1,
    )
    # Not make_client: an app per test on its own database, stopped at the test's end so its
    # in-process job workers stop with it; make_client's clients stay started until the module ends
    with TestClient(create_app(settings, registry)) as client:
        # 20 chunks of 20 instances: cancel once some results are stored.
        big = {"model": "breast-cancer-mlp", "inputs": ROWS * 10, "chunk_size": 20}
        job_id = client.post("/v2/jobs", json={**big, "budget": 60000}).json()["id"]
        deadline = time.monotonic() + 120
        while client.get(f"/v2/jobs/{job_id}").json()["progress"]["done"] < 10:
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.05)
        done = client.delete(f"/v2/jobs/{job_id}").json()["progress"]["done"]
        assert 10 <= done < 400
        time.sleep(1.5)  # the running chunk stops; the queued ones return at once
        status = client.get(f"/v2/jobs/{job_id}").json()
        assert status["status"] == "cancelled" and status["progress"]["done"] == done
        assert len(lines(client, job_id)) == done
        calls: list[float] = []
        module = registry.get("breast-cancer-mlp").module
        hook = module.register_forward_hook(lambda *_: calls.append(time.monotonic()))
        try:
            cancel_interrupts_a_long_instance(client, calls)
        finally:
            hook.remove()


def test_cancel_watch_asks_the_store_sparingly(
    tmp_path: Path, registry: ModelRegistry, model_dir: Path
) -> None:
    settings = Settings(
        model_dir=model_dir,
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        job_workers=0,  # stored, never run
    )
    with TestClient(create_app(settings, registry)) as client:
        job_id = client.post("/v2/jobs", json=SHORT).json()["id"]
        state = client.app.state
        watch = CancelWatch(JobContext(state.service, state.jobs), job_id)
        assert not watch()
        client.delete(f"/v2/jobs/{job_id}")
        assert not watch()  # asked less than CANCEL_POLL_S ago: the old answer
        assert watch(fresh=True) and watch()


@pytest.fixture()
def celery_worker(
    redis_server: RedisServer, tmp_path: Path, model_dir: Path
) -> Iterator[dict[str, str]]:
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "MODEL_DIR": str(model_dir),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker", "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield env
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_cancel_with_celery(
    celery_worker: dict[str, str], registry: ModelRegistry, model_dir: Path
) -> None:
    settings = Settings(
        model_dir=model_dir,
        redis_url=celery_worker["REDIS_URL"],
        database_url=celery_worker["DATABASE_URL"],
        job_queue="celery",
    )
    with TestClient(create_app(settings, registry)) as client:
        # The worker is up once a first job finishes.
        assert wait(client, client.post("/v2/jobs", json=SHORT).json()["id"], 180)[
            "status"
        ] == "succeeded"
        cancel_interrupts_a_long_instance(client)
        # Chunks queued before the cancel don't run: 8 chunks, cancelled while the first runs.
        many = {**LONG, "inputs": [[11.0 + i] * 30 for i in range(8)], "chunk_size": 1}
        job_id = client.post("/v2/jobs", json=many).json()["id"]
        running(client, job_id)
        client.delete(f"/v2/jobs/{job_id}")
        cancelled_at = time.monotonic()
        assert wait(client, client.post("/v2/jobs", json=SHORT).json()["id"], 120)[
            "status"
        ] == "succeeded"
        assert time.monotonic() - cancelled_at < FREED_S
        assert client.get(f"/v2/jobs/{job_id}").json()["progress"]["done"] == 0
