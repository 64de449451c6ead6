"""Models as users bring them, built here with fixed seeds: model files plus registration forms.

Each builder returns a `UserModel`: the file bytes, the form fields, and a local reference that
predicts what the registered model must predict (the library's own predictor).
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

N_TAB = 6  # features of the tabular user models: 2^6 coalitions keep exact answers cheap


@dataclass
class UserModel:
    name: str
    file: bytes | None
    form: dict[str, str]
    predict: Callable[[np.ndarray], np.ndarray]  # the reference: rows -> [m, k]
    rows: np.ndarray  # valid instances
    background: np.ndarray  # rows to send as a background
    native: Any = None  # the library object (booster, sklearn estimator)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # extra uploads

    def upload(self) -> dict[str, tuple[str, bytes]]:
        out = dict(self.files)
        if self.file is not None:
            out["file"] = ("model.bin", self.file)
        return out


def _form(
    name: str, shape: list[int], outputs: list[str], task: str, **extra: str
) -> dict[str, str]:
    size = int(np.prod(shape))
    return {
        "name": name,
        "modality": "image" if len(shape) > 1 else "tabular",
        "input_shape": json.dumps(shape),
        "output_names": json.dumps(outputs),
        "feature_names": json.dumps([f"f{i}" for i in range(size)]),
        "task": task,
        **extra,
    }


def tabular_data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [m, N_TAB], y): diabetes (regression) or breast cancer (binary)."""
    loader = load_diabetes if kind == "regression" else load_breast_cancer
    x, y = loader(return_X_y=True)
    return x[:, :N_TAB].astype(np.float32), y


def sklearn_onnx(name: str = "skl-onnx", task: str = "classification") -> UserModel:
    """A StandardScaler + MLP pipeline converted by skl2onnx (zipmap off for classifiers)."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = tabular_data(task)
    size = (16,)
    est = (
        MLPClassifier(hidden_layer_sizes=size, max_iter=300, random_state=0)
        if task == "classification"
        else MLPRegressor(hidden_layer_sizes=size, max_iter=300, random_state=0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of a small fixed-seed fit
        pipe = make_pipeline(StandardScaler(), est).fit(x, y)
    options = {id(pipe): {"zipmap": False}} if task == "classification" else None
    onx = to_onnx(pipe, x[:1], options=options)
    outputs = ["malignant", "benign"] if task == "classification" else ["progression"]
    predict = pipe.predict_proba if task == "classification" else (
        lambda r: pipe.predict(r).reshape(-1, 1)
    )
    extra = {"onnx_output": "probabilities"} if task == "classification" else {}
    return UserModel(
        name, onx.SerializeToString(), _form(name, [N_TAB], outputs, task, **extra),
        predict, x[:4], x[100:120], pipe,
    )  # fmt: skip


class _Digits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(256, 3), torch.nn.Softmax(dim=1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _images() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.uniform(0, 1, (24, 1, 8, 8)).astype(np.float32)


def _torch_predict(net: torch.nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.from_numpy(np.asarray(x, np.float32).reshape(-1, 1, 8, 8))).numpy()

    return predict


def torch_onnx(name: str = "cnn-onnx") -> UserModel:
    """A small CNN exported by torch.onnx (the TorchScript-based exporter, dynamic batch)."""
    net = _Digits().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.zeros(1, 1, 8, 8),), buf,  # type: ignore[arg-type]  # a file object works
            input_names=["x"], output_names=["p"], dynamic_axes={"x": {0: "n"}, "p": {0: "n"}},
            dynamo=False,
        )  # fmt: skip
    images = _images()
    form = _form(name, [1, 8, 8], ["a", "b", "c"], "classification", input_range="[0, 1]")
    return UserModel(name, buf.getvalue(), form, _torch_predict(net), images[:2], images[8:])


def torchscript_cnn(name: str = "cnn-traced", traced: bool = True) -> UserModel:
    """The same CNN as TorchScript: traced (torch.jit.trace) or scripted."""
    net = _Digits().eval()
    module = torch.jit.trace(net, torch.zeros(1, 1, 8, 8)) if traced else torch.jit.script(net)
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    images = _images()
    form = _form(name, [1, 8, 8], ["a", "b", "c"], "classification", input_range="[0, 1]")
    return UserModel(name, buf.getvalue(), form, _torch_predict(net), images[:2], images[8:])


class ConstScale(torch.nn.Module):
    """A forward that builds a constant tensor: inference tensors must never leak into it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).sum(dim=1, keepdim=True)


def scripted_linear(name: str = "linear-scripted") -> UserModel:
    module = torch.jit.script(ConstScale())
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    x, _ = tabular_data("regression")
    w = np.arange(1, 7, dtype=np.float64)
    return UserModel(
        name, buf.getvalue(), _form(name, [N_TAB], ["y"], "regression"),
        lambda r: (np.asarray(r, np.float64) @ w).reshape(-1, 1), x[:4], x[100:120],
    )  # fmt: skip


def xgboost_model(name: str = "xgb", task: str = "regression", ubj: bool = False) -> UserModel:
    import xgboost as xgb

    x, y = tabular_data(task)
    cls = xgb.XGBRegressor if task == "regression" else xgb.XGBClassifier
    est = cls(n_estimators=30, max_depth=3, random_state=0, n_jobs=1).fit(x, y)
    raw = bytes(est.get_booster().save_raw("ubj" if ubj else "json"))
    outputs = ["progression"] if task == "regression" else ["malignant", "benign"]
    predict = (lambda r: est.predict(r).reshape(-1, 1)) if task == "regression" else (
        est.predict_proba
    )
    form = _form(name, [N_TAB], outputs, task)
    return UserModel(name, raw, form, predict, x[:4], x[100:120], est)


def lightgbm_model(name: str = "lgbm") -> UserModel:
    """A three-class LightGBM booster in its text format (iris, 4 features)."""
    import lightgbm as lgb

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    est = lgb.LGBMClassifier(n_estimators=30, random_state=0, verbose=-1, n_jobs=1).fit(x, y)
    text = est.booster_.model_to_string().encode()
    form = _form(name, [4], ["setosa", "versicolor", "virginica"], "classification")
    return UserModel(
        name, text, form, lambda r: np.asarray(est.predict_proba(r)), x[[0, 60, 120]], x[::10], est
    )


def csv_background(rows: np.ndarray) -> bytes:
    header = ",".join(f"f{i}" for i in range(rows.shape[1]))
    lines = [",".join(repr(float(v)) for v in row) for row in rows]
    return ("\n".join([header, *lines]) + "\n").encode()


# Boosters trained on pandas DataFrames, the usual way: the file stores the column names (and
# types: "c" for XGBoost categoricals, pandas_categorical for LightGBM). Rows reach the service
# as numbers, a categorical column as its category codes; the reference predicts on the
# DataFrame those numbers stand for.
BAND = "alcohol_band"  # the categorical column of the categorical fixtures
BANDS = ["high", "low", "mid"]  # its categories, in pandas' (sorted) order: codes 0, 1, 2


def frame_data(kind: str, categorical: bool = False) -> tuple[Any, Any]:
    """(X DataFrame, y): wine (three classes, 13 features), its class 1 vs rest ("binary"), or
    diabetes (regression, 10); with a categorical column, wine's alcohol as a band."""
    import pandas as pd
    from sklearn.datasets import load_wine

    if kind == "regression":
        x, y = load_diabetes(return_X_y=True, as_frame=True)
        return x, y
    x, y = load_wine(return_X_y=True, as_frame=True)
    if categorical:
        band = np.where(x["alcohol"] > 13.2, "high", np.where(x["alcohol"] > 12.4, "mid", "low"))
        x = x.drop(columns=["alcohol"]).assign(**{BAND: pd.Categorical(band, categories=BANDS)})
    return x, ((y == 1).astype(int) if kind == "binary" else y)


def as_numbers(x: Any) -> np.ndarray:
    """A DataFrame as the numbers a user sends: category codes for categorical columns."""
    cols = [x[c].cat.codes if str(x[c].dtype) == "category" else x[c] for c in x.columns]
    return np.stack([np.asarray(c, np.float64) for c in cols], axis=1)


def as_frame(rows: np.ndarray, like: Any) -> Any:
    """Numbers back to a DataFrame with `like`'s columns and dtypes (codes -> categories)."""
    import pandas as pd

    rows = np.asarray(rows, np.float64).reshape(len(rows), -1)
    data = {}
    for i, c in enumerate(like.columns):
        if str(like[c].dtype) == "category":
            cats = like[c].cat.categories
            data[c] = pd.Categorical.from_codes(rows[:, i].astype(int), categories=cats)
        else:
            data[c] = rows[:, i]
    return pd.DataFrame(data)


def _frame_form(name: str, x: Any, outputs: list[str], task: str) -> dict[str, str]:
    return {
        "name": name,
        "modality": "tabular",
        "input_shape": json.dumps([x.shape[1]]),
        "output_names": json.dumps(outputs),
        "feature_names": json.dumps(list(x.columns)),
        "task": task,
    }


def _saved(save: Callable[[str], Any], suffix: str) -> bytes:
    """What `save_model(path)` writes, as the user uploads it."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / f"m.{suffix}")
        save(path)
        return Path(path).read_bytes()


def xgboost_frame(
    name: str = "xgb-frame",
    kind: str = "multiclass",
    objective: str | None = None,
    categorical: bool = False,
) -> UserModel:
    """An XGBoost classifier ("multiclass" wine, "binary" wine class 1) or regressor
    ("regression" diabetes; `objective` e.g. count:poisson) fitted on a DataFrame and saved
    with `save_model("m.json")`; categorical: a pandas category column, enable_categorical."""
    import xgboost as xgb

    x, y = frame_data(kind, categorical)
    common: dict[str, Any] = {"n_estimators": 30, "max_depth": 3, "random_state": 0, "n_jobs": 1}
    if categorical:
        common.update(enable_categorical=True, tree_method="hist")
    if kind == "regression":
        est: Any = xgb.XGBRegressor(objective=objective or "reg:squarederror", **common)
        est.fit(x, y)
        outputs = ["progression"]

        def predict(r: np.ndarray) -> np.ndarray:
            return np.asarray(est.predict(as_frame(r, x))).reshape(-1, 1)
    else:
        est = xgb.XGBClassifier(**common).fit(x, y)
        outputs = ["class_0", "class_1", "class_2"] if kind == "multiclass" else ["rest", "class_1"]

        def predict(r: np.ndarray) -> np.ndarray:
            return np.asarray(est.predict_proba(as_frame(r, x)))

    rows = as_numbers(x)
    task = "regression" if kind == "regression" else "classification"
    data = _saved(est.save_model, "json")
    return UserModel(
        name, data, _frame_form(name, x, outputs, task), predict, rows[[0, 70, 150]],
        rows[::7][:20], est,
    )  # fmt: skip


def lightgbm_frame(
    name: str = "lgbm-frame", kind: str = "multiclass", categorical: bool = True
) -> UserModel:
    """A LightGBM classifier on a wine DataFrame ("multiclass", "binary"; with a pandas
    categorical column: LightGBM's own categorical splits) or a regressor on diabetes
    ("regression"), saved with `booster_.save_model("m.txt")`."""
    import lightgbm as lgb

    x, y = frame_data(kind, categorical)
    common: dict[str, Any] = {"n_estimators": 30, "random_state": 0, "verbose": -1, "n_jobs": 1}
    if kind == "regression":
        est: Any = lgb.LGBMRegressor(**common).fit(x, y)
        outputs, task = ["progression"], "regression"

        def predict(r: np.ndarray) -> np.ndarray:
            return np.asarray(est.predict(as_frame(r, x))).reshape(-1, 1)
    else:
        est = lgb.LGBMClassifier(**common).fit(x, y)
        outputs = ["class_0", "class_1", "class_2"] if kind == "multiclass" else ["rest", "class_1"]
        task = "classification"

        def predict(r: np.ndarray) -> np.ndarray:
            return np.asarray(est.predict_proba(as_frame(r, x)))

    data = _saved(est.booster_.save_model, "txt")
    rows = as_numbers(x)
    return UserModel(
        name, data, _frame_form(name, x, outputs, task), predict, rows[[0, 70, 150]],
        rows[::7][:20], est,
    )  # fmt: skip
