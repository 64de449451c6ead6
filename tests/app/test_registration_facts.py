"""Registration with a name and a file: what XGBoost, LightGBM and ONNX files state (feature
names, shapes, outputs, task) is read from them; contradicting declarations are refused."""

from __future__ import annotations

import io
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from sklearn.datasets import load_diabetes, load_wine

from tests import byom_models as bm

WINE = load_wine(as_frame=True)
X: pd.DataFrame = WINE.data  # 13 named columns, 3 classes
Y = WINE.target
NAMES = list(X.columns)


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def post(
    client: TestClient, name: str, data: bytes, extra: dict[str, str] | None = None, **files: Any
) -> Any:
    return client.post(
        "/v2/repository/models",
        data={"name": name, **(extra or {})},
        files={"file": ("model.bin", data), **files},
    )


def register(client: TestClient, name: str, data: bytes, **files: Any) -> dict[str, Any]:
    r = post(client, name, data, **files)
    assert r.status_code == 201, r.text
    shown = client.get(f"/v2/models/{name}").json()
    assert shown == r.json()
    return dict(shown)


def explain(client: TestClient, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == 200, r.text
    return list(r.json()["data"]["explanations"])


def csv_of(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def xgb_wine(binary: bool = False) -> Any:
    import xgboost as xgb

    y = (Y == 1).astype(int) if binary else Y
    return xgb.XGBClassifier(n_estimators=10, max_depth=2, random_state=0, n_jobs=1).fit(X, y)


def xgb_json(est: Any, tmp: Path) -> bytes:
    path = tmp / "m.json"
    est.save_model(path)  # the sklearn wrapper's save_model, as users save
    return path.read_bytes()


def test_xgboost_dataframe_classifier(client: TestClient, tmp_path: Path) -> None:
    import xgboost as xgb

    est = xgb_wine()
    meta = register(client, "wine-xgb", xgb_json(est, tmp_path))
    assert meta["modality"] == "tabular" and meta["task"] == "classification"
    assert meta["feature_names"] == NAMES and meta["output_names"] == ["0", "1", "2"]
    assert meta["inputs"][0]["shape"] == [-1, 13] and meta["outputs"][0]["shape"] == [-1, 3]
    # {feature: value} rows; path-dependent TreeSHAP equals XGBoost's own contributions
    rows = X.iloc[[0, 70, 140]]
    got = explain(client, "wine-xgb", {"inputs": rows.to_dict("records"), "target": "all"})
    contribs = est.get_booster().predict(xgb.DMatrix(rows), pred_contribs=True)  # [m, k, n+1]
    for i, e in enumerate(got):
        k = i % 3
        np.testing.assert_allclose(e["values"], contribs[i // 3, k, :-1], atol=1e-5)
    # a CSV background with the real column names is accepted; x0... is not
    with_bg = register(client, "wine-xgb-bg", xgb_json(est, tmp_path),
                       background=("bg.csv", csv_of(X.iloc[::9])))  # fmt: skip
    assert with_bg["background"]["rows"] == len(X.iloc[::9])
    wrong = X.iloc[:3].set_axis([f"x{i}" for i in range(13)], axis=1)
    r = post(client, "wine-xgb-badbg", xgb_json(est, tmp_path), background=("b.csv", csv_of(wrong)))
    assert r.status_code == 400 and "alcohol" in r.json()["error"]


def test_csv_audit_with_the_file_s_column_names(client: TestClient, tmp_path: Path) -> None:
    register(client, "wine-xgb-audit", xgb_json(xgb_wine(), tmp_path))
    rows = X.iloc[:5]
    job = json.dumps({"model": "wine-xgb-audit", "target": 0})
    r = client.post(
        "/v2/jobs/upload", data={"job": job}, files={"file": ("rows.csv", csv_of(rows))}
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    for _ in range(240):
        status = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            break
        time.sleep(0.25)
    assert status["status"] == "succeeded", status
    assert status["summary"]["feature_names"] == NAMES
    lines = client.get(f"/v2/jobs/{job_id}/results").text.splitlines()
    results = [json.loads(line) for line in lines if line.strip()]
    assert len(results) == 5
    direct = explain(client, "wine-xgb-audit", {"inputs": rows.to_dict("records"), "target": 0})
    for res, e in zip(sorted(results, key=lambda x: x["index"]), direct, strict=True):
        np.testing.assert_allclose(res["explanation"]["values"], e["values"], atol=1e-6)


def test_xgboost_regressor_ubjson_and_array_models(client: TestClient) -> None:
    import xgboost as xgb

    diabetes = load_diabetes(as_frame=True)
    reg = xgb.XGBRegressor(n_estimators=10, max_depth=2, random_state=0, n_jobs=1)
    reg.fit(diabetes.data, diabetes.target)
    meta = register(client, "diab-xgb", bytes(reg.get_booster().save_raw("ubj")))
    assert meta["task"] == "regression" and meta["output_names"] == ["prediction"]
    assert meta["feature_names"] == list(diabetes.data.columns)
    row = diabetes.data.iloc[:1]
    (e,) = explain(client, "diab-xgb", {"inputs": row.values.tolist()})
    assert e["base_value"] + sum(e["values"]) == pytest.approx(float(reg.predict(row)[0]), 1e-4)
    # Trained on arrays: no stored names (x0...); declared names are then free to choose.
    binary = (Y == 1).astype(int)
    arrays = xgb.XGBClassifier(n_estimators=5, max_depth=2, n_jobs=1).fit(X.values, binary)
    raw = bytes(arrays.get_booster().save_raw("json"))
    meta = register(client, "wine-xgb-arrays", raw)
    assert meta["feature_names"] == [f"x{i}" for i in range(13)]
    assert meta["output_names"] == ["0", "1"] and meta["task"] == "classification"
    renamed = {"feature_names": json.dumps(NAMES), "output_names": '["other", "class_1"]'}
    r = post(client, "wine-xgb-renamed", raw, renamed)
    assert r.status_code == 201, r.text
    assert r.json()["feature_names"] == NAMES and r.json()["output_names"] == ["other", "class_1"]


def test_lightgbm_dataframe_and_placeholder_names(client: TestClient) -> None:
    import lightgbm as lgb

    est = lgb.LGBMClassifier(n_estimators=10, random_state=0, verbose=-1, n_jobs=1).fit(X, Y)
    meta = register(client, "wine-lgb", est.booster_.model_to_string().encode())
    assert meta["feature_names"] == NAMES and meta["output_names"] == ["0", "1", "2"]
    assert meta["task"] == "classification" and meta["inputs"][0]["shape"] == [-1, 13]
    rows = X.iloc[[0, 140]]
    got = explain(client, "wine-lgb", {"inputs": rows.to_dict("records"), "target": 2})
    contribs = np.asarray(est.booster_.predict(rows, pred_contrib=True)).reshape(2, 3, 14)
    for e, c in zip(got, contribs, strict=True):
        np.testing.assert_allclose(e["values"], c[2, :-1], atol=1e-6)
    # On arrays LightGBM writes Column_0...: not names the user chose, so not stated.
    arrays = lgb.LGBMRegressor(n_estimators=5, verbose=-1, n_jobs=1).fit(X.values, Y)
    meta = register(client, "wine-lgb-arrays", arrays.booster_.model_to_string().encode())
    assert meta["feature_names"] == [f"x{i}" for i in range(13)]
    assert meta["task"] == "regression" and meta["output_names"] == ["prediction"]


def skl_onnx(zipmap: bool, mlp: bool = False) -> tuple[bytes, Any, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = X.values[:, :6].astype(np.float32)
    labels = np.array(["barolo", "grignolino", "barbera"])[Y]
    est = MLPClassifier((8,), max_iter=300, random_state=0) if mlp else LogisticRegression()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = make_pipeline(StandardScaler(), est).fit(x, labels)
    onx = to_onnx(pipe, x[:1], options={id(pipe): {"zipmap": zipmap}})
    return onx.SerializeToString(), pipe, x


@pytest.mark.parametrize(("zipmap", "mlp"), [(True, False), (False, True)])
def test_onnx_classifier_labels(client: TestClient, zipmap: bool, mlp: bool) -> None:
    data, pipe, x = skl_onnx(zipmap, mlp)
    name = f"wine-onnx-{int(zipmap)}{int(mlp)}"
    meta = register(client, name, data)
    assert meta["output_names"] == ["barbera", "barolo", "grignolino"]  # sklearn's classes_
    assert meta["task"] == "classification" and meta["modality"] == "tabular"
    assert meta["inputs"][0]["shape"] == [-1, 6] and meta["feature_names"][0] == "x0"
    body = {"inputs": x[:2].tolist(), "background": x[::20].tolist(), "target": "barolo"}
    got = explain(client, name, body)
    probs = pipe.predict_proba(x[:2])[:, 1]
    for e, p in zip(got, probs, strict=True):
        assert e["exact"] and e["output_index"] == 1
        assert e["instance_output_value"] == pytest.approx(float(p), abs=1e-5)
        assert e["base_value"] + sum(e["values"]) == pytest.approx(float(p), abs=1e-5)


def test_onnx_regressor_and_image_model(client: TestClient) -> None:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    x = X.values[:, :6].astype(np.float32)
    onx = to_onnx(LinearRegression().fit(x, Y), x[:1]).SerializeToString()
    meta = register(client, "wine-onnx-reg", onx)
    assert meta["task"] == "regression" and meta["output_names"] == ["variable"]
    explain(client, "wine-onnx-reg", {"inputs": x[:1].tolist()})
    cnn = bm.torch_onnx()  # input x [n, 1, 8, 8], output p [n, 3]
    assert cnn.file is not None
    meta = register(client, "cnn-facts", cnn.file)
    assert meta["modality"] == "image" and meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
    assert meta["output_names"] == ["p_0", "p_1", "p_2"] and meta["task"] == "classification"
    body = {"inputs": cnn.rows[:1].tolist(), "parameters": {"patch_size": 4}}
    (e,) = explain(client, "cnn-facts", body)
    assert e["exact"] and len(e["values"]) == 4


def stored(client: TestClient, name: str) -> bool:
    user_dir = Path(client.app.state.settings.user_model_dir)  # type: ignore[attr-defined]
    return (user_dir / name).exists() or client.get(f"/v2/models/{name}").status_code != 404


def test_torchscript_states_nothing(client: TestClient) -> None:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 1)), buf)
    r = post(client, "ts-bare", buf.getvalue())
    assert r.status_code == 400 and r.json()["code"] == "invalid_input"
    assert all(f in r.json()["error"] for f in ("modality", "input_shape", "output_names"))
    assert not stored(client, "ts-bare")


CONTRADICTIONS = [
    ({"input_shape": "[10]"}, ["input_shape [10]", "reads 13 features"]),
    ({"output_names": '["a", "b", "c"]'}, ["lists 3 names", "2 outputs ['0', '1']"]),
    ({"task": "regression"}, ["task 'regression'", "classification objective"]),
    ({"modality": "image"}, ["modality 'image'", "tabular"]),
    (
        {"feature_names": json.dumps([f"x{i}" for i in range(13)])},
        ["feature_names ['x0', 'x1'", "stores ['alcohol', 'malic_acid'"],
    ),
]


@pytest.mark.parametrize(("fields", "named"), CONTRADICTIONS)
def test_contradicting_declarations(
    client: TestClient, tmp_path: Path, fields: dict[str, str], named: list[str]
) -> None:
    r = post(client, "wine-xgb-wrong", xgb_json(xgb_wine(binary=True), tmp_path), fields)
    assert r.status_code == 400 and r.json()["code"] == "invalid_model", r.text
    for text in named:
        assert text in r.json()["error"], r.json()["error"]
    assert not stored(client, "wine-xgb-wrong")


def test_onnx_contradictions(client: TestClient) -> None:
    data, _, _ = skl_onnx(zipmap=True)
    for fields, text in [
        ({"input_shape": "[1, 8, 8]"}, "input_shape [1, 8, 8] has 64 values per row"),
        ({"output_names": '["a", "b"]'}, "3 outputs ['barbera', 'barolo', 'grignolino']"),
        ({"modality": "image"}, "has a tabular input"),
    ]:
        r = post(client, "wine-onnx-wrong", data, fields)
        assert r.status_code == 400 and text in r.json()["error"], r.text
    assert not stored(client, "wine-onnx-wrong")


@pytest.mark.parametrize(
    "build",
    [
        lambda: bm.xgboost_frame("xgb-frame-cat", "multiclass", categorical=True),
        lambda: bm.lightgbm_frame("lgbm-frame-cat", "multiclass", categorical=True),
    ],
)
def test_categorical_dataframe_boosters(client: TestClient, build: Any) -> None:
    model = build()
    assert model.file is not None
    meta = register(client, model.name, model.file)
    assert meta["feature_names"] == json.loads(model.form["feature_names"])
    assert meta["output_names"] == ["0", "1", "2"] and meta["task"] == "classification"
    rows = np.asarray(model.rows, dtype=np.float64)
    body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.reshape(-1).tolist()}]}  # fmt: skip
    r = client.post(f"/v2/models/{model.name}/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    got = np.asarray(out["data"]).reshape(out["shape"])
    np.testing.assert_allclose(got, model.predict(rows), rtol=1e-5, atol=1e-6)
    explain(client, model.name, {"inputs": rows[:1].tolist()})
