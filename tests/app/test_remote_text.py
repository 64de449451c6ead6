"""Remote OIP text models: this service itself, a real server process, serves sentiment-minilm
(its OIP infer reads a BYTES tensor of strings); a second app registers it with remote_url and
modality text. Word Shapley values through the endpoint equal the local model's exact ones;
token players, numbers and tabular endpoints are 4xx; refused registrations store nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from explainers.shapley.explainer import ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from tests.conftest import running_server

pytestmark = pytest.mark.slow

SENTENCE = "a truly wonderful and moving film"
LABELS = ["negative", "positive"]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("remote-text-server")
    env = {
        "REDIS_URL": None,
        "MODEL_DIR": str(model_dir),
        "JOB_QUEUE": "inprocess",
        "DATABASE_URL": f"sqlite:///{tmp / 'jobs.db'}",
        "USER_MODEL_DIR": str(tmp / "user"),
    }
    with running_server(env) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str, make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(remote_model_hosts="127.0.0.1")  # the remote server listens on loopback


def form(server: str, name: str = "remote-sentiment", **extra: str) -> dict[str, str]:
    return {
        "name": name,
        "modality": "text",
        "remote_url": f"{server}/v2/models/sentiment-minilm",
        "remote_output": "output",
        "output_names": json.dumps(LABELS),
        **extra,
    }


def stored(client: TestClient) -> set[str]:
    app: Any = client.app
    return set(app.state.user_models.current())


@pytest.fixture(scope="module")
def remote(client: TestClient, server: str) -> dict[str, Any]:
    r = client.post("/v2/repository/models", data=form(server))
    assert r.status_code == 201, r.text
    return dict(r.json())


def post(client: TestClient, url: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(url, json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_registers_as_a_text_black_box(client: TestClient, remote: dict[str, Any]) -> None:
    meta = client.get("/v2/models/remote-sentiment").json()
    assert meta["modality"] == "text" and meta["task"] == "classification"
    assert meta["platform"] == "remote" and meta["output_names"] == LABELS
    assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
    assert "shapley" in meta["explainers"] and "integrated-gradients" not in meta["explainers"]
    assert not meta["capabilities"]["differentiable"]


def test_word_shapley_equals_the_local_models_exact_values(
    client: TestClient, remote: dict[str, Any], text_model: Any
) -> None:
    body = {"inputs": [SENTENCE], "target": "positive", "budget": 64}
    out = post(client, "/v2/models/remote-sentiment/explain/shapley", body)
    e = out["data"]["explanations"][0]
    assert e["exact"] and [p["text"] for p in e["players"]] == SENTENCE.split()
    local = shapley_explain(
        text_model, np.array([SENTENCE]), options=ShapleyOptions(estimator="exact"), target=1
    ).explanations[0]
    np.testing.assert_allclose(e["values"], local.values, atol=1e-6)
    np.testing.assert_allclose(e["base_value"], local.base_value, atol=1e-6)
    assert np.abs(local.values).max() > 1e-2  # the values are not all ~0


def test_infer_subset_and_refused_requests(
    client: TestClient, remote: dict[str, Any], text_model: Any
) -> None:
    url = "/v2/models/remote-sentiment"
    texts = [SENTENCE, "The plot made no sense."]
    infer = {"inputs": [{"name": "input", "shape": [2], "datatype": "BYTES", "data": texts}]}
    got = post(client, f"{url}/infer", infer)["outputs"][0]["data"]
    np.testing.assert_allclose(np.reshape(got, (2, 2)), text_model.predict(texts), atol=1e-6)
    post(client, f"{url}/explain/sufficient-subset", {"inputs": [SENTENCE]})
    tokens = {"inputs": [SENTENCE], "parameters": {"players": "tokens"}}
    bad = post(client, f"{url}/explain/shapley", tokens, status=400)
    assert "tokenizer" in bad["error"] and "words" in bad["error"]
    bad = post(client, f"{url}/explain/shapley", {"inputs": [[1.5, 2.0]]}, status=400)
    assert "string" in bad["error"]


def test_refused_registrations_store_nothing(client: TestClient, server: str) -> None:
    before = stored(client)
    cases: list[tuple[dict[str, str | None], str]] = [
        ({"output_names": None}, "send output_names"),
        ({"input_shape": "[3]"}, "leave out input_shape"),
        ({"remote_url": f"{server}/v2/models/diabetes-mlp"}, "no BYTES input"),
    ]
    for change, message in cases:
        data = {k: v for k, v in {**form(server, "refused"), **change}.items() if v is not None}
        r = client.post("/v2/repository/models", data=data)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"], r.text
    r = client.post(
        "/v2/repository/models",
        data=form(server, "refused"),
        files={"background": ("bg.csv", b"x\n1\n")},
    )
    assert r.status_code == 400 and "background" in r.json()["error"]
    assert stored(client) == before
    assert client.get("/v2/models/refused").status_code == 404
