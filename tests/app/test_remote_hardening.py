"""Remote models without leaks (issue 27): credentials out of the URL and out of answers and
logs, the REMOTE_MODEL_HOSTS allow-list, remote error bodies for admin keys only, a total
deadline per request, /infer 502, and answers re-explained when the remote changes.

Real servers throughout: the service as a process (its logs captured) or in a TestClient, and
a real OIP server in a thread (tests/peers/oip_server.py) that requires Basic auth, fails, trickles.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.auth import digest
from app.main import create_app
from app.settings import Settings
from models.adapters.remote import RemoteClient, RemoteModelError, configure
from models.adapters.remote_http import HostPolicy
from models.registry import ModelRegistry
from tests.conftest import ROOT, free_port
from tests.peers.oip_server import SECRET_BODY, PeerState, oip_peer

pytestmark = pytest.mark.slow

USER, PASSWORD = "svcuser", "S3cretPass"
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
ADMIN, READER = {"X-API-Key": "admin-key-h5"}, {"X-API-Key": "explain-key-h5"}
ROW = [1.0, 2.0, 3.0]
APP = [sys.executable, "-m", "app", "--host", "127.0.0.1"]
EXACT = {"estimator": "exact", "masker": {"type": "baseline", "value": [0.0, 0.0, 0.0]}}


@pytest.fixture(autouse=True, scope="module")
def restore_remote_config() -> Iterator[None]:
    previous = configure(None)  # registrations below configure from their app's settings
    yield
    configure(previous)


def form(url: str, name: str = "peer-m", **extra: str) -> dict[str, str]:
    return {
        "name": name,
        "modality": "tabular",
        "input_shape": "[3]",
        "output_names": '["y"]',
        "feature_names": '["a", "b", "c"]',
        "task": "regression",
        "remote_url": url,
        **extra,
    }


def infer_body(rows: list[list[float]]) -> dict[str, Any]:
    flat = [v for r in rows for v in r]
    shape = [len(rows), 3]
    return {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": flat}]}


# Not make_client: a client per `with`, stopped at its end: each test compares apps with different
# REMOTE_* settings one after another; make_client's clients stay started until the module ends
@contextmanager
def app(model_dir: Path, tmp: Path, **overrides: Any) -> Iterator[TestClient]:
    values: dict[str, Any] = {
        "model_dir": model_dir,
        "user_model_dir": tmp / "user",
        "redis_url": None,
        "database_url": f"sqlite:///{tmp / 'jobs.db'}",
        "load_models_on_start": False,
        "remote_model_hosts": "127.0.0.1",
        **overrides,
    }
    with TestClient(create_app(Settings(**values), ModelRegistry(model_dir))) as client:
        yield client


@contextmanager
def service_process(env: dict[str, str], log: Path) -> Iterator[str]:
    """`python -m app` at log level info, its stdout and stderr written to `log`."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | env
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*APP, "--port", str(port), "--log-level", "info"],
            cwd=ROOT,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v2/health/live", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < end, "server not ready in 120 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_credentials_never_leak_to_answers_metadata_or_logs(
    model_dir: Path, tmp_path: Path
) -> None:
    keys = [
        {"name": "ops", "sha256": digest(ADMIN["X-API-Key"]).hex(), "scopes": ["admin"]},
        {"name": "reader", "sha256": digest(READER["X-API-Key"]).hex(), "scopes": ["explain"]},
    ]
    env = {
        "API_KEYS": json.dumps(keys),
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp_path / "user"),
        "LOAD_MODELS_ON_START": "false",
        "REMOTE_MODEL_HOSTS": "127.0.0.1",
    }
    log = tmp_path / "service.log"
    answers: list[str] = []
    peer_state = PeerState(user=USER, password=PASSWORD)
    with oip_peer(peer_state) as peer, service_process(env, log) as url:
        wrong = httpx.post(
            f"{url}/v2/repository/models",
            data=form(peer.model_url(f"{USER}:wrong"), name="wrong"),
            headers=ADMIN,
        )
        assert wrong.status_code == 400 and "401" in wrong.json()["error"], wrong.text
        r = httpx.post(
            f"{url}/v2/repository/models",
            # shared: the reader key below uses another key's model (issue 39)
            data={**form(peer.model_url(f"{USER}:{PASSWORD}")), "shared": "true"},
            headers=ADMIN,
            timeout=30,
        )
        assert r.status_code == 201, r.text
        meta = httpx.get(f"{url}/v2/models/peer-m", headers=READER)
        assert meta.json()["info"]["url"] == peer.model_url()  # no userinfo
        ok = httpx.post(f"{url}/v2/models/peer-m/infer", json=infer_body([ROW]), headers=READER)
        assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [6.0], ok.text
        assert f"Basic {TOKEN}" in peer.state.auth_seen  # sent as a header
        peer.state.mode = "fail500"
        failed = httpx.post(f"{url}/v2/models/peer-m/infer", json=infer_body([ROW]), headers=READER)
        assert failed.status_code == 502, failed.text
        assert failed.json()["code"] == "remote_model_error"
        assert "HTTP 500" in failed.json()["error"] and "detail" not in failed.json()
        explain = httpx.post(
            f"{url}/v2/models/peer-m/explain/shapley",
            json={"inputs": [ROW], "parameters": EXACT},
            headers=READER,
            timeout=30,
        )
        assert explain.status_code == 502 and explain.json()["code"] == "remote_model_error"
        admin = httpx.post(f"{url}/v2/models/peer-m/infer", json=infer_body([ROW]), headers=ADMIN)
        assert admin.status_code == 502
        assert SECRET_BODY in admin.json()["detail"]["remote"]  # the remote's body: admins
        answers += [wrong.text, r.text, meta.text, ok.text, failed.text, explain.text]
        answers.append(httpx.get(f"{url}/v2/models", headers=READER).text)
    for text in answers:
        assert PASSWORD not in text and TOKEN not in text and SECRET_BODY not in text, text
    logged = log.read_text()
    assert "/v2/models/peer-m/infer" in logged  # the access log was captured
    assert PASSWORD not in logged and TOKEN not in logged, logged[-3000:]
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        (stored,) = db.execute("SELECT meta FROM registered_models WHERE name='peer-m'").fetchone()
    assert json.loads(stored)["remote_url"] == peer.model_url() and "remote_auth" in stored


def test_explicit_headers_are_sent_and_checked(model_dir: Path, tmp_path: Path) -> None:
    with oip_peer(PeerState(user=USER, password=PASSWORD)) as peer, app(model_dir, tmp_path) as c:
        header = json.dumps({"Authorization": f"Basic {TOKEN}"})
        r = c.post("/v2/repository/models", data=form(peer.model_url(), remote_headers=header))
        assert r.status_code == 201, r.text
        assert TOKEN not in r.text and TOKEN not in c.get("/v2/models/peer-m").text
        for bad in ['["x"]', '{"Host": "evil"}', '{"X-A": "a\\r\\nB: c"}', "{"]:
            r = c.post("/v2/repository/models", data=form(peer.model_url(), remote_headers=bad))
            assert r.status_code == 400 and "remote_headers" in r.json()["error"], r.text


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/v2/models/m",
        "http://localhost:{port}/v2/models/m",
        "http://[::1]:{port}/v2/models/m",
        "http://169.254.169.254/v2/models/m",  # cloud metadata
        "http://10.1.2.3/v2/models/m",
        "http://0.0.0.0:{port}/v2/models/m",
    ],
)
def test_hosts_outside_the_allow_list_are_refused(
    model_dir: Path, tmp_path: Path, url: str
) -> None:
    with oip_peer() as peer, app(model_dir, tmp_path, remote_model_hosts="") as c:
        port = peer.url.rsplit(":", 1)[1]
        r = c.post("/v2/repository/models", data=form(url.format(port=port)))
        assert r.status_code == 400 and r.json()["code"] == "remote_host_refused", r.text
        assert "REMOTE_MODEL_HOSTS" in r.json()["error"]
        assert peer.state.infers == 0 and c.get("/v2/models/peer-m").status_code == 404


def test_listed_hosts_only(model_dir: Path, tmp_path: Path) -> None:
    with oip_peer() as peer:
        port = int(peer.url.rsplit(":", 1)[1])
        with app(model_dir, tmp_path, remote_model_hosts=f"127.0.0.1:{port + 1}") as c:
            r = c.post("/v2/repository/models", data=form(peer.model_url()))
            assert r.status_code == 400 and r.json()["code"] == "remote_host_refused"
        with app(model_dir, tmp_path, remote_model_hosts=f"example.org, 127.0.0.1:{port}") as c:
            r = c.post("/v2/repository/models", data=form(peer.model_url()))
            assert r.status_code == 201, r.text
        # Checked at every connection, on the addresses connected to: a client whose policy
        # no longer lists the host sends nothing.
        refused = RemoteClient(peer.model_url(), 5.0, policy=HostPolicy(""))
        before = peer.state.infers
        with pytest.raises(RemoteModelError, match="not allowed") as caught:
            refused(np.ones((1, 3), np.float32))
        assert "loopback" in (caught.value.remote_detail or "")
        assert peer.state.infers == before  # nothing was sent
        local = f"http://localhost:{port}/v2/models/m"  # listed by name: any address it has
        named = RemoteClient(local, 5.0, policy=HostPolicy("localhost"))
        assert named(np.ones((1, 3), np.float32)).tolist() == [[3.0]]
    policy = HostPolicy("*.svc.local:8080, 10.0.0.0/8")
    assert policy._listed("a.svc.local", 8080, []) and not policy._listed("a.svc.local", 80, [])
    assert policy._listed("x", 1, [ipaddress.ip_address("10.2.3.4")])


@pytest.mark.parametrize("mode", ["trickle", "trickle_headers"])
def test_a_trickling_remote_is_cut_at_the_total_deadline(mode: str) -> None:
    with oip_peer(PeerState(mode=mode, trickle_s=0.25)) as peer:
        client = RemoteClient(peer.model_url(), 1.5)  # each byte alone arrives well within
        start = time.monotonic()
        with pytest.raises(RemoteModelError, match=r"did not answer within 1.5 s"):
            client(np.ones((2, 3), np.float32))
        elapsed = time.monotonic() - start
        client.close()
    assert 1.4 <= elapsed < 2.5, elapsed


@pytest.mark.parametrize("mode", ["deep", "bigint"])
def test_hostile_answers_are_remote_errors(mode: str) -> None:
    with (
        oip_peer(PeerState(mode=mode)) as peer,
        pytest.raises(RemoteModelError, match=r"answered non-JSON"),  # a 502, not a 500
    ):
        RemoteClient(peer.model_url(), 5.0)(np.ones((1, 3), np.float32))


def test_infer_on_a_failing_or_trickling_remote_is_502(model_dir: Path, tmp_path: Path) -> None:
    with (
        oip_peer(PeerState(trickle_s=0.25)) as peer,
        app(model_dir, tmp_path, remote_call_timeout_s=1.5) as c,
    ):
        assert c.post("/v2/repository/models", data=form(peer.model_url())).status_code == 201
        peer.state.mode = "trickle"
        start = time.monotonic()
        r = c.post("/v2/models/peer-m/infer", json=infer_body([ROW]))
        assert r.status_code == 502 and r.json()["code"] == "remote_model_error", r.text
        assert "did not answer within 1.5 s" in r.json()["error"]
        assert time.monotonic() - start < 3.0
        peer.state.mode = "fail500"
        r = c.post("/v2/models/peer-m/infer", json=infer_body([ROW]))
        assert r.status_code == 502 and "HTTP 500" in r.json()["error"], r.text
        assert SECRET_BODY in r.json()["detail"]["remote"]  # an open service: every key admin


def _explain(c: TestClient) -> tuple[list[float], str]:
    r = c.post("/v2/models/peer-m/explain/shapley", json={"inputs": [ROW], "parameters": EXACT})
    assert r.status_code == 200, r.text
    return r.json()["data"]["explanations"][0]["values"], r.json()["meta"]["cache"]


def test_a_changed_remote_is_explained_again(model_dir: Path, tmp_path: Path) -> None:
    with oip_peer() as peer, app(model_dir, tmp_path, remote_version_check_s=0) as c:
        assert c.post("/v2/repository/models", data=form(peer.model_url())).status_code == 201
        values, cache = _explain(c)
        np.testing.assert_allclose(values, ROW, atol=1e-5)
        assert cache == "miss" and _explain(c)[1] == "hit"
        peer.state.scale, peer.state.version = 2.0, "2"  # a new model behind the same URL
        values, cache = _explain(c)
        assert cache == "miss"
        np.testing.assert_allclose(values, [2.0, 4.0, 6.0], atol=1e-5)
        assert _explain(c)[1] == "hit"


def test_cached_answers_of_remote_models_expire(model_dir: Path, tmp_path: Path) -> None:
    ttl = 3.0
    with oip_peer() as peer, app(model_dir, tmp_path, remote_cache_ttl_s=ttl) as c:
        assert c.post("/v2/repository/models", data=form(peer.model_url())).status_code == 201
        assert c.get("/v2/models/peer-m").json()["info"]["cache_ttl_s"] == ttl
        time.sleep(ttl - time.time() % ttl + 0.05)  # the start of a period
        assert _explain(c)[1] == "miss" and _explain(c)[1] == "hit"
        peer.state.scale = 3.0  # same metadata: the cached answer until it expires
        np.testing.assert_allclose(_explain(c)[0], ROW, atol=1e-5)
        time.sleep(ttl - time.time() % ttl + 0.05)
        values, cache = _explain(c)
        assert cache == "miss"
        np.testing.assert_allclose(values, [3.0, 6.0, 9.0], atol=1e-5)
