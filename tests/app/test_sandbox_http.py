"""Model workers over HTTP: a booster that crashes its loader is a 400 naming the signal; one
that crashes at inference is a 502 while the service, its health route and other models keep
answering and the next request restarts the worker (after repeated crashes a 503 with
Retry-After until its backoff ends); a memory limit hit is a 502; a real server
process leaves no worker behind when it stops."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from models.sandbox import configure, current_config
from models.sandbox.proxy import worker_group
from tests.conftest import running_server
from tests.sandbox_models import (
    Hungry,
    Slow,
    form,
    mlp,
    poisoned_xgboost,
    scripted_bytes,
    truncated_lightgbm,
)


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> Iterator[TestClient]:
    c = make_client()  # create_app configures the sandbox from the settings ...
    before = current_config()
    # ... then the upload checks that would refuse the malformed boosters go off, so they meet
    # the sandbox.
    configure(replace(before, skip_file_checks=True))
    yield c
    configure(before)


def _register(client: TestClient, fields: dict[str, str], data: bytes) -> httpx.Response:
    return client.post("/v2/repository/models", data=fields, files={"file": ("m.bin", data)})


def _explain(client: TestClient, name: str, row: np.ndarray) -> httpx.Response:
    body = {"inputs": [np.asarray(row, dtype=float).tolist()], "seed": 0}
    return client.post(f"/v2/models/{name}/explain/shapley", json=body)


def _infer(client: TestClient, name: str, row: np.ndarray) -> httpx.Response:
    data = [float(v) for v in row]
    tensor = {"name": "x", "shape": [1, len(data)], "datatype": "FP64", "data": data}
    return client.post(f"/v2/models/{name}/infer", json={"inputs": [tensor]})


def test_a_booster_that_crashes_its_loader_is_a_400_naming_it(client: TestClient) -> None:
    data, fields = truncated_lightgbm()
    r = _register(client, {**fields, "format": "lightgbm"}, data)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_model" and "crashed (SIG" in body["error"]
    assert client.get("/v2/health/live").status_code == 200


def test_a_crash_at_inference_is_a_502_and_the_rest_keeps_answering(client: TestClient) -> None:
    data, fields, crash, safe = poisoned_xgboost()
    assert _register(client, fields, data).status_code == 201
    other = form("sandbox-other")
    assert _register(client, other, scripted_bytes(mlp())).status_code == 201
    assert _infer(client, "xgb-poisoned", safe).status_code == 200
    r = _explain(client, "xgb-poisoned", crash)
    assert r.status_code == 502, r.text
    body: dict[str, Any] = r.json()
    assert body["code"] == "model_worker_failed"
    assert "xgb-poisoned's worker crashed (SIGSEGV)" in body["error"]
    assert client.get("/v2/health/live").status_code == 200
    assert _explain(client, "sandbox-other", np.zeros(3)).status_code == 200
    r = _infer(client, "xgb-poisoned", crash)
    assert r.status_code == 502 and r.json()["code"] == "model_worker_failed", r.text
    backoff = _infer(client, "xgb-poisoned", safe)  # two crashes in a row: a backoff
    assert backoff.status_code == 503 and "restarts in 1.0 s" in backoff.json()["error"]
    assert backoff.json()["code"] == "model_worker_restarting"
    assert backoff.headers["retry-after"] == "1"
    time.sleep(1.1)
    again = _infer(client, "xgb-poisoned", safe)  # a new worker answers
    assert again.status_code == 200, again.text


def test_a_memory_limit_hit_is_a_502_then_the_worker_restarts(client: TestClient) -> None:
    assert _register(client, form("sandbox-hungry"), scripted_bytes(Hungry())).status_code == 201
    r = client.post(
        "/v2/models/sandbox-hungry/infer",
        json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 0, 0]}]},
    )
    assert r.status_code == 502 and "ran out of memory" in r.json()["error"], r.text
    assert _explain(client, "sandbox-hungry", np.zeros(3)).status_code == 200


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_stopped_server_leaves_no_worker_processes(model_dir: Path, tmp_path: Path) -> None:
    env = {
        "REDIS_URL": None,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp_path / "user"),
    }
    with running_server(env) as url, httpx.Client(base_url=url, timeout=120) as http:
        files = {"file": ("m.pt", scripted_bytes(mlp()))}
        r = http.post("/v2/repository/models", data=form("sandbox-exit"), files=files)
        assert r.status_code == 201, r.text
        server = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _listens(int(p), url))
        # the zygote (forkserver) and the model's worker, grandchild of the server
        workers = _descendants(server)
        assert any("forkserver" in _cmdline(p) for p in workers), workers
        assert len(workers) >= 2, "the server started no worker process"
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _listens(pid: int, url: str) -> bool:
    port = url.rsplit(":", 1)[1]
    line = _cmdline(pid)
    return "-m app" in line and f"--port {port}" in line


def test_killing_a_worker_mid_call_is_a_502_naming_the_signal(client: TestClient) -> None:
    """SIGKILL from outside (the kernel's OOM killer's signal) while the worker computes."""
    assert _register(client, form("sandbox-slow"), scripted_bytes(Slow())).status_code == 201
    registry = client.app.state.service.registry  # type: ignore[attr-defined]
    group = worker_group(registry.get("sandbox-slow"))
    assert group is not None
    answers: list[httpx.Response] = []
    row = np.array([1.0, 0.0, 0.0])  # over 0.5: minutes of compute
    call = threading.Thread(target=lambda: answers.append(_infer(client, "sandbox-slow", row)))
    call.start()
    time.sleep(3.0)
    for pid in group.pids():
        os.kill(pid, signal.SIGKILL)
    call.join(60)
    assert answers and answers[0].status_code == 502
    assert "crashed (SIGKILL)" in answers[0].json()["error"]
    assert _explain(client, "sandbox-slow", np.zeros(3)).status_code == 200
    assert json.loads(json.dumps(group.sandbox))["network"] == "isolated"


def test_an_audit_on_a_crashing_model_fails_with_the_crash_and_the_service_stays_up(
    client: TestClient,
) -> None:
    """A job whose model crashes on one of its rows: each attempt of that chunk is a crashed
    worker, and after JOB_MAX_ATTEMPTS the job fails with the worker's message (no crash loop);
    the service and the model's other rows keep answering."""
    data, fields, crash, safe = poisoned_xgboost()
    fields = {**fields, "name": "xgb-poisoned-audit"}
    assert _register(client, fields, data).status_code == 201
    rows = [safe.tolist(), crash.tolist(), safe.tolist()]
    r = client.post("/v2/jobs", json={"model": "xgb-poisoned-audit", "inputs": rows})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 120
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            break
        time.sleep(0.3)
    assert status["status"] == "failed", status
    assert "xgb-poisoned-audit's worker crashed (SIGSEGV)" in status["error"], status["error"]
    assert status["error"].startswith("chunk 0 failed 3 times"), status["error"]  # JOB_MAX_ATTEMPTS
    assert client.get("/v2/health/live").status_code == 200
    # past the restart backoff (it grows with each crash in a row): a new worker serves the
    # safe rows; meanwhile the answers are 503s with Retry-After
    answers = []
    for _ in range(40):
        answers.append(_infer(client, "xgb-poisoned-audit", safe))
        if answers[-1].status_code != 503:
            break
        assert "restarts in" in answers[-1].json()["error"]
        assert int(answers[-1].headers["retry-after"]) >= 1
        time.sleep(0.5)
    assert answers[-1].status_code == 200, answers[-1].text
