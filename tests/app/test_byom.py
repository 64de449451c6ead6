"""Users' own models over HTTP: ONNX, XGBoost, LightGBM, TorchScript; TreeSHAP against shap;
honest explainer lists; the request's background always wins."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import shap
from fastapi.testclient import TestClient

from tests import byom_models as bm


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register(client: TestClient, model: bm.UserModel, **extra: str) -> dict[str, Any]:
    r = client.post(
        "/v2/repository/models", data={**model.form, **extra}, files=model.upload()
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def explain(
    client: TestClient,
    name: str,
    body: dict[str, Any],
    explainer: str = "shapley",
    status: int = 200,
) -> dict[str, Any]:
    r = client.post(f"/v2/models/{name}/explain/{explainer}", json=body)
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


def infer(client: TestClient, name: str, rows: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.reshape(-1).tolist()}]}  # fmt: skip
    r = client.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"]).reshape(out["shape"])


def exact_interventional(
    predict: Any, x: np.ndarray, background: np.ndarray, output: int
) -> np.ndarray:
    """Shapley values by full enumeration of the interventional game (ground truth)."""
    n = x.shape[0]
    value = {}
    for mask in itertools.product([0, 1], repeat=n):
        rows = np.where(np.array(mask, bool), x, background)
        value[mask] = float(np.mean(predict(rows)[:, output]))
    phi = np.zeros(n)
    from math import factorial

    for mask, v in value.items():
        s = sum(mask)
        for i in range(n):
            if mask[i]:
                without = tuple(0 if j == i else m for j, m in enumerate(mask))
                w = factorial(s - 1) * factorial(n - s) / factorial(n)
                phi[i] += w * (v - value[without])
    return phi


def test_onnx_sklearn_pipeline_exact_equals_enumeration(client: TestClient) -> None:
    model = bm.sklearn_onnx()
    meta = register(client, model)
    assert meta["platform"] == "onnx"
    # a black box: model-agnostic explainers only
    assert meta["explainers"] == ["shapley", "sufficient-subset"]
    assert meta["capabilities"]["differentiable"] is False
    np.testing.assert_allclose(
        infer(client, model.name, model.rows), model.predict(model.rows), rtol=1e-5, atol=1e-6
    )
    bg = model.background[:8]
    out = explain(client, model.name, {"inputs": model.rows[:1].tolist(),
                                       "background": bg.tolist(), "target": 1})  # fmt: skip
    e = out["data"]["explanations"][0]
    assert e["exact"] and out["meta"]["parameters"]["masker"]["source"] == "request"
    truth = exact_interventional(model.predict, model.rows[0].astype(np.float64), bg, 1)
    np.testing.assert_allclose(e["values"], truth, atol=2e-5)
    for kind in ("integrated-gradients", "uni"):
        err = explain(client, model.name, {"inputs": model.rows[:1].tolist()}, kind, 422)
        assert err["code"] == "not_differentiable"


def test_onnx_output_selection_and_refusals(client: TestClient) -> None:
    model = bm.sklearn_onnx("skl-onnx-bad")
    r = client.post("/v2/repository/models", data={**model.form, "onnx_output": "label"},
                    files=model.upload())  # fmt: skip
    assert r.status_code == 400 and "probabilities" in r.json()["error"]
    garbage = {"file": ("m.onnx", b"\x08\x07garbage-not-a-model")}
    r = client.post("/v2/repository/models", data=model.form, files=garbage)
    assert r.status_code == 400 and r.json()["code"] == "invalid_model"
    wrong = {**model.form, "input_shape": "[5]", "feature_names": '["a","b","c","d","e"]'}
    r = client.post("/v2/repository/models", data=wrong, files=model.upload())
    assert r.status_code == 400 and "input_shape [5] has 5 values" in r.json()["error"]


def test_onnx_torch_export_image_model(client: TestClient) -> None:
    model = bm.torch_onnx()
    meta = register(client, model)
    assert meta["capabilities"]["input_range"] == [0.0, 1.0]
    assert meta["explainers"] == ["shapley", "sufficient-subset"]
    np.testing.assert_allclose(
        infer(client, model.name, model.rows), model.predict(model.rows), rtol=1e-5, atol=1e-6
    )
    out = explain(client, model.name, {"inputs": model.rows[:1].tolist(),
                                       "parameters": {"patch_size": 4}})  # fmt: skip
    e = out["data"]["explanations"][0]
    assert e["exact"] and len(e["values"]) == 4 and e["approximation_error"] < 1e-5


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_xgboost_treeshap_equals_shap(client: TestClient, task: str) -> None:
    model = bm.xgboost_model(f"xgb-{task[:3]}", task, ubj=task == "classification")
    meta = register(client, model)
    assert meta["platform"] == "xgboost" and meta["capabilities"]["tree"] == "xgboost"
    classifier = ["sufficient-subset"] if task == "classification" else []
    assert meta["explainers"] == ["shapley", *classifier]
    np.testing.assert_allclose(
        infer(client, model.name, model.rows), model.predict(model.rows), rtol=1e-5, atol=1e-6
    )
    target = 0 if task == "regression" else 1
    out = explain(client, model.name, {"inputs": model.rows.tolist(), "target": target})
    params = out["meta"]["parameters"]
    assert params["estimator"] == "tree" and params["output"] == "margin"
    assert params["masker"]["type"] == "path-dependent"
    truth = shap.TreeExplainer(model.native).shap_values(model.rows)  # margin (log-odds)
    for e, sv in zip(out["data"]["explanations"], truth, strict=True):
        assert e["exact"] and e["estimator"] == "tree"
        np.testing.assert_allclose(e["values"], sv, atol=1e-4)
        assert e["approximation_error"] < 1e-4


def test_xgboost_interactions_equal_shap(client: TestClient) -> None:
    model = bm.xgboost_model("xgb-sii", "classification")
    register(client, model)
    body = {"inputs": model.rows[:2].tolist(), "target": 1, "parameters": {"index": "SII"}}
    out = explain(client, model.name, body)
    phi = shap.TreeExplainer(model.native).shap_interaction_values(model.rows[:2])
    for e, p in zip(out["data"]["explanations"], phi, strict=True):
        assert e["estimator"] == "tree" and e["interactions"]["index"] == "SII"
        values = e["interactions"]["values"]
        for i, j in itertools.combinations(range(bm.N_TAB), 2):
            assert values[f"{i},{j}"] == pytest.approx(2 * p[i, j], abs=1e-4)
        np.testing.assert_allclose([values[str(i)] for i in range(bm.N_TAB)], p.sum(axis=1),
                                   atol=1e-4)  # fmt: skip


def test_tree_background_is_interventional_treeshap(client: TestClient) -> None:
    """With background rows, exact interventional TreeSHAP of the margin (issue 25), equal to
    enumerating the interventional game; what it cannot give exactly falls back, says why."""
    model = bm.xgboost_model("xgb-fallback", "classification")
    register(client, model)
    row = model.rows[:1].tolist()
    # Probabilities: model-agnostic, exact here, equal to enumeration over the background.
    bg = model.background[:5]
    body = {"inputs": row, "target": 1, "background": bg.tolist(),
            "parameters": {"output": "prediction"}}  # fmt: skip
    out = explain(client, model.name, body)
    e, params = out["data"]["explanations"][0], out["meta"]["parameters"]
    assert e["estimator"] == "exact" and params["output"] == "prediction"
    assert params["output_space"] == "probability"
    codes = {w["code"]: w["message"] for w in e["warnings"]}
    assert "not TreeSHAP" in codes["estimator_fallback"]
    truth = exact_interventional(model.predict, model.rows[0].astype(np.float64), bg, 1)
    np.testing.assert_allclose(e["values"], truth, atol=2e-5)
    # A background with the default output: the margin (log-odds).
    out = explain(client, model.name, {"inputs": row, "target": 1, "background": bg.tolist()})
    e, params = out["data"]["explanations"][0], out["meta"]["parameters"]
    assert e["estimator"] == "tree" and e["exact"] and not e["warnings"]
    assert params["output"] == "margin" and params["output_space"] == "log-odds"
    assert params["masker"]["type"] == "interventional" and params["masker"]["rows"] == 5
    margin = lambda r: model.native.predict(r, output_margin=True)[:, None] * [-1, 1]  # noqa: E731
    truth = exact_interventional(margin, model.rows[0].astype(np.float64), bg, 1)
    np.testing.assert_allclose(out["data"]["explanations"][0]["values"], truth, atol=1e-5)
    # SII has no interventional TreeSHAP: model-agnostic, said so; estimator tree: a clear 400.
    body = {"inputs": row, "background": bg.tolist(), "parameters": {"index": "SII"}}
    e = explain(client, model.name, body)["data"]["explanations"][0]
    codes = {w["code"]: w["message"] for w in e["warnings"]}
    assert e["estimator"] != "tree" and "not TreeSHAP" in codes["estimator_fallback"]
    body["parameters"]["estimator"] = "tree"
    assert explain(client, model.name, body, status=400)["code"] == "invalid_option"


def test_lightgbm_multiclass(client: TestClient) -> None:
    model = bm.lightgbm_model()
    meta = register(client, model)
    assert meta["capabilities"]["tree"] == "lightgbm"
    np.testing.assert_allclose(
        infer(client, model.name, model.rows), model.predict(model.rows), rtol=1e-5, atol=1e-6
    )
    out = explain(client, model.name, {"inputs": model.rows.tolist()})
    truth = np.asarray(shap.TreeExplainer(model.native).shap_values(model.rows))  # [m, n, k]
    for e, row, sv in zip(out["data"]["explanations"], model.rows, truth, strict=True):
        assert e["output_index"] == int(np.argmax(model.predict(row[None])))
        np.testing.assert_allclose(e["values"], sv[:, e["output_index"]], atol=1e-4)
    # LightGBM has no interaction values: auto falls back and says so; tree refuses.
    body = {"inputs": model.rows[:1].tolist(), "parameters": {"index": "SII"}}
    out = explain(client, model.name, body)
    e = out["data"]["explanations"][0]
    assert e["estimator"] != "tree" and e["warnings"][0]["code"] == "estimator_fallback"
    body["parameters"]["estimator"] = "tree"
    assert explain(client, model.name, body, status=400)["code"] == "invalid_option"


def test_booster_declaration_mismatch(client: TestClient) -> None:
    model = bm.xgboost_model("xgb-wrong", "regression")
    bad = {**model.form, "task": "classification", "output_names": '["a", "b"]'}
    r = client.post("/v2/repository/models", data=bad, files=model.upload())
    assert r.status_code == 400 and "regression objective" in r.json()["error"]
    bad = {**model.form, "input_shape": "[4]", "feature_names": '["a","b","c","d"]'}
    r = client.post("/v2/repository/models", data=bad, files=model.upload())
    assert r.status_code == 400 and "reads 6 features" in r.json()["error"]


def test_request_background_wins_over_zeros(client: TestClient) -> None:
    """A TorchScript model without a stored background: the request's rows are the masker."""
    model = bm.scripted_linear()
    meta = register(client, model)
    assert set(meta["explainers"]) == {"shapley", "integrated-gradients"}  # a regressor: no UNI
    x, bg = model.rows[:1], model.background
    out = explain(client, model.name, {"inputs": x.tolist(), "background": bg.tolist()})
    assert out["meta"]["parameters"]["masker"] == {
        "type": "background", "source": "request", "rows": len(bg),
    }  # fmt: skip
    w = np.arange(1, 7)
    expected = w * (x[0].astype(np.float64) - bg.astype(np.float64).mean(axis=0))
    np.testing.assert_allclose(out["data"]["explanations"][0]["values"], expected, rtol=1e-4)
    # Integrated gradients on a forward that builds a constant tensor (no inference tensors).
    ig = explain(client, model.name, {"inputs": x.tolist(), "parameters": {"baseline": "zero"}},
                 "integrated-gradients")  # fmt: skip
    np.testing.assert_allclose(ig["data"]["explanations"][0]["values"], w * x[0], rtol=1e-4)
    # Without any background: a baseline of zeros, and the answer says so.
    out = explain(client, model.name, {"inputs": x.tolist()})
    assert out["meta"]["parameters"]["masker"]["source"] == "zeros"


def test_stored_background_csv(client: TestClient) -> None:
    model = bm.scripted_linear("linear-bg")
    model.files["background"] = ("bg.csv", bm.csv_background(model.background))
    meta = register(client, model)
    assert meta["background"]["rows"] == len(model.background)
    x = model.rows[:1]
    out = explain(client, model.name, {"inputs": x.tolist()})
    assert out["meta"]["parameters"]["masker"]["source"] == "model"
    w = np.arange(1, 7)
    expected = w * (x[0].astype(np.float64) - model.background.astype(np.float64).mean(axis=0))
    np.testing.assert_allclose(out["data"]["explanations"][0]["values"], expected, rtol=1e-4)
    other = model.background[:3]
    out = explain(client, model.name, {"inputs": x.tolist(), "background": other.tolist()})
    assert out["meta"]["parameters"]["masker"]["source"] == "request"
    bad = {**model.form, "name": "linear-badbg"}
    files = {**model.upload(), "background": ("bg.csv", b"x,y\n1,2\n")}
    r = client.post("/v2/repository/models", data=bad, files=files)
    assert r.status_code == 400 and "header" in r.json()["error"]


def test_traced_classifier_lists_uni_and_answers_without_background(client: TestClient) -> None:
    model = bm.torchscript_cnn()
    meta = register(client, model)
    listed = {"shapley", "integrated-gradients", "uni", "salvage", "sufficient-subset"}
    assert set(meta["explainers"]) == listed
    out = explain(client, model.name, {"inputs": model.rows[:1].tolist()}, "uni")
    assert out["meta"]["parameters"]["epsilon_units"] == "input"


def test_input_range_validates_and_clips(client: TestClient) -> None:
    model = bm.torchscript_cnn("cnn-range")
    register(client, model)
    on_16 = (model.rows[:1] * 16).tolist()  # sklearn's digits scale, not the declared [0, 1]
    err = explain(client, model.name, {"inputs": on_16}, status=400)
    assert err["code"] == "input_out_of_range" and "[0, 1]" in err["error"]
    body = {"inputs": model.rows[:1].tolist(), "background": on_16}
    assert explain(client, model.name, body, status=400)["code"] == "input_out_of_range"
    # Asked for: explained anyway, with the warning on that explanation only.
    body = {"inputs": [model.rows[0].tolist(), on_16[0]],
            "parameters": {"allow_out_of_range": True, "patch_size": 4}}  # fmt: skip
    first, second = explain(client, model.name, body)["data"]["explanations"]
    assert "input_out_of_range" not in {w["code"] for w in first["warnings"]}
    assert [w for w in second["warnings"] if w["code"] == "input_out_of_range"]
    # UNI's PGD baseline stays inside the declared range, even with a wide epsilon ball.
    body = {"inputs": model.rows[:1].tolist(), "parameters": {"epsilon": 3.0}}
    out = explain(client, model.name, body, "uni")
    assert out["meta"]["parameters"]["clip_min"] == 0 and out["meta"]["parameters"]["clip_max"] == 1
    baseline = np.asarray(out["data"]["explanations"][0]["details"]["baseline"])
    assert baseline.min() >= 0 and baseline.max() <= 1


def test_lightgbm_reads_float64_inputs(client: TestClient) -> None:
    """LightGBM splits on float64 thresholds: a float32-rounded input can land on the other
    side of one (here bp = 0.09072940503102193 against a threshold 0.09072940503102195)."""
    import lightgbm as lgb
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    data = load_diabetes()
    x_train, x_test, y_train, _ = train_test_split(
        data.data, data.target, test_size=0.2, random_state=0
    )
    est = lgb.LGBMRegressor(
        n_estimators=200, max_depth=4, num_leaves=16, learning_rate=0.05,
        min_child_samples=10, random_state=0, n_jobs=1, verbose=-1,
    ).fit(x_train, y_train)  # fmt: skip
    row = x_test[4:5]
    truth = est.booster_.predict(row, raw_score=True)
    assert abs(truth[0] - est.booster_.predict(row.astype(np.float32), raw_score=True)[0]) > 1
    form = {"name": "lgb-f64", "modality": "tabular", "input_shape": "[10]",
            "output_names": '["y"]', "task": "regression"}  # fmt: skip
    files = {"file": ("m.txt", est.booster_.model_to_string().encode())}
    assert client.post("/v2/repository/models", data=form, files=files).status_code == 201
    e = explain(client, "lgb-f64", {"inputs": row.tolist()})["data"]["explanations"][0]
    assert e["instance_output_value"] == pytest.approx(truth[0], abs=1e-6)
    np.testing.assert_allclose(e["values"], shap.TreeExplainer(est).shap_values(row)[0], atol=1e-6)
    body = {"inputs": [{"name": "x", "shape": [1, 10], "datatype": "FP64",
                        "data": row.reshape(-1).tolist()}]}  # fmt: skip
    out = client.post("/v2/models/lgb-f64/infer", json=body).json()["outputs"][0]
    assert out["data"][0] == pytest.approx(truth[0], rel=1e-6)


def test_numbers_are_json_numbers_everywhere(client: TestClient) -> None:
    """One rule: strings and true/false are never numbers (feature values, backgrounds, budgets,
    OIP data); integers fill float fields."""
    model = bm.scripted_linear("linear-strict")
    register(client, model)
    row = model.rows[0].tolist()
    for bad in (["51", *row[1:]], [True, *row[1:]], [None, *row[1:]]):
        err = explain(client, model.name, {"inputs": [bad]}, status=400)
        assert err["code"] == "invalid_input" and "JSON numbers" in err["error"]
        err = explain(client, model.name, {"inputs": [row], "background": [bad]}, status=400)
        assert "background[0]" in err["error"]
    named: dict[str, Any] = {f"f{i}": v for i, v in enumerate(row)}
    named["f0"] = "51"
    assert explain(client, model.name, {"inputs": [named]}, status=400)["code"] == "invalid_input"
    assert explain(client, model.name, {"inputs": [row], "budget": "51"}, status=422)
    ints = [int(v) for v in row]  # integers are numbers
    explain(client, model.name, {"inputs": [ints], "background": [ints]})
    body = {"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32",
                        "data": ["51", *row[1:]]}]}  # fmt: skip
    assert client.post(f"/v2/models/{model.name}/infer", json=body).status_code in (400, 422)
