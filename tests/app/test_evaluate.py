"""Gradient explainers over HTTP, parameters.evaluate on explain routes, POST .../evaluate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from explainers.gradients.integrated import IntegratedGradientsOptions
from explainers.gradients.integrated import explain as ig_explain
from models.base import Model
from models.builtin.trained import dataset_split
from models.registry import ModelRegistry

NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture(scope="module")
def images() -> list[Any]:
    return dataset_split("digits-cnn").x_test[:2].tolist()  # type: ignore[no-any-return]


def post(client: TestClient, url: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(url, json=body, headers=NO_CACHE)
    assert r.status_code == status, r.text
    return r.json()


def test_integrated_gradients_route_matches_library(
    client: TestClient, registry: ModelRegistry, images: list[Any]
) -> None:
    params = {"baseline": "blur", "steps": 16}
    body = post(client, "/v2/models/digits-cnn/explain/integrated-gradients",
                {"inputs": images, "parameters": params})  # fmt: skip
    meta = body["meta"]
    assert meta["parameters"]["blur_sigma"] == 2.0 and meta["parameters"]["steps"] == 16
    assert meta["additive"] and "evaluation" not in meta
    lib = ig_explain(
        registry.get("digits-cnn"),
        np.array(images, dtype=np.float32),
        options=IntegratedGradientsOptions(**params),  # type: ignore[arg-type]
    )
    for got, want in zip(body["data"]["explanations"], lib.explanations, strict=True):
        # the route runs in a worker thread (its own torch threads): float32 tolerances
        np.testing.assert_allclose(got["values"], want.values, rtol=1e-5, atol=1e-6)
        assert len(got["details"]["baseline"]) == 64
        assert got["details"]["completeness_gap"] == pytest.approx(
            want.details["completeness_gap"]  # type: ignore[index]
        )


def test_uni_route_returns_its_baseline(client: TestClient, images: list[Any]) -> None:
    body = post(client, "/v2/models/digits-cnn/explain/uni",
                {"inputs": images[:1], "parameters": {"epsilon": 0.1, "pgd_steps": 5}})  # fmt: skip
    e = body["data"]["explanations"][0]
    baseline = np.array(e["details"]["baseline"])
    rms = np.sqrt(np.mean((baseline - np.array(images[0]).reshape(-1)) ** 2))
    assert rms <= 0.1 + 1e-6  # l2 ball: epsilon bounds the root-mean-square change
    assert e["base_value"] < e["instance_output_value"]
    assert e["details"]["probability_baseline"] == pytest.approx(e["base_value"])
    assert {w["code"] for w in e["warnings"]} <= {"baseline_not_reached", "not_converged"}
    params = body["meta"]["parameters"]
    assert params["unlearning_rule"] == "line_search" and params["pgd_step_size"] == 0.025
    assert params["epsilon_units"] == "input" and params["norm"] == "l2"


def test_evaluate_hook_on_any_explainer(client: TestClient, images: list[Any]) -> None:
    shap = post(client, "/v2/models/digits-cnn/explain/shapley", {
        "inputs": images,
        "parameters": {"patch_size": 4, "estimator": "exact",
                       "evaluate": ["deletion", "insertion", "mufidelity"]},
    })  # fmt: skip
    assert shap["meta"]["evaluation"]["parameters"]["removal"] == "zero"
    assert "evaluate" not in shap["meta"]["parameters"]
    for e in shap["data"]["explanations"]:
        f = e["details"]["evaluation"]
        assert f["insertion_auc"] - f["deletion_auc"] == pytest.approx(
            f["insertion_minus_deletion"]
        )
        assert f["n_model_evals"] == 1 + 5 + 5 + 128  # full, two curves over 4 patches, subsets
    ig = post(client, "/v2/models/digits-cnn/explain/integrated-gradients", {
        "inputs": images[:1],
        "parameters": {"steps": 8, "evaluate": {"metrics": ["sensitivity"], "n_perturbations": 2}},
    })  # fmt: skip
    sens = ig["data"]["explanations"][0]["details"]["evaluation"]["sensitivity"]
    assert sens["max"] >= sens["mean"] > 0
    plain = post(client, "/v2/models/digits-cnn/explain/integrated-gradients",
                 {"inputs": images[:1], "parameters": {"steps": 8}})  # fmt: skip
    assert plain["data"]["explanations"][0]["values"] == ig["data"]["explanations"][0]["values"]
    bad = {"inputs": images[:1], "parameters": {"evaluate": ["accuracy"]}}
    post(client, "/v2/models/digits-cnn/explain/shapley", bad, 422)


def test_evaluate_route_with_attributions_and_with_explainer(
    client: TestClient, images: list[Any]
) -> None:
    evaluation = {"metrics": ["deletion", "insertion", "mufidelity"], "removal": "blur"}
    body = {"inputs": images, "parameters": {"steps": 8, "evaluate": evaluation}}
    hooked = post(client, "/v2/models/digits-cnn/explain/integrated-gradients", body)
    attributions = [e["values"] for e in hooked["data"]["explanations"]]
    body = {"inputs": images, "attributions": attributions, "evaluation": evaluation}
    supplied = post(client, "/v2/models/digits-cnn/evaluate", body)
    for got, e in zip(supplied["evaluations"], hooked["data"]["explanations"], strict=True):
        want = e["details"]["evaluation"]
        assert got["output_index"] == e["output_index"]
        for key in ("deletion_auc", "insertion_auc", "mufidelity"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6)  # float32 outputs
    assert supplied["meta"]["parameters"]["blur_sigma"] == 2.0
    run = post(client, "/v2/models/digits-cnn/evaluate", {
        "inputs": images[:1],
        "explainer": {"name": "integrated-gradients", "parameters": {"steps": 8}},
        "evaluation": {"n_perturbations": 2},
    })  # fmt: skip
    assert run["meta"]["explainer"]["explainer"] == "integrated-gradients"
    assert run["evaluations"][0]["sensitivity"]["max"] > 0
    # tabular attributions, default removal: feature means of the background
    rows = dataset_split("breast-cancer-mlp").x_test[:2].tolist()
    tab = post(client, "/v2/models/breast-cancer-mlp/evaluate",
               {"inputs": rows, "attributions": [[1.0] * 30, list(range(30))]})  # fmt: skip
    assert tab["meta"]["parameters"]["removal"] == "mean"
    assert (
        "sensitivity" not in tab["evaluations"][0] or tab["evaluations"][0]["sensitivity"] is None
    )


def test_refusals(client: TestClient, registry: ModelRegistry, images: list[Any]) -> None:
    url = "/v2/models/digits-cnn/evaluate"
    assert post(client, url, {"inputs": images}, 400)["code"] == "invalid_input"
    both = {"inputs": images, "attributions": [[0.0] * 64] * 2,
            "explainer": {"name": "integrated-gradients"}}  # fmt: skip
    post(client, url, both, 400)
    post(client, url, {"inputs": images, "attributions": [[0.0] * 64]}, 400)  # one row short
    post(client, url, {"inputs": images, "attributions": [[0.0] * 5] * 2}, 400)  # 5 != 64
    sens = {"inputs": images, "attributions": [[0.0] * 64] * 2,
            "evaluation": {"metrics": ["sensitivity"]}}  # fmt: skip
    post(client, url, sens, 400)
    wrong = {"inputs": images, "explainer": {"name": "integrated-gradients",
                                              "parameters": {"steps": 0}}}  # fmt: skip
    post(client, url, wrong, 422)
    post(client, "/v2/models/nope/evaluate", {"inputs": images, "attributions": [[0.0]]}, 404)
    # a text model without input embeddings to attribute on (Hugging Face classifiers have them)
    text = post(client, "/v2/models/sentiment-minilm/explain/uni", {"inputs": ["good"]}, 422)
    assert text["code"] == "not_differentiable"
    digits = registry.get("digits-cnn")
    remote = Model(
        "remote-digits", "image", "classification", digits.input_shape, digits.feature_names,
        digits.output_names, digits.module, platform="remote", differentiable=False,
    )  # fmt: skip
    registry.register(remote)
    try:
        for name in ("integrated-gradients", "uni"):
            body = post(client, f"/v2/models/remote-digits/explain/{name}", {"inputs": images}, 422)
            assert body["code"] == "not_differentiable"
    finally:
        registry.unregister("remote-digits")
    diabetes = {"inputs": [[0.0] * 10]}
    assert post(client, "/v2/models/diabetes-mlp/explain/uni", diabetes, 400)["code"] == (
        "needs_classifier"
    )


def test_text_attributions_follow_the_words(client: TestClient) -> None:
    url = "/v2/models/sentiment-minilm/evaluate"
    body = {
        "inputs": ["a truly wonderful film"],
        "attributions": [[0.0, 0.1, 0.8, 0.05]],
        "target": "positive",
        "evaluation": {"metrics": ["deletion", "insertion"], "curves": True},
    }
    got = post(client, url, body)
    f = got["evaluations"][0]
    assert got["meta"]["parameters"]["removal"] == "delete"
    assert f["deletion_curve"]["fraction"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert f["deletion_curve"]["score"][0] == pytest.approx(f["insertion_curve"]["score"][-1])
    post(client, url, {**body, "attributions": [[0.0, 1.0]]}, 400)  # 2 values for 4 words
