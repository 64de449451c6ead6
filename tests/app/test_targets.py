"""Several targets per request (API.md "Targets over several classes"): a list of outputs or
"all" gives each instance one explanation per output, in the order asked, equal to the
single-target answers; shap's multi-output layout; clear 400s."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from math import factorial
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from tests import byom_models as bm
from tests.app.test_jobs import wait
from xai import Client
from xai.results import shap_explanation


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture(scope="module")
def onnx_model(client: TestClient) -> bm.UserModel:
    """A 6-feature binary classifier: 2^6 coalitions, exact answers are cheap."""
    model = bm.sklearn_onnx("targets-onnx")
    r = client.post("/v2/repository/models", data=model.form, files=model.upload())
    assert r.status_code == 201, r.text
    return model


def explain(
    client: TestClient, name: str, body: dict[str, Any], explainer: str = "shapley"
) -> dict[str, Any]:
    r = client.post(f"/v2/models/{name}/explain/{explainer}", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def exact_shapley(predict: Any, x: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Interventional Shapley values of every output by full enumeration. [n, k]"""
    n = x.shape[0]
    value = {
        mask: predict(np.where(np.array(mask, bool), x, background)).mean(axis=0)
        for mask in itertools.product([0, 1], repeat=n)
    }
    phi = np.zeros((n, len(next(iter(value.values())))))
    for mask, v in value.items():
        s = sum(mask)
        for i in range(n):
            if mask[i]:
                w = factorial(s - 1) * factorial(n - s) / factorial(n)
                phi[i] += w * (v - value[(*mask[:i], 0, *mask[i + 1 :])])
    return phi


def values(answer: dict[str, Any]) -> np.ndarray:
    return np.array([e["values"] for e in answer["data"]["explanations"]])


def test_exact_list_equals_single_targets_and_ground_truth(
    client: TestClient, onnx_model: bm.UserModel
) -> None:
    rows, background = onnx_model.rows[:3], onnx_model.background
    body = {"inputs": rows.tolist(), "background": background.tolist(), "seed": 3}
    both = explain(client, "targets-onnx", {**body, "target": [1, "malignant"]})
    meta = both["meta"]
    assert meta["targets"] == {
        "output_indices": [1, 0],
        "output_names": ["benign", "malignant"],
        "budget": "shared",
    }
    assert meta["n_instances"] == 3 and meta["exact"]
    got = both["data"]["explanations"]
    assert [e["output_index"] for e in got] == [1, 0] * 3
    assert [e["data"] for e in got] == [r for r in rows.tolist() for _ in range(2)]
    singles = [explain(client, "targets-onnx", {**body, "target": t}) for t in (1, 0)]
    for i, j in itertools.product(range(3), range(2)):
        one = singles[j]["data"]["explanations"][i]
        e = got[2 * i + j]
        np.testing.assert_allclose(e["values"], one["values"], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(e["base_value"], one["base_value"], rtol=1e-6)
        assert e["approximation_error"] < 1e-6  # efficiency for each output
        truth = exact_shapley(onnx_model.predict, rows[i], background)[:, e["output_index"]]
        np.testing.assert_allclose(e["values"], truth, atol=2e-6)
    # One game per instance gave both outputs: the model evaluations of one target's request.
    assert meta["n_model_evals"] == singles[0]["meta"]["n_model_evals"]
    assert sum(e["n_model_evals"] for e in got) == meta["n_model_evals"]


def test_order_is_in_the_cache_key(client: TestClient, onnx_model: bm.UserModel) -> None:
    body = {"inputs": onnx_model.rows[:1].tolist(), "target": [0, 1]}
    first = client.post("/v2/models/targets-onnx/explain/shapley", json=body)
    again = client.post("/v2/models/targets-onnx/explain/shapley", json=body)
    assert again.headers["x-cache"] == "HIT" and again.json()["data"] == first.json()["data"]
    url = "/v2/models/targets-onnx/explain/shapley"
    swapped = client.post(url, json={**body, "target": [1, 0]})
    assert swapped.headers["x-cache"] == "MISS"
    assert [e["output_index"] for e in swapped.json()["data"]["explanations"]] == [1, 0]
    single = client.post("/v2/models/targets-onnx/explain/shapley", json={**body, "target": 0})
    assert single.headers["x-cache"] == "MISS" and "targets" not in single.json()["meta"]


def test_sampled_list_uses_the_same_coalitions(client: TestClient) -> None:
    """KernelSHAP over 16 image patches: each output's values are those of its own
    single-target request with the same seed, and within their error bars of exact."""
    image = client.get("/v2/models/digits-cnn/examples", params={"n": 1}).json()["instances"]
    params = {"patch_size": 2, "estimator": "kernel"}
    body = {"inputs": image, "seed": 5, "budget": 600, "parameters": params}
    both = explain(client, "digits-cnn", {**body, "target": [3, 8]})
    assert both["meta"]["targets"]["budget"] == "shared"
    assert both["meta"]["n_model_evals"] <= 600
    exact = explain(
        client, "digits-cnn", {**body, "target": [3, 8], "budget": 1 << 16,
                               "parameters": {"patch_size": 2, "estimator": "exact"}},
    )  # fmt: skip
    for j, t in enumerate((3, 8)):
        e = both["data"]["explanations"][j]
        one = explain(client, "digits-cnn", {**body, "target": t})["data"]["explanations"][0]
        np.testing.assert_allclose(e["values"], one["values"], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(e["error_std"], one["error_std"], rtol=1e-6, atol=1e-12)
        assert e["approximation_error"] < 1e-6
        truth = np.array(exact["data"]["explanations"][j]["values"])
        z = np.abs(np.array(e["values"]) - truth) / (np.array(e["error_std"]) + 1e-9)
        assert np.mean(z < 3) >= 0.9, z


def test_interaction_index_per_target_pays_each_coalition_once(
    client: TestClient, onnx_model: bm.UserModel
) -> None:
    body = {
        "inputs": onnx_model.rows[:1].tolist(),
        "background": onnx_model.background[:5].tolist(),
        "parameters": {"index": "k-SII", "max_order": 2},
    }
    both = explain(client, "targets-onnx", {**body, "target": "all"})
    assert both["meta"]["targets"]["budget"] == "per target"
    first, second = both["data"]["explanations"]
    assert (first["output_index"], second["output_index"]) == (0, 1)
    assert first["n_model_evals"] == 64 * 5 and second["n_model_evals"] == 0  # exact, memoised
    for e, t in ((first, 0), (second, 1)):
        one = explain(client, "targets-onnx", {**body, "target": t})["data"]["explanations"][0]
        assert e["interactions"]["values"].keys() == one["interactions"]["values"].keys()
        np.testing.assert_allclose(
            list(e["interactions"]["values"].values()),
            list(one["interactions"]["values"].values()),
            rtol=1e-6,
            atol=1e-9,
        )
        assert e["approximation_error"] < 1e-6


def test_tree_model_gives_every_class(client: TestClient) -> None:
    model = bm.lightgbm_model("targets-lgbm")
    r = client.post("/v2/repository/models", data=model.form, files=model.upload())
    assert r.status_code == 201, r.text
    body = {"inputs": model.rows.tolist()}
    every = explain(client, "targets-lgbm", {**body, "target": "all"})
    got = every["data"]["explanations"]
    assert [e["output_index"] for e in got] == [0, 1, 2] * 3
    assert {e["estimator"] for e in got} == {"tree"}
    for t in range(3):
        one = explain(client, "targets-lgbm", {**body, "target": t})["data"]["explanations"]
        for i in range(3):
            np.testing.assert_allclose(got[3 * i + t]["values"], one[i]["values"], rtol=1e-6)
            assert got[3 * i + t]["approximation_error"] < 1e-5


def test_per_target_explainers_and_shap_layout(client: TestClient) -> None:
    images = client.get("/v2/models/digits-cnn/examples", params={"n": 2}).json()["instances"]
    body = {"inputs": images, "target": [2, 0]}
    ig = explain(client, "digits-cnn", body, "integrated-gradients")
    assert ig["meta"]["targets"]["budget"] == "per target" and ig["meta"]["n_instances"] == 2
    for j, t in enumerate((2, 0)):
        one = explain(client, "digits-cnn", {**body, "target": t}, "integrated-gradients")
        for i in range(2):
            e = ig["data"]["explanations"][2 * i + j]
            assert e["output_index"] == t
            np.testing.assert_allclose(
                e["values"], one["data"]["explanations"][i]["values"], rtol=1e-5, atol=1e-7
            )
    r = client.post(
        "/v2/models/digits-cnn/explain/shapley/plot",
        params={"format": "shap"},
        json={**body, "parameters": {"patch_size": 4}},
    )
    assert r.status_code == 200, r.text
    args = r.json()
    assert np.asarray(args["values"]).shape == (2, 4, 2)
    assert np.asarray(args["base_values"]).shape == (2, 2) and args["output_names"] == ["2", "0"]
    sx = shap_explanation(args)
    assert sx.values.shape == (2, 4, 2)
    flat = explain(client, "digits-cnn", {**body, "parameters": {"patch_size": 4}})
    outputs = [e["instance_output_value"] for e in flat["data"]["explanations"]]
    np.testing.assert_allclose(
        sx.values.sum(axis=1) + sx.base_values, np.reshape(outputs, (2, 2)), atol=1e-5
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([], "empty list"),
        ([1, 1], "at most once"),
        ([0, "malignant"], "at most once"),
        ([0, 7], "out of range"),
        (["nope"], "unknown target"),
    ],
)
def test_bad_target_lists(
    client: TestClient, onnx_model: bm.UserModel, target: Any, message: str
) -> None:
    body = {"inputs": onnx_model.rows[:1].tolist(), "target": target}
    r = client.post("/v2/models/targets-onnx/explain/shapley", json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.text


def test_lists_where_they_do_not_apply(client: TestClient, onnx_model: bm.UserModel) -> None:
    r = client.post(
        "/v2/models/bm25/explain/rankshap",
        json={"query": "cat", "documents": ["a cat", "a dog"], "target": [0, 1]},
    )
    assert r.status_code == 400 and "target" in r.json()["error"], r.text
    r = client.post(
        "/v2/jobs",
        json={"model": "targets-onnx", "inputs": onnx_model.rows[:2].tolist(), "target": [0, 0]},
    )
    assert r.status_code == 400 and "at most once" in r.json()["error"], r.text
    r = client.post(
        "/v2/models/targets-onnx/explain/shapley",
        json={"inputs": onnx_model.rows[:1].tolist(), "target": [True]},
    )
    assert r.status_code == 422  # JSON true is not an output index


def test_audit_over_several_targets(client: TestClient, onnx_model: bm.UserModel) -> None:
    rows, background = onnx_model.rows, onnx_model.background[:5]
    body = {"inputs": rows.tolist(), "background": background.tolist(), "target": [1, 0]}
    r = client.post("/v2/jobs", json={"model": "targets-onnx", **body, "chunk_size": 3})
    assert r.status_code == 202, r.text
    status = wait(client, r.json()["id"])
    assert status["status"] == "succeeded" and status["progress"]["total"] == len(rows)
    summary = status["summary"]
    assert summary["instances"] == len(rows) and set(summary["per_class"]) == {
        "benign",
        "malignant",
    }
    answer = explain(client, "targets-onnx", body)["data"]["explanations"]
    text = client.get(f"/v2/jobs/{status['id']}/results").text
    lines = [json.loads(x) for x in text.splitlines()]
    stored = [e for line in lines for e in line["explanations"]]
    assert [e["output_index"] for e in stored] == [1, 0] * len(rows)
    for e, same in zip(stored, answer, strict=True):
        np.testing.assert_allclose(e["values"], same["values"], rtol=1e-9, atol=1e-12)
    csv = client.get(f"/v2/jobs/{status['id']}/results", params={"format": "csv"}).text
    table = pd.read_csv(io.StringIO(csv))
    names = [f"f{i}" for i in range(bm.N_TAB)]
    assert list(table["index"]) == [i for i in range(len(rows)) for _ in range(2)]
    assert list(table["output_index"]) == [1, 0] * len(rows)
    inputs = table[[f"input.{n}" for n in names]].to_numpy()
    np.testing.assert_allclose(inputs, np.repeat(rows, 2, axis=0), rtol=1e-6)
    plot = client.get(f"/v2/jobs/{status['id']}/plot", params={"format": "vega"})
    assert plot.status_code == 200, plot.text
    api = Client(http=client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
    fields = {k: v for k, v in body.items() if k != "inputs"}
    sx = api.audit("targets-onnx", rows, progress=False, **fields).to_shap()
    assert sx.values.shape == (len(rows), bm.N_TAB, 2)
    assert list(sx.output_names) == ["benign", "malignant"]
    np.testing.assert_allclose(sx.data, rows, rtol=1e-6)
