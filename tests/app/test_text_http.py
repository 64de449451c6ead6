"""The text model through HTTP: metadata, OIP BYTES inference, shapley with words/tokens, 4xx."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models.registry import ModelRegistry

URL = "/v2/models/sentiment-minilm/explain/shapley"
TABULAR = "/v2/models/diabetes-mlp/explain/shapley"


def explain(client: TestClient, body: dict[str, Any], cache: bool = False) -> dict[str, Any]:
    headers = {} if cache else {"Cache-Control": "no-cache"}
    r = client.post(URL, json=body, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_listed_ready_and_described(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v2/models").json()}
    entry = models["sentiment-minilm"]
    assert entry["state"] == "ready" and entry["modality"] == "text" and len(entry["version"]) == 16
    assert client.get("/v2/health/ready").json()["models"]["sentiment-minilm"]["loaded"]
    meta = client.get("/v2/models/sentiment-minilm").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"][0]["shape"] == [-1, 2]
    assert meta["output_names"] == ["negative", "positive"] and meta["feature_names"] == []
    assert meta["task"] == "classification"
    assert meta["explainers"] == ["shapley", "autognothi", "sufficient-subset"]
    assert meta["background"] is None
    assert meta["info"]["check_set"]["accuracy"] >= 0.85
    shapley = next(e for e in client.get("/v2/explainers").json() if e["name"] == "shapley")
    assert "text" in shapley["modalities"]
    assert {"players", "absence"} <= set(shapley["options_schema"]["properties"])


def test_infer_bytes(client: TestClient, registry: ModelRegistry) -> None:
    texts = ["the movie was terrible", "a wonderful film"]
    body = {"inputs": [{"name": "input", "shape": [2], "datatype": "BYTES", "data": texts}]}
    r = client.post("/v2/models/sentiment-minilm/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [2, 2]
    expected = registry.get("sentiment-minilm").predict(texts)
    np.testing.assert_allclose(np.reshape(out["data"], (2, 2)), expected, atol=1e-6)
    assert np.argmax(expected, axis=1).tolist() == [0, 1]
    for bad in (
        {**body["inputs"][0], "datatype": "FP32"},
        {**body["inputs"][0], "shape": [3]},
        {**body["inputs"][0], "data": ["ok", 5]},
    ):
        r = client.post("/v2/models/sentiment-minilm/infer", json={"inputs": [bad]})
        assert r.status_code == 400 and r.json()["code"] == "invalid_input", r.text


def test_word_players_per_instance(client: TestClient, registry: ModelRegistry) -> None:
    texts = ["the movie was terrible", "What a wonderful, moving film!"]
    body = explain(client, {"inputs": texts})
    meta, data = body["meta"], body["data"]
    assert meta["exact"] and meta["additive"] and meta["budget"] == 32
    assert meta["parameters"] == {
        "estimator": "auto",
        "index": "SV",
        "sampler": "kernel",
        "players": "words",
        "absence": "delete",
        "target_se": None,
    }
    assert data["feature_names"] == [] and data["output_names"] == ["negative", "positive"]
    first, second = data["explanations"]
    assert first["data"] == texts[0] and second["data"] == texts[1]
    assert [p["text"] for p in first["players"]] == ["the", "movie", "was", "terrible"]
    assert [p["text"] for p in second["players"]] == ["What", "a", "wonderful", "moving", "film"]
    for e, text in zip((first, second), texts, strict=True):
        assert all(text[p["start"] : p["end"]] == p["text"] for p in e["players"])
        assert len(e["values"]) == len(e["players"])
        assert e["n_model_evals"] == 2 ** len(e["players"]) and e["exact"]
        assert e["approximation_error"] < 1e-9
        predicted = registry.get("sentiment-minilm").predict([text])[0]
        # a binary classifier explains its positive class by default (API.md's one rule)
        assert e["instance_output_value"] == pytest.approx(predicted[1], abs=1e-5)
    assert first["output_name"] == second["output_name"] == "positive"
    top = first["players"][int(np.argmin(first["values"]))]  # what pulls "positive" down most
    assert top == {"text": "terrible", "start": 14, "end": 22}
    assert meta["n_model_evals"] == 16 + 32


def test_k_sii_on_tokens_with_masks(client: TestClient) -> None:
    text = "an awful, boring film"
    body = explain(
        client,
        {
            "inputs": [text],
            "target": "negative",
            "parameters": {"index": "k-SII", "players": "tokens", "absence": "mask"},
        },
    )
    e = body["data"]["explanations"][0]
    assert body["meta"]["parameters"]["mask_token"] == "[MASK]"
    assert body["meta"]["parameters"]["max_order"] == 2 and body["meta"]["additive"]
    assert [p["text"] for p in e["players"]] == ["an", "awful", ",", "boring", "film"]
    inter = e["interactions"]
    assert inter["index"] == "k-SII" and len(inter["values"]) == 5 + 10 and "1,3" in inter["values"]
    assert e["values"] == [inter["values"][str(i)] for i in range(5)]
    assert e["exact"] and e["approximation_error"] < 1e-8 and e["output_name"] == "negative"


def test_sampled_estimators_and_cache(client: TestClient) -> None:
    text = "the service was slow, the room was small, but the view was lovely"
    body = {"inputs": [text], "budget": 200, "seed": 3, "parameters": {"estimator": "kernel"}}
    first = explain(client, body, cache=True)
    e = first["data"]["explanations"][0]
    assert not e["exact"] and e["n_model_evals"] <= 200 and len(e["values"]) == 13
    assert e["error_std"] is not None and e["approximation_error"] < 1e-6
    again = explain(client, body, cache=True)
    assert again["meta"]["cache"] == "hit" and again["data"] == first["data"]
    perm = explain(client, {**body, "parameters": {"estimator": "permutation"}})
    assert perm["data"]["explanations"][0]["n_model_evals"] <= 200
    other = explain(client, {**body, "inputs": [text + "!"]}, cache=True)
    assert other["meta"]["cache"] == "miss"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"inputs": [123]}, 400, "invalid_input"),
        ({"inputs": [["the", "movie"]]}, 400, "invalid_input"),
        ({"inputs": ["fine", None]}, 400, "invalid_input"),
        ({"inputs": [""]}, 400, "invalid_input"),
        ({"inputs": ["   \n"]}, 400, "invalid_input"),
        ({"inputs": ["a" * 2001]}, 400, "invalid_input"),
        ({"inputs": ["good " * 300]}, 400, "invalid_input"),  # 1500 chars, 300 tokens
        ({"inputs": ["ok\u0000"]}, 400, "invalid_input"),
        ({"inputs": ["fine"], "background": ["other text"]}, 400, "invalid_input"),
        ({"inputs": ["?!"]}, 400, "invalid_option"),
        (
            {"inputs": ["fine"], "parameters": {"masker": {"type": "baseline"}}},
            400,
            "invalid_option",
        ),
        ({"inputs": ["fine"], "parameters": {"patch_size": 4}}, 400, "invalid_option"),
        ({"inputs": ["fine"], "parameters": {"players": "chars"}}, 422, "validation_error"),
        ({"inputs": ["fine"], "parameters": {"absence": "blur"}}, 422, "validation_error"),
        ({"inputs": ["fine"], "target": "neutral"}, 400, "invalid_input"),
        (
            {
                "inputs": ["one two three four five"],
                "budget": 8,
                "parameters": {"estimator": "kernel"},
            },
            400,
            "budget_too_small",
        ),
    ],
)
def test_bad_text_input_is_4xx(
    client: TestClient, body: dict[str, Any], status: int, code: str
) -> None:
    r = client.post(URL, json=body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and r.json()["error"]


def test_text_options_refused_for_tabular(client: TestClient) -> None:
    row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
    r = client.post(TABULAR, json={"inputs": [row], "parameters": {"players": "tokens"}})
    assert r.status_code == 400 and r.json()["code"] == "invalid_option"
    ok = client.post(TABULAR, json={"inputs": [row]}).json()
    assert "players" not in ok["meta"]["parameters"]
    assert ok["data"]["explanations"][0]["players"] is None
