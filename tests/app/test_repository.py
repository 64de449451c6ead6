"""Model registration: TorchScript uploads and remote OIP models, versions, persistence."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
W = [1.0, -2.0, 0.5, 3.0]


def scripted(weights: list[float]) -> bytes:
    layer = torch.nn.Linear(4, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weights]))
        layer.bias.fill_(0.25)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(layer), buf)
    return buf.getvalue()


def form(name: str = "linear-user", **extra: str) -> dict[str, str]:
    return {
        "name": name,
        "modality": "tabular",
        "input_shape": "[4]",
        "output_names": '["score"]',
        "feature_names": '["a", "b", "c", "d"]',
        **extra,
    }


# Not make_client: function-scoped and restarted on the same database inside the test (persistence);
# make_client is module-scoped and its clients stay started until the module ends
@pytest.fixture()
def app_client(model_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        model_dir=model_dir,
        user_model_dir=tmp_path / "user",
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        remote_model_hosts="127.0.0.1",  # remote models on loopback servers
    )
    with TestClient(create_app(settings, ModelRegistry(model_dir))) as c:
        yield c


def test_torchscript_upload_explain_and_persist(
    app_client: TestClient, model_dir: Path, tmp_path: Path
) -> None:
    r = app_client.post("/v2/repository/models", data=form(), files={"file": ("m.pt", scripted(W))})
    assert r.status_code == 201, r.text
    meta = r.json()
    assert meta["platform"] == "torchscript" and meta["feature_names"] == ["a", "b", "c", "d"]
    x = [1.0, 2.0, 3.0, 4.0]
    body = {"inputs": [x]}
    e = app_client.post("/v2/models/linear-user/explain/shapley", json=body).json()
    explanation = e["data"]["explanations"][0]
    # No background: a zero baseline, so phi_i = w_i x_i exactly.
    np.testing.assert_allclose(explanation["values"], np.multiply(W, x), atol=1e-5)
    assert e["meta"]["parameters"]["masker"]["type"] == "baseline"
    # A new upload under the same name is a new version; the cache never serves the old one.
    r2 = app_client.post(
        "/v2/repository/models",
        data=form(),
        files={"file": ("m.pt", scripted([2.0, 0.0, 0.0, 0.0]))},
    )
    assert r2.json()["versions"] != meta["versions"]
    e2 = app_client.post("/v2/models/linear-user/explain/shapley", json=body).json()
    assert e2["meta"]["cache"] == "miss"
    np.testing.assert_allclose(e2["data"]["explanations"][0]["values"], [2.0, 0, 0, 0], atol=1e-5)
    # A restart (new app, same database) still has the model, same version.
    settings = Settings(
        model_dir=model_dir,
        user_model_dir=tmp_path / "user",
        redis_url=None,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",  # the models live there
    )
    with TestClient(create_app(settings, ModelRegistry(model_dir))) as again:
        assert again.get("/v2/models/linear-user").json()["versions"] == r2.json()["versions"]
        assert again.delete("/v2/repository/models/linear-user").status_code == 204
        assert again.get("/v2/models/linear-user").status_code == 404
    assert not (tmp_path / "user" / "linear-user").exists()


@pytest.mark.parametrize(
    ("data", "files", "status"),
    [
        (form(), None, 400),  # neither file nor remote_url
        (form(remote_url="http://127.0.0.1:1/v2/models/x"), {"file": ("m.pt", b"x")}, 400),
        (form(), {"file": ("m.pt", b"not a torchscript archive")}, 400),
        (
            form(input_shape="[5]", feature_names='["a","b","c","d","e"]'),
            {"file": ("m.pt", scripted(W))},
            400,
        ),  # the test forward pass fails
        (form(output_names='["p", "q"]'), {"file": ("m.pt", scripted(W))}, 400),
        (form(name="Bad Name"), {"file": ("m.pt", scripted(W))}, 400),
        (form(name="diabetes-mlp"), {"file": ("m.pt", scripted(W))}, 409),
        (form(input_shape="[-1]"), {"file": ("m.pt", scripted(W))}, 400),
        (form(modality="video"), {"file": ("m.pt", scripted(W))}, 400),
        ({"name": "x"}, {"file": ("m.pt", scripted(W))}, 400),  # TorchScript states no shapes
    ],
)
def test_bad_registrations(
    app_client: TestClient, data: dict[str, str], files: dict | None, status: int
) -> None:
    r = app_client.post("/v2/repository/models", data=data, files=files)
    assert r.status_code == status, r.text
    assert r.json()["code"]


def test_pickle_is_refused(app_client: TestClient) -> None:
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(4, 1), buf)  # a pickled module: never loaded
    r = app_client.post(
        "/v2/repository/models", data=form(), files={"file": ("m.pt", buf.getvalue())}
    )
    assert r.status_code == 400 and r.json()["code"] == "unsupported_format", r.text
    assert "torch.save checkpoint" in r.json()["error"]  # named, not a TorchScript parse error
    assert app_client.delete("/v2/repository/models/nope").status_code == 404
    assert app_client.delete("/v2/repository/models/diabetes-mlp").status_code == 409


def test_remote_model_matches_local(
    app_client: TestClient, inprocess_server: str, model_dir: Path
) -> None:
    local = ModelRegistry(model_dir).get("diabetes-mlp")
    names = json.dumps(list(local.feature_names))
    r = app_client.post(
        "/v2/repository/models",
        data={
            "name": "remote-diabetes",
            "modality": "tabular",
            "input_shape": "[10]",
            "output_names": '["progression"]',
            "feature_names": names,
            "remote_url": f"{inprocess_server}/v2/models/diabetes-mlp",
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["platform"] == "remote"
    row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
    baseline = {"type": "baseline", "value": local.background.mean(axis=0).tolist()}  # type: ignore[union-attr]
    body = {"inputs": [row], "parameters": {"masker": baseline}}
    remote = app_client.post("/v2/models/remote-diabetes/explain/shapley", json=body).json()
    here = app_client.post("/v2/models/diabetes-mlp/explain/shapley", json=body).json()
    np.testing.assert_allclose(
        remote["data"]["explanations"][0]["values"],
        here["data"]["explanations"][0]["values"],
        atol=1e-4,
    )
    dead = app_client.post(
        "/v2/repository/models",
        data={
            "name": "remote-dead",
            "modality": "tabular",
            "input_shape": "[10]",
            "output_names": '["y"]',
            "remote_url": f"http://127.0.0.1:{free_port()}/v2/models/x",
        },
    )
    assert dead.status_code == 400 and dead.json()["code"] == "invalid_model"
