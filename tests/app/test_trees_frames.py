"""Boosters trained on pandas DataFrames over HTTP (issue 25): registered as the README shows
(every field declared), they predict as their library does on the DataFrame, answer the default
Shapley request (path-dependent TreeSHAP) and SII, explain exactly against background rows by
interventional TreeSHAP (equal to shap), say their output space, and audit to `succeeded`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import shap
import xgboost as xgb
from fastapi.testclient import TestClient

from tests import byom_models as bm


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register(client: TestClient, um: bm.UserModel) -> dict[str, Any]:
    r = client.post("/v2/repository/models", data=um.form, files=um.upload())
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def post(client: TestClient, name: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == status, r.text
    return r.json()


def infer(client: TestClient, name: str, rows: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.reshape(-1).tolist()}]}  # fmt: skip
    r = client.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"]).reshape(out["shape"])


# name -> (builder, the DataFrame it was fitted on: dataset kind, categorical column)
CASES: dict[str, tuple[Callable[[str], bm.UserModel], str, bool]] = {
    "wine-xgb": (lambda n: bm.xgboost_frame(n, "multiclass"), "multiclass", False),
    "wine-xgb-binary": (lambda n: bm.xgboost_frame(n, "binary"), "binary", False),
    "diabetes-xgb": (lambda n: bm.xgboost_frame(n, "regression"), "regression", False),
    "wine-xgb-cat": (lambda n: bm.xgboost_frame(n, "binary", categorical=True), "binary", True),
    "wine-lgbm-cat": (lambda n: bm.lightgbm_frame(n, "multiclass"), "multiclass", True),
}


def native_contribs(um: bm.UserModel, rows: np.ndarray, like: Any) -> np.ndarray:
    """The library's own TreeSHAP on the DataFrame the rows stand for: [m, k, n + 1], binary
    classifiers as [-c, c] (each class's log-odds)."""
    frame = bm.as_frame(rows, like)
    if "lgbm" in um.name:
        raw = np.asarray(um.native.predict(frame, pred_contrib=True))
    else:
        dm = xgb.DMatrix(frame, enable_categorical=True)
        raw = np.asarray(um.native.get_booster().predict(dm, pred_contribs=True))
    raw = raw.reshape(len(rows), -1, rows.shape[1] + 1)
    binary = getattr(um.native, "n_classes_", 0) == 2
    return np.concatenate([-raw, raw], axis=1) if binary else raw


@pytest.mark.parametrize("name", sorted(CASES))
def test_frame_models_answer_like_their_library(client: TestClient, name: str) -> None:
    build, data, categorical = CASES[name]
    um = build(name)
    meta = register(client, um)
    assert meta["capabilities"]["tree"] in ("xgboost", "lightgbm")
    like, _ = bm.frame_data(data, categorical)
    np.testing.assert_allclose(infer(client, name, um.rows), um.predict(um.rows), rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    out = post(client, name, {"inputs": um.rows.tolist()})
    params = out["meta"]["parameters"]
    assert params["estimator"] == "tree" and params["masker"]["type"] == "path-dependent"
    assert params["output_space"] == ("raw" if data == "regression" else "log-odds")
    truth = native_contribs(um, um.rows, like)
    for e, t in zip(out["data"]["explanations"], truth, strict=True):
        assert e["exact"] and e["estimator"] == "tree"
        np.testing.assert_allclose(e["values"], t[e["output_index"], :-1], atol=1e-5)
    if meta["capabilities"]["tree"] == "xgboost":  # pairwise SII from XGBoost's own values
        out = post(client, name, {"inputs": um.rows[:1].tolist(), "parameters": {"index": "SII"}})
        assert out["data"]["explanations"][0]["estimator"] == "tree"
    # background rows: exact interventional TreeSHAP, or a fallback that says why
    body = {"inputs": um.rows[:1].tolist(), "background": um.background.tolist()}
    e = post(client, name, body)["data"]["explanations"][0]
    if categorical:  # shap's interventional TreeSHAP has no categorical splits
        fallback = {w["code"]: w["message"] for w in e["warnings"]}["estimator_fallback"]
        assert e["estimator"] != "tree" and "categorical" in fallback
    else:
        assert e["estimator"] == "tree" and e["exact"]
    assert abs(sum(e["values"]) + e["base_value"] - e["instance_output_value"]) < 1e-4


def test_interventional_over_http_equals_shap(client: TestClient) -> None:
    um = bm.xgboost_frame("wine-xgb-bg", "multiclass")
    um.files["background"] = ("bg.csv", csv_with_names(um))
    register(client, um)
    x, bg = um.rows, um.background
    truth = np.asarray(
        shap.TreeExplainer(um.native, data=shap.maskers.Independent(bg, max_samples=len(bg)),
                           feature_perturbation="interventional").shap_values(x)
    )  # [m, n, k]  # fmt: skip
    for body in (
        {"background": bg.tolist()},  # the request's rows
        {"parameters": {"masker": {"type": "interventional"}}},  # the stored ones, by name
    ):
        out = post(client, um.name, {"inputs": x.tolist(), "target": 2, **body})
        params = out["meta"]["parameters"]
        assert params["estimator"] == "tree" and params["output_space"] == "log-odds"
        masker = params["masker"]
        assert masker["type"] == "interventional" and masker["rows"] == len(bg)
        assert masker["source"] == ("request" if "background" in body else "model")
        for e, t in zip(out["data"]["explanations"], truth, strict=True):
            np.testing.assert_allclose(e["values"], t[:, 2], atol=1e-6)
            assert abs(sum(e["values"]) + e["base_value"] - e["instance_output_value"]) < 1e-5


def csv_with_names(um: bm.UserModel) -> bytes:
    """A background CSV whose header is the DataFrame's own column names."""
    names = json.loads(um.form["feature_names"])
    lines = [",".join(names)] + [",".join(repr(float(v)) for v in r) for r in um.background]
    return ("\n".join(lines) + "\n").encode()


def test_poisson_regressor_says_log(client: TestClient) -> None:
    um = bm.xgboost_frame("counts-xgb", "regression", "count:poisson")
    register(client, um)
    out = post(client, um.name, {"inputs": um.rows.tolist()})
    assert out["meta"]["parameters"]["output_space"] == "log"
    pred = infer(client, um.name, um.rows)[:, 0]
    np.testing.assert_allclose(um.predict(um.rows)[:, 0], pred, rtol=1e-5)
    margins = [e["instance_output_value"] for e in out["data"]["explanations"]]
    np.testing.assert_allclose(margins, np.log(pred), atol=1e-5)  # the margin is log(prediction)


def wait(client: TestClient, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status: dict[str, Any] = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            return status
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def test_audit_of_a_frame_model_succeeds(client: TestClient) -> None:
    um = bm.xgboost_frame("wine-xgb-audit", "multiclass")
    register(client, um)
    x, _ = bm.frame_data("multiclass")
    rows = bm.as_numbers(x)[::6]  # 30 rows
    for extra in ({}, {"background": um.background.tolist()}):
        r = client.post("/v2/jobs", json={"model": um.name, "inputs": rows.tolist(), **extra})
        assert r.status_code == 202, r.text
        status = wait(client, r.json()["id"])
        assert status["status"] == "succeeded", status
        assert status["summary"]["instances"] == len(rows) and status["summary"]["errors"] == 0
        lines = client.get(f"/v2/jobs/{status['id']}/results").text.splitlines()
        results = [json.loads(line)["explanation"] for line in lines]
        assert len(results) == len(rows)
        assert all(e["estimator"] == "tree" and e["exact"] for e in results)
        if not extra:  # path-dependent: the library's own values on the DataFrame
            truth = native_contribs(um, rows, x)
            for e, t in zip(results, truth, strict=True):
                np.testing.assert_allclose(e["values"], t[e["output_index"], :-1], atol=1e-5)
