"""API keys: 401 without a valid key, 403 without the scope, health stays public."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from app.auth import digest

KEYS = {"reader": ["explain"], "auditor": ["jobs"], "root": ["admin"]}
ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    keys = [{"name": n, "sha256": digest(f"key-{n}").hex(), "scopes": s} for n, s in KEYS.items()]
    return make_client(api_keys=json.dumps(keys))


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{name}"}


def test_public_and_unauthenticated(client: TestClient) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    for method, path in [
        ("GET", "/v2/models"),
        ("POST", "/v2/models/diabetes-mlp/infer"),
        ("GET", "/v2/jobs"),
        ("GET", "/metrics"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 401, path
        assert r.json()["code"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    bad = client.get("/v2/models", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401


@pytest.mark.parametrize(
    ("who", "explain", "jobs", "admin"),
    [("reader", 200, 403, 403), ("auditor", 200, 200, 403), ("root", 200, 200, 200)],
)
def test_scopes(client: TestClient, who: str, explain: int, jobs: int, admin: int) -> None:
    h = auth(who)
    r = client.post("/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [ROW]}, headers=h)
    assert r.status_code == explain
    assert client.get("/v2/jobs", headers=h).status_code == jobs
    assert client.get("/metrics", headers=h).status_code == admin
    forbidden = client.delete("/v2/repository/models/nope", headers=h)
    assert forbidden.status_code == (404 if admin == 200 else 403)
    if admin != 200:
        assert forbidden.json()["code"] == "forbidden"


def test_training_needs_admin_and_x_api_key_header(client: TestClient) -> None:
    body = {"kind": "learn-baseline", "model": "diabetes-mlp", "parameters": {"iterations": 1}}
    r = client.post("/v2/jobs", json=body, headers=auth("auditor"))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = client.post("/v2/jobs", json=body, headers={"X-API-Key": "key-root"})
    assert r.status_code == 202
