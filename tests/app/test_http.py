"""Routes through the ASGI app: contract shapes, explanations, and 4xx on bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from models.base import Model
from models.registry import ModelRegistry

DIABETES = "/v2/models/diabetes-mlp/explain/shapley"


def explain(client: TestClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(url, json=body, headers={"Cache-Control": "no-cache"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_health_and_catalog(client: TestClient) -> None:
    assert client.get("/v2/health/live").status_code == 200
    ready = client.get("/v2/health/ready")
    assert ready.status_code == 200
    assert ready.json()["cache"]["backend"] == "memory"
    models = {m["name"]: m for m in client.get("/v2/models").json()}
    assert set(models) >= {"diabetes-mlp", "breast-cancer-mlp", "digits-cnn"}
    # Background models (the LMs, digits-sst-twin) load after readiness, or not at all under
    # LOAD_BACKGROUND_MODELS=false
    background = {k for k, v in ready.json()["models"].items() if v.get("background")}
    eager = [m for name, m in models.items() if name not in background]
    assert eager and background >= {"gemma3-270m", "smollm2-135m", "digits-sst-twin"}
    assert all(len(m["version"]) == 16 and m["state"] == "ready" for m in eager)
    catalog = client.get("/v2/explainers").json()
    shapley = next(e for e in catalog if e["name"] == "shapley")
    assert "estimator" in shapley["options_schema"]["properties"]
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v2/models/{model}/explain/shapley" in paths
    assert "422" in paths["/v2/models/{model}/explain/shapley"]["post"]["responses"]


def test_model_metadata(client: TestClient) -> None:
    meta = client.get("/v2/models/breast-cancer-mlp").json()
    assert meta["output_names"] == ["malignant", "benign"]
    assert len(meta["feature_names"]) == 30
    assert meta["inputs"][0]["shape"] == [-1, 30]
    assert "shapley" in meta["explainers"]
    assert meta["background"]["rows"] == 100
    digits = client.get("/v2/models/digits-cnn").json()
    assert digits["inputs"][0]["shape"] == [-1, 1, 8, 8] and digits["modality"] == "image"
    assert client.get("/v2/models/nope").status_code == 404


def test_infer_matches_model(client: TestClient, registry: ModelRegistry) -> None:
    x = np.random.default_rng(0).normal(size=(3, 30)) * 10 + 50
    body = {
        "inputs": [
            {"name": "input", "shape": [3, 30], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    r = client.post("/v2/models/breast-cancer-mlp/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [3, 2]
    expected = registry.get("breast-cancer-mlp").predict(x.astype(np.float32))
    np.testing.assert_allclose(np.reshape(out["data"], (3, 2)), expected, atol=1e-6)


def test_explain_diabetes_exact_is_additive(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("diabetes-mlp")
    x = model.background[:2].tolist()  # type: ignore[index]
    body = explain(client, DIABETES, {"inputs": x})
    meta = body["meta"]
    assert meta["exact"] and meta["cache"] == "bypass" and meta["budget"] == 1024 * 100
    assert meta["n_model_evals"] == 2 * 1024 * 100
    assert meta["parameters"]["masker"] == {"type": "background", "source": "model", "rows": 100}
    assert body["data"]["feature_names"] == list(model.feature_names)
    for e, row in zip(body["data"]["explanations"], x, strict=True):
        assert len(e["values"]) == 10 and e["n_model_evals"] == 102400
        assert abs(sum(e["values"]) + e["base_value"] - e["instance_output_value"]) < 1e-4
        assert e["instance_output_value"] == pytest.approx(
            float(model.predict(np.array([row], np.float32))[0, 0]), abs=1e-4
        )
        assert e["base_value"] == pytest.approx(
            float(model.predict(model.background).mean()),
            abs=1e-3,
        )


def test_dict_rows_and_target_name(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("breast-cancer-mlp")
    row = model.background[0]  # type: ignore[index]
    as_dict = dict(zip(model.feature_names, row.tolist(), strict=True))
    base = {"budget": 8000, "parameters": {"estimator": "kernel"}}
    a = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {**base, "inputs": [row.tolist()], "target": "benign"},
    )
    b = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {**base, "inputs": [as_dict], "target": 1},
    )
    assert a["data"]["explanations"][0]["values"] == b["data"]["explanations"][0]["values"]
    e = a["data"]["explanations"][0]
    assert e["output_name"] == "benign" and e["n_model_evals"] <= 8000
    assert e["error_std"] is not None and len(e["error_std"]) == 30
    assert e["approximation_error"] < 1e-6  # the efficiency constraint holds exactly


def test_default_target_is_predicted_class(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("breast-cancer-mlp")
    rows = model.background[:6]  # type: ignore[index]
    body = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {"inputs": rows.tolist(), "budget": 8000},
    )
    predicted = model.predict(rows).argmax(axis=1)
    assert [e["output_index"] for e in body["data"]["explanations"]] == predicted.tolist()


def test_digits_patches(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("digits-cnn")
    image = model.background[0]  # type: ignore[index]
    body = explain(
        client,
        "/v2/models/digits-cnn/explain/shapley",
        {"inputs": [image.tolist()], "parameters": {"patch_size": 4}},
    )
    assert body["data"]["feature_names"] == ["patch_0_0", "patch_0_1", "patch_1_0", "patch_1_1"]
    e = body["data"]["explanations"][0]
    assert e["exact"] and e["n_model_evals"] == 16
    assert body["meta"]["parameters"]["masker"]["source"] == "zeros"
    # A 2D image (no channel axis) is accepted too; 16 players by default.
    flat = explain(
        client,
        "/v2/models/digits-cnn/explain/shapley",
        {"inputs": [image[0].tolist()], "budget": 600},
    )
    assert len(flat["data"]["explanations"][0]["values"]) == 16
    assert flat["data"]["explanations"][0]["n_model_evals"] <= 600


def test_baseline_and_request_background(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("diabetes-mlp")
    x = model.background[3]  # type: ignore[index]
    base = explain(
        client, DIABETES, {"inputs": [x.tolist()], "parameters": {"masker": {"type": "baseline"}}}
    )
    # games/absence.py: the mean in float64, sent as float32 (float32 tolerance)
    means = model.background.astype(np.float64).mean(axis=0)  # type: ignore[union-attr]
    np.testing.assert_allclose(base["meta"]["parameters"]["masker"]["value"], means, rtol=1e-6)
    assert base["data"]["explanations"][0]["n_model_evals"] == 1024
    bg = model.background[:7].tolist()  # type: ignore[index]
    own = explain(client, DIABETES, {"inputs": [x.tolist()], "background": bg})
    assert own["meta"]["parameters"]["masker"]["rows"] == 7
    assert own["data"]["explanations"][0]["n_model_evals"] == 1024 * 7


def test_same_seed_same_answer(client: TestClient) -> None:
    body = {
        "inputs": [[10.0] * 30],
        "budget": 9000,
        "seed": 5,
        "parameters": {"estimator": "permutation"},
    }
    url = "/v2/models/breast-cancer-mlp/explain/shapley"
    a, b = explain(client, url, body), explain(client, url, body)
    assert a["data"] == b["data"]
    c = explain(client, url, {**body, "seed": 6})
    assert c["data"]["explanations"][0]["values"] != a["data"]["explanations"][0]["values"]


class CountingModule(torch.nn.Module):
    """Wraps a module and counts the rows it is given."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.inner(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("estimator", "budget"),
    [("auto", None), ("exact", 102400), ("kernel", 2345), ("permutation", 5000), ("auto", 90000)],
)
def test_budget_is_what_was_spent(
    client: TestClient, registry: ModelRegistry, estimator: str, budget: int | None
) -> None:
    base = registry.get("diabetes-mlp")
    counting = CountingModule(base.module)
    registry.register(
        Model(
            name="diabetes-counting",
            modality=base.modality,
            task=base.task,
            input_shape=base.input_shape,
            feature_names=base.feature_names,
            output_names=base.output_names,
            module=counting,
            background=base.background,
        )
    )
    counting.rows = 0  # placing the model measured its memory per row on a few probe rows
    body = explain(
        client,
        "/v2/models/diabetes-counting/explain/shapley",
        {"inputs": [[0.02] * 10], "budget": budget, "parameters": {"estimator": estimator}},
    )
    spent = body["meta"]["n_model_evals"]
    assert spent == counting.rows
    assert spent <= body["meta"]["budget"]
    if budget is not None:
        assert body["meta"]["budget"] == budget


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"inputs": [[1.0] * 9]}, 400, "invalid_input"),
        ({"inputs": [["a"] * 10]}, 400, "invalid_input"),
        ({"inputs": [[True] + [1.0] * 9]}, 400, "invalid_input"),
        (
            {
                "inputs": [
                    {
                        "age": True,
                        "sex": 1,
                        "bmi": 1,
                        "bp": 1,
                        "s1": 1,
                        "s2": 1,
                        "s3": 1,
                        "s4": 1,
                        "s5": 1,
                        "s6": 1,
                    }
                ]
            },
            400,
            "invalid_input",
        ),
        ({"inputs": [[1.0] * 10, [1.0] * 3]}, 400, "invalid_input"),
        ({"inputs": [{"age": 1}]}, 400, "invalid_input"),
        ({"inputs": [1, 2, 3]}, 400, "invalid_input"),
        ({"inputs": []}, 422, "validation_error"),
        ({"inputs": [[1.0] * 10], "parameters": {"bogus": 1}}, 422, "validation_error"),
        ({"inputs": [[1.0] * 10], "parameters": {"estimator": "magic"}}, 422, "validation_error"),
        ({"inputs": [[1.0] * 10], "surprise": 1}, 422, "validation_error"),
        ({"inputs": [[1.0] * 10], "budget": 50}, 400, "budget_too_small"),
        (
            {"inputs": [[1.0] * 10], "budget": 1000, "parameters": {"estimator": "permutation"}},
            400,
            "budget_too_small",
        ),
        (
            {"inputs": [[1.0] * 10], "budget": 2000, "parameters": {"estimator": "exact"}},
            400,
            "budget_too_small",
        ),
        ({"inputs": [[1.0] * 10], "budget": 10**12}, 400, "budget_too_large"),
        ({"inputs": [[1.0] * 10], "target": 3}, 400, "invalid_input"),
        ({"inputs": [[1.0] * 10], "target": "nope"}, 400, "invalid_input"),
        ({"inputs": [[1.0] * 10], "background": [[1.0] * 4]}, 400, "invalid_input"),
        (
            {
                "inputs": [[1.0] * 10],
                "parameters": {"masker": {"type": "baseline", "value": [1, 2]}},
            },
            400,
            "invalid_option",
        ),
        ({"inputs": [[1.0] * 10], "seed": -1}, 422, "validation_error"),
    ],
)
def test_bad_input_is_4xx(client: TestClient, body: dict[str, Any], status: int, code: str) -> None:
    r = client.post(DIABETES, json=body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and r.json()["error"]


def test_nan_oversize_unknown(client: TestClient) -> None:
    nan = b'{"inputs": [[NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}'
    r = client.post(DIABETES, content=nan, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_input"
    r = client.post(DIABETES, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    big = {"inputs": [[1.0] * 10] * 5000}  # over the test app's 200 kB body limit
    r = client.post(DIABETES, json=big)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    r = client.post("/v2/models/nope/explain/shapley", json={"inputs": [[1.0]]})
    assert r.status_code == 404 and r.json()["code"] == "unknown_model"
    r = client.post("/v2/models/diabetes-mlp/explain/nope", json={"inputs": [[1.0]]})
    assert r.status_code == 404 and r.json()["code"] == "unknown_explainer"
    r = client.post(
        "/v2/models/diabetes-mlp/infer",
        json={
            "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]
        },
    )
    assert r.status_code == 400


def test_metrics(client: TestClient) -> None:
    text = client.get("/metrics").text
    assert "explain_requests_total" in text and "model_evals_total" in text


def test_interactions_through_http(client: TestClient) -> None:
    row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
    body = explain(client, DIABETES, {"inputs": [row], "parameters": {"index": "k-SII"}})
    e = body["data"]["explanations"][0]
    assert body["meta"]["additive"] and e["exact"]
    assert body["meta"]["parameters"]["index"] == "k-SII"
    inter = e["interactions"]
    assert inter["index"] == "k-SII" and inter["max_order"] == 2
    assert len(inter["values"]) == 10 + 45 and "0,1" in inter["values"]
    assert e["values"] == [inter["values"][str(i)] for i in range(10)]
    assert e["approximation_error"] < 1e-8
    sii = explain(client, DIABETES, {"inputs": [row], "parameters": {"index": "SII"}})
    assert sii["meta"]["additive"] is False
    sampled = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {"inputs": [[10.0] * 30], "budget": 20000, "parameters": {"index": "FSII"}},
    )
    e = sampled["data"]["explanations"][0]
    assert not e["exact"] and e["n_model_evals"] <= 20000
    assert len(e["interactions"]["values"]) == 30 + 435
    r = client.post(DIABETES, json={"inputs": [row], "parameters": {"estimator": "svarm"}})
    assert r.status_code == 400


def test_interactions_auto_picks_gp_except_on_text(client: TestClient) -> None:
    """auto's sampled SII/k-SII: gp's posterior on tabular (and image) games, KernelSHAP-IQ on
    text, where gp's prior misses word interactions (docs/benchmarks.md)."""
    k_sii = {"index": "k-SII"}
    tabular = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {"inputs": [[10.0] * 30], "budget": 20000, "parameters": k_sii},
    )["data"]["explanations"][0]
    assert tabular["estimator"] == "gp" and tabular["error_std"] is not None
    sentence = "The service was slow, but the food arrived warm and the staff were kind."
    text = explain(
        client,
        "/v2/models/sentiment-minilm/explain/shapley",
        {"inputs": [sentence], "budget": 300, "parameters": k_sii},
    )["data"]["explanations"][0]
    assert "KernelSHAPIQ" in text["estimator"] and text["n_model_evals"] <= 300
    assert len(text["interactions"]["values"]) == 14 + 91
    assert not any(w["code"] == "prior_misfit" for w in text["warnings"])
    named = explain(
        client,
        "/v2/models/sentiment-minilm/explain/shapley",
        {"inputs": [sentence], "budget": 300, "parameters": {**k_sii, "estimator": "gp"}},
    )["data"]["explanations"][0]
    assert named["estimator"] == "gp"
    assert any(w["code"] == "prior_misfit" for w in named["warnings"])  # by name on text
    assert not any(w["code"] == "prior_misfit" for w in tabular["warnings"])
    # Shapley values of a text model: gp at every budget (a MiniLM pass per coalition costs
    # far more than gp's fit); kernel for a cheap tabular model from 3n coalitions
    sv = explain(
        client,
        "/v2/models/sentiment-minilm/explain/shapley",
        {"inputs": [sentence], "budget": 300},
    )["data"]["explanations"][0]
    assert sv["estimator"] == "gp" and sv["n_model_evals"] <= 300
    assert sum(sv["values"]) == pytest.approx(sv["instance_output_value"] - sv["base_value"])


def test_api_allocation_through_http(client: TestClient) -> None:
    row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
    sv = explain(client, DIABETES, {"inputs": [row]})["data"]["explanations"][0]["values"]
    body = explain(client, DIABETES, {"inputs": [row], "parameters": {"index": "API"}})
    assert body["meta"]["additive"] is False
    assert body["meta"]["parameters"]["api_variant"] == "chain"
    e = body["data"]["explanations"][0]
    assert e["exact"] and all(a >= s - 1e-9 for a, s in zip(e["values"], sv, strict=True))


def test_background_audit_in_meta(client: TestClient, registry: ModelRegistry) -> None:
    model = registry.get("breast-cancer-mlp")
    assert model.reference is not None
    row = model.reference[0].tolist()
    plain = explain(
        client, "/v2/models/breast-cancer-mlp/explain/shapley", {"inputs": [row], "budget": 10000}
    )
    assert "background_audit" not in plain["meta"]
    own = model.reference[50:90].tolist()
    body = explain(
        client,
        "/v2/models/breast-cancer-mlp/explain/shapley",
        {"inputs": [row], "budget": 10000, "background": own},
    )
    audit = body["meta"]["background_audit"]
    assert audit["reference"] == "training split"
    assert audit["outputs"][0]["output_index"] == body["data"]["explanations"][0]["output_index"]
    assert audit["outputs"][0]["background_rows"] == 40
    assert isinstance(audit["suspicious"], bool)
