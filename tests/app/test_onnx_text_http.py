"""ONNX text classifiers over HTTP: a .zip of model.onnx + tokenizer.json registers with a name
and a file (sniffed from its model.onnx member); word and token Shapley values equal the
safetensors checkpoint's; a folder without tokenizer.json is a 400 that stores nothing."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.models import hf_fixtures as fx
from tests.models import onnx_text_fixtures as ofx

SENTENCE = "a truly wonderful and moving film"


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(max_model_bytes=200 << 20)


def register(client: TestClient, name: str, data: bytes, suffix: str) -> Any:
    files = {"file": (f"{name}.{suffix}", data)}
    return client.post("/v2/repository/models", data={"name": name}, files=files)


def shapley(client: TestClient, name: str, players: str) -> dict[str, Any]:
    body = {"inputs": [SENTENCE], "target": "positive", "parameters": {"players": players}}
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json()["data"]["explanations"][0])


def test_zip_registers_and_explains_as_the_safetensors_model(client: TestClient) -> None:
    r = register(client, "onnx-clf", ofx.archived("zip"), "zip")
    assert r.status_code == 201, r.text
    meta = r.json()
    assert meta["platform"] == "onnx" and meta["modality"] == "text"
    assert meta["output_names"] == ["negative", "positive"]
    assert "integrated-gradients" not in meta["explainers"] and "shapley" in meta["explainers"]
    # AutoGnothi reads a BERT encoder's hidden states: not listed, and a clear 400 when asked
    assert "autognothi" not in meta["explainers"]
    r = client.post("/v2/models/onnx-clf/explain/autognothi", json={"inputs": [SENTENCE]})
    assert r.status_code == 400 and r.json()["code"] == "unsupported_model", r.text
    r = register(client, "st-clf", fx.archived("classifier"), "tar.gz")
    assert r.status_code == 201, r.text
    for players in ("words", "tokens"):
        ours, theirs = shapley(client, "onnx-clf", players), shapley(client, "st-clf", players)
        assert ours["exact"] and ours["players"] == theirs["players"]
        np.testing.assert_allclose(ours["values"], theirs["values"], atol=1e-5)


def test_no_tokenizer_is_a_400_that_stores_nothing(client: TestClient, tmp_path: Path) -> None:
    app: Any = client.app
    before = set(app.state.user_models.current())
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(ofx.folder(), folder)
    (folder / "tokenizer.json").unlink()
    r = register(client, "no-tok", fx.archive(folder), "tar.gz")
    assert r.status_code == 400 and "tokenizer.json" in r.json()["error"], r.text
    assert set(app.state.user_models.current()) == before
