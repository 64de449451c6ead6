"""XGBoost and LightGBM boosters read by their own libraries (never unpickled), with the
libraries' own exact path-dependent TreeSHAP (Lundberg et al., Nature MI 2020)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import ModelError

if TYPE_CHECKING:
    from models.declaration import Declaration


class BoosterError(ModelError):
    """The booster file cannot serve the declared model."""


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class _Booster:
    """What both libraries share: margins as [m, k], the link to the prediction, contributions.

    Binary classifiers have one margin m (log-odds of class 1); it is served as two columns
    [-m, m], each class's log-odds, so targets index margins and probabilities alike.
    """

    library = ""
    has_interactions = False

    def __init__(self, kind: str, n_classes: int, n_features: int) -> None:
        self.kind = kind  # "binary" | "multiclass" | "regression"
        self.n_classes = n_classes
        self.n_features = n_features
        self.lock = threading.Lock()  # boosters are not documented thread-safe for predict

    @property
    def n_outputs(self) -> int:
        return 2 if self.kind == "binary" else max(self.n_classes, 1)

    def _raw_margin(self, x: np.ndarray) -> np.ndarray:  # [m] or [m, k]
        raise NotImplementedError

    def _raw_contribs(self, x: np.ndarray) -> np.ndarray:  # [m, n+1] or [m, k, n+1]
        raise NotImplementedError

    def margin(self, x: np.ndarray) -> np.ndarray:
        with self.lock:
            raw = np.asarray(self._raw_margin(self._rows(x)), dtype=np.float64)
        if self.kind == "binary":
            raw = raw.reshape(-1)
            return np.stack([-raw, raw], axis=1)
        return raw.reshape(raw.shape[0], -1)

    def contributions(self, x: np.ndarray) -> np.ndarray:
        with self.lock:
            raw = np.asarray(self._raw_contribs(self._rows(x)), dtype=np.float64)
        if raw.ndim == 2:
            raw = raw[:, None, :]
        if self.kind == "binary":
            raw = np.concatenate([-raw, raw], axis=1)
        return raw

    def interactions(self, x: np.ndarray) -> np.ndarray | None:
        return None

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities for classifiers, the prediction for regressors: float [m, k]."""
        if self.kind == "binary":
            p = _sigmoid(self.margin(x)[:, 1])
            return np.stack([1 - p, p], axis=1)
        if self.kind == "multiclass":
            return _softmax(self.margin(x))
        with self.lock:
            return np.asarray(self._raw_predict(self._rows(x)), dtype=np.float64).reshape(-1, 1)

    def _raw_predict(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rows(self, x: np.ndarray) -> np.ndarray:
        # float64: LightGBM compares against float64 thresholds that can sit between a value and
        # its float32 rounding (XGBoost rounds to float32 itself, as it was trained).
        return np.ascontiguousarray(x, dtype=np.float64).reshape(x.shape[0], -1)


class XGBoostBooster(_Booster):
    library = "xgboost"
    has_interactions = True

    def __init__(self, data: bytes) -> None:
        import xgboost as xgb

        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(data))
        except Exception as exc:
            raise BoosterError(f"not an XGBoost model (JSON or UBJSON): {exc}") from None
        booster.set_param({"nthread": max(1, torch.get_num_threads())})
        config = json.loads(booster.save_config())
        objective = config["learner"]["objective"]["name"]
        n_classes = int(config["learner"]["learner_model_param"].get("num_class", "0") or 0)
        if objective in ("binary:logistic", "binary:logitraw", "reg:logistic"):
            kind = "binary" if objective != "reg:logistic" else "regression"
        elif objective in ("multi:softprob", "multi:softmax"):
            kind = "multiclass"
        elif objective.startswith(("reg:", "count:", "survival:")):
            kind = "regression"
        else:
            raise BoosterError(f"XGBoost objective {objective!r} is not supported")
        super().__init__(kind, n_classes, booster.num_features())
        self.objective = objective
        self.booster = booster
        self.xgb = xgb

    def _raw_margin(self, x: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(x, predict_type="margin")

    def _raw_predict(self, x: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(x)

    def _raw_contribs(self, x: np.ndarray) -> np.ndarray:
        return self.booster.predict(self.xgb.DMatrix(x), pred_contribs=True)

    def interactions(self, x: np.ndarray) -> np.ndarray | None:
        with self.lock:
            raw = self.booster.predict(self.xgb.DMatrix(self._rows(x)), pred_interactions=True)
        raw = np.asarray(raw, dtype=np.float64)
        if raw.ndim == 3:
            raw = raw[:, None]
        if self.kind == "binary":
            raw = np.concatenate([-raw, raw], axis=1)
        return raw


class LightGBMBooster(_Booster):
    library = "lightgbm"

    def __init__(self, data: bytes) -> None:
        import lightgbm as lgb

        try:
            booster = lgb.Booster(model_str=data.decode("utf-8"))
        except Exception as exc:
            raise BoosterError(f"not a LightGBM model (text format): {exc}") from None
        objective = str(booster.dump_model(num_iteration=0).get("objective", "")).split()[0]
        per_iteration = booster.num_model_per_iteration()
        if objective in ("binary", "cross_entropy", "xentropy"):
            kind = "binary" if objective == "binary" else "regression"
        elif objective in ("multiclass", "softmax", "multiclassova", "multiclass_ova", "ova"):
            kind = "multiclass"
            if objective != "multiclass" and objective != "softmax":
                raise BoosterError("LightGBM one-vs-all objectives are not supported")
        elif objective in ("lambdarank", "rank_xendcg"):
            raise BoosterError("LightGBM ranking objectives are not supported here")
        else:
            kind = "regression"
        super().__init__(kind, per_iteration if kind == "multiclass" else 0, booster.num_feature())
        self.objective = objective
        self.booster = booster
        self.threads = max(1, torch.get_num_threads())

    def _params(self) -> dict[str, Any]:
        return {"num_threads": self.threads}

    def _raw_margin(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(x, raw_score=True, **self._params()))

    def _raw_predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(x, **self._params()))

    def _raw_contribs(self, x: np.ndarray) -> np.ndarray:
        raw = np.asarray(self.booster.predict(x, pred_contrib=True, **self._params()))
        if self.kind == "multiclass":  # [m, k * (n + 1)], class-major
            raw = raw.reshape(raw.shape[0], self.n_classes, self.n_features + 1)
        return raw


def load_booster(data: bytes, decl: Declaration) -> _Booster:
    """The booster checked against its declaration: a black box (`predict`) and a tree
    ensemble (TreeSHAP), without a torch module."""
    booster: _Booster = (
        XGBoostBooster(data) if decl.format == "xgboost" else LightGBMBooster(data)
    )
    size = int(np.prod(decl.input_shape))
    if booster.n_features != size:
        raise BoosterError(
            f"the {booster.library} model reads {booster.n_features} features; input_shape "
            f"{list(decl.input_shape)} has {size}"
        )
    task = "regression" if booster.kind == "regression" else "classification"
    if task != decl.task:
        raise BoosterError(
            f"the {booster.library} objective is a {task} objective; the declaration says "
            f"task {decl.task!r}"
        )
    if len(decl.output_names) != booster.n_outputs:
        raise BoosterError(
            f"the model has {booster.n_outputs} outputs "
            f"({'class probabilities' if task == 'classification' else 'the prediction'}); "
            f"output_names lists {len(decl.output_names)}"
        )
    return booster
