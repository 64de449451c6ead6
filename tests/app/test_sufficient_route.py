"""POST /v2/models/{m}/explain/sufficient-subset over HTTP: image, tabular and text models, the
details every explanation carries, Shapley's player numbering, caching and clean 4xx."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from explainers.games.masked import patch_groups
from models.builtin.trained import dataset_split
from models.registry import ModelRegistry

KEYS = {
    "subset", "players", "class", "class_name", "probability_subset", "probability_complement",
    "probability_full", "probability_empty", "size", "n_players", "verified", "minimality",
    "search", "order", "criterion", "precision",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs."""


def post(
    client: TestClient, model: str, body: dict[str, Any], name: str = "sufficient-subset"
) -> httpx.Response:
    return client.post(f"/v2/models/{model}/explain/{name}", json=body)


def test_digits_subsets_in_shapleys_patches(client: TestClient, registry: ModelRegistry) -> None:
    assert "sufficient-subset" in client.get("/v2/models/digits-cnn").json()["explainers"]
    x = dataset_split("digits-cnn").x_test[:2]
    body = {"inputs": x.tolist(), "seed": 1}
    r = post(client, "digits-cnn", body)
    assert r.status_code == 200, r.text
    out = r.json()
    shap = post(client, "digits-cnn", {"inputs": x[:1].tolist(), "budget": 64}, "shapley").json()
    assert out["data"]["feature_names"] == shap["data"]["feature_names"]  # patch_0_0 ... 3_3
    meta = out["meta"]
    assert meta["additive"] is False and meta["parameters"]["patch_size"] == 2
    assert meta["parameters"]["masker"]["type"] == "baseline"
    model = registry.get("digits-cnn")
    groups, _ = patch_groups(model.input_shape, 2)
    for xi, e in zip(x, out["data"]["explanations"], strict=True):
        d = e["details"]
        assert set(d) >= KEYS and d["verified"] is True and d["search"] == "greedy"
        assert d["size"] == len(d["subset"]) == int(sum(e["values"]))
        assert d["players"] == [out["data"]["feature_names"][i] for i in d["subset"]]
        assert e["output_index"] == d["class"] == int(np.argmax(model.predict(xi[None])))
        p = model.predict(np.where(np.isin(groups, d["subset"]).reshape(xi.shape), xi, 0)[None])
        np.testing.assert_allclose(p[0, d["class"]], d["probability_subset"], rtol=1e-5)
        assert e["n_model_evals"] <= meta["budget"]
    again = client.post("/v2/models/digits-cnn/explain/sufficient-subset", json=body)
    assert again.json()["meta"]["cache"] == "hit"
    assert again.json()["data"] == out["data"]


def test_tabular_precision_with_the_requests_background(
    client: TestClient, registry: ModelRegistry
) -> None:
    split = dataset_split("breast-cancer-mlp")
    body = {
        "inputs": split.x_test[:1].tolist(),
        "background": split.x_train[:20].tolist(),
        "parameters": {"min_precision": 0.9, "order": "leave-one-out"},
    }
    r = post(client, "breast-cancer-mlp", body)
    assert r.status_code == 200, r.text
    e = r.json()["data"]["explanations"][0]
    d = e["details"]
    assert d["verified"] and d["minimality"] == "1-minimal" and d["precision"] >= 0.9
    model = registry.get("breast-cancer-mlp")
    rows = np.where(np.isin(np.arange(30), d["subset"]), split.x_test[0], split.x_train[:20])
    share = float(np.mean(np.argmax(model.predict(rows), axis=1) == d["class"]))
    np.testing.assert_allclose(d["precision"], share, rtol=1e-9)
    assert r.json()["meta"]["parameters"]["masker"]["source"] == "request"


def test_text_words(client: TestClient) -> None:
    r = post(client, "sentiment-minilm", {"inputs": ["the acting was terrible"]})
    assert r.status_code == 200, r.text
    e = r.json()["data"]["explanations"][0]
    d = e["details"]
    assert [p["text"] for p in e["players"]] == ["the", "acting", "was", "terrible"]
    assert d["search"] == "exact" and d["minimality"] == "minimum" and d["verified"]
    assert d["class_name"] == "negative" and d["players"] == ["terrible"]
    assert d["subset_text"] == "terrible" and e["n_model_evals"] == 2**4 + 1


def test_text_tokens_masked_like_shapley(client: TestClient) -> None:
    body = {
        "inputs": ["an unwatchable mess"],
        "parameters": {"players": "tokens", "absence": "mask"},
    }
    r = post(client, "sentiment-minilm", body)
    assert r.status_code == 200, r.text
    shap = post(client, "sentiment-minilm", body, "shapley").json()
    e = r.json()["data"]["explanations"][0]
    assert e["players"] == shap["data"]["explanations"][0]["players"]
    assert r.json()["meta"]["parameters"]["mask_token"] == "[MASK]"
    d = e["details"]
    assert d["verified"] and d["minimality"] == "minimum"
    absent = len(e["players"]) - d["size"]
    assert d["subset_text"].count("[MASK]") == absent


@pytest.mark.parametrize(
    ("model", "body", "status", "code"),
    [
        ("diabetes-mlp", {"inputs": [[0.0] * 10]}, 400, "needs_classifier"),
        ("breast-cancer-mlp", {"inputs": [[0.0] * 30], "parameters": {"bogus": 1}}, 422,
         "validation_error"),
        ("breast-cancer-mlp", {"inputs": [[0.0] * 30], "parameters": {"min_probability": 2}},
         422, "validation_error"),
        ("breast-cancer-mlp", {"inputs": [[0.0] * 30], "budget": 100}, 400, "budget_too_small"),
        ("breast-cancer-mlp", {"inputs": [[0.0] * 30], "parameters": {"players": "tokens"}},
         400, "invalid_option"),
        ("digits-cnn", {"inputs": [[[[0.0] * 8] * 8]], "parameters": {"search": "exact",
         "patch_size": 1}}, 400, "invalid_option"),
    ],
)  # fmt: skip
def test_bad_requests_are_4xx(
    client: TestClient, model: str, body: dict[str, Any], status: int, code: str
) -> None:
    r = post(client, model, body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code
