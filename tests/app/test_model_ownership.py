"""Models belong to the key that registered them (issue 39): another key (admins aside) neither
lists, reads, explains nor infers an unshared model (404, as if unknown); a shared one every
key may use; background rows go to the owner (and admins) only; no other key, admin or not,
replaces or deletes it (409); registrations, replacements and deletes are logged with the key.
Keys as API_KEYS configures them; a real sandboxed TorchScript model."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.auth import digest
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.sandbox_models import form, mlp, scripted_bytes

KEYS = {"ann": ["admin"], "ben": ["admin"], "dee": ["explain"]}
SECRET = {name: f"owner-{name}-{uuid.uuid4().hex}" for name in KEYS}


def h(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRET[name]}"}


@pytest.fixture()
def client(model_dir: Path, registry: ModelRegistry, tmp_path: Path) -> Iterator[TestClient]:
    keys = [{"name": n, "sha256": digest(SECRET[n]).hex(), "scopes": s} for n, s in KEYS.items()]
    settings = Settings(
        model_dir=model_dir,
        api_keys=json.dumps(keys),
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        user_model_dir=tmp_path / "user",
        redis_url=None,
        job_queue="inprocess",
    )
    with TestClient(create_app(settings, registry)) as c:
        yield c


def register(client: TestClient, who: str, name: str, seed: int = 0, **extra: str) -> int:
    background = "f0,f1,f2\n0.5,0.25,-1.0\n1.5,-0.5,2.0\n"
    files = {
        "file": ("m.pt", scripted_bytes(mlp(seed))),
        "background": ("bg.csv", io.BytesIO(background.encode())),
    }
    r = client.post("/v2/repository/models", data={**form(name), **extra}, files=files,
                    headers=h(who))  # fmt: skip
    return r.status_code


def explain(client: TestClient, who: str, name: str) -> int:
    body = {"inputs": [[0.1, 0.2, 0.3]], "seed": 0}
    return client.post(f"/v2/models/{name}/explain/shapley", json=body, headers=h(who)).status_code


def test_a_model_is_its_owners(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.repository")
    assert register(client, "ann", "ann-private") == 201
    assert register(client, "ann", "ann-shared", shared="true") == 201
    # another non-admin key: the private model does not exist for it
    assert explain(client, "dee", "ann-private") == 404
    r = client.get("/v2/models/ann-private", headers=h("dee"))
    assert r.status_code == 404 and r.json()["code"] == "unknown_model"
    tensor = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.1, 0.2, 0.3]}
    infer = client.post("/v2/models/ann-private/infer", json={"inputs": [tensor]}, headers=h("dee"))
    assert infer.status_code == 404
    listed = {m["name"] for m in client.get("/v2/models", headers=h("dee")).json()}
    assert "ann-shared" in listed and "ann-private" not in listed
    # the shared model: every key explains it; its background rows stay the owner's
    assert explain(client, "dee", "ann-shared") == 200
    r = client.get("/v2/models/ann-shared/examples", headers=h("dee"))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    rows = client.get("/v2/models/ann-shared/examples", headers=h("ann")).json()["instances"]
    np.testing.assert_allclose(rows, [[0.5, 0.25, -1.0], [1.5, -0.5, 2.0]])
    # an admin sees every model, but cannot replace or delete another key's
    assert explain(client, "ben", "ann-private") == 200
    before = client.get("/v2/models/ann-private", headers=h("ann")).json()
    assert register(client, "ben", "ann-private", seed=1) == 409
    r = client.delete("/v2/repository/models/ann-private", headers=h("ben"))
    assert r.status_code == 409 and r.json()["code"] == "owned_by_another_key"
    assert client.get("/v2/models/ann-private", headers=h("ann")).json() == before
    # the owner replaces (a new version) and deletes
    assert register(client, "ann", "ann-private", seed=1) == 201
    after = client.get("/v2/models/ann-private", headers=h("ann")).json()
    assert after["versions"] != before["versions"]
    assert client.delete("/v2/repository/models/ann-private", headers=h("ann")).status_code == 204
    assert explain(client, "ann", "ann-private") == 404
    logged = [r.getMessage() for r in caplog.records if r.name == "app.repository"]
    assert "model ann-private registered by key ann" in logged[0]
    assert any("model ann-private replaced by key ann" in line for line in logged)
    assert any(line == "model ann-private deleted by key ann" for line in logged)
