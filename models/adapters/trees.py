"""XGBoost and LightGBM boosters read by their own libraries (never unpickled), with the
libraries' own exact path-dependent TreeSHAP and shap's interventional TreeSHAP (Lundberg et al.,
Nature MI 2020).

Boosters trained on pandas DataFrames keep their column names and types (categorical features
included); rows arrive as numbers (category codes for categorical columns, the codes of the
training DataFrame's categories), and every call passes the booster's own names and types so that
XGBoost's feature validation accepts them.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import ModelError

if TYPE_CHECKING:
    from models.declaration import Declaration


class BoosterError(ModelError):
    """The booster file cannot serve the declared model."""


# The link of each objective: prediction = exp(margin) for these (XGBoost's and LightGBM's docs).
XGBOOST_LOG_LINK = frozenset(
    {"count:poisson", "reg:gamma", "reg:tweedie", "survival:cox", "survival:aft"}
)
LIGHTGBM_LINKS = {
    "poisson": "log", "gamma": "log", "tweedie": "log", "cross_entropy_lambda": "other"
}  # fmt: skip
LINKS = ("identity", "log", "logistic", "softmax", "other")


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
    categorical = False  # some split is categorical (shap's interventional TreeSHAP has none)

    def __init__(self, kind: str, n_classes: int, n_features: int, link: str) -> None:
        self.kind = kind  # "binary" | "multiclass" | "regression"
        self.n_classes = n_classes
        self.n_features = n_features
        self.link = link  # prediction = link^-1(margin): LINKS
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

    def why_not_interventional(self, prediction: bool) -> str | None:
        """Why interventional TreeSHAP cannot explain the margin (or, `prediction`, the model's
        prediction) exactly; None: it can."""
        if self.categorical:
            return (
                f"shap's interventional TreeSHAP does not evaluate the categorical splits of "
                f"this {self.library} model"
            )
        if prediction and self.link != "identity":
            # shap/cext/tree_shap.h (dense_independent): with a transform, each background
            # row's margin values are scaled by (f(x) - f(b)) / (m(x) - m(b)); additive, but not
            # the Shapley values of the prediction's game (0.12 off on a 6-feature classifier).
            return (
                "interventional TreeSHAP is exact in the margin; the prediction is a nonlinear "
                f"function of it ({self.link} link), for which shap only rescales the margin "
                "values, so the prediction is explained model-agnostically"
            )
        return None

    def interventional_values(
        self, x: np.ndarray, background: np.ndarray, prediction: bool = False
    ) -> np.ndarray:
        """shap's exact interventional TreeSHAP of rows x against the background rows: float64
        [m, k, n] for the served outputs, of the margin (the prediction, too, for an identity
        link).

        Values only: the expected margin is the booster's own mean over the background (shap's
        expected_value misses XGBoost's per-class base scores)."""
        import shap

        reason = self.why_not_interventional(prediction)
        if reason is not None:
            raise BoosterError(reason)
        rows, bg = self._shap_rows(x), self._shap_rows(background)
        masker = shap.maskers.Independent(bg, max_samples=len(bg))  # every row, none sampled
        parts = []
        with self.lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # shap's notices about background sizes and dtypes
            for model in self._shap_models():
                explainer = shap.TreeExplainer(
                    model, data=masker, feature_perturbation="interventional"
                )
                sv = np.asarray(explainer.shap_values(rows, check_additivity=False))
                parts.append(sv.reshape(len(rows), self.n_features, -1))  # [m, n, outputs]
        values = np.concatenate(parts, axis=2).transpose(0, 2, 1).astype(np.float64)
        if self.kind == "binary":  # class 0's log-odds: minus class 1's
            values = np.concatenate([-values, values], axis=1)
        return values

    def _shap_models(self) -> list[Any]:
        """What shap.TreeExplainer reads, one model per group of outputs."""
        raise NotImplementedError

    def _shap_rows(self, x: np.ndarray) -> np.ndarray:
        return self._rows(x)

    def _rows(self, x: np.ndarray) -> np.ndarray:
        # float64: LightGBM compares against float64 thresholds that can sit between a value and
        # its float32 rounding (XGBoost rounds to float32 itself, as it was trained).
        return np.ascontiguousarray(x, dtype=np.float64).reshape(x.shape[0], -1)


class XGBoostBooster(_Booster):
    library = "xgboost"
    has_interactions = True

    def __init__(self, data: bytes) -> None:
        import xgboost as xgb

        from models.adapters.booster_check import xgboost_checked

        data = xgboost_checked(data)  # a malformed file crashes the library: refused first
        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(data))
        except Exception as exc:
            raise BoosterError(f"not an XGBoost model (JSON or UBJSON): {exc}") from None
        booster.set_param({"nthread": max(1, torch.get_num_threads())})
        config = json.loads(booster.save_config())
        objective = config["learner"]["objective"]["name"]
        n_classes = int(config["learner"]["learner_model_param"].get("num_class", "0") or 0)
        link = "identity"
        if objective in ("binary:logistic", "binary:logitraw", "reg:logistic"):
            kind = "binary" if objective != "reg:logistic" else "regression"
            link = "logistic"
        elif objective in ("multi:softprob", "multi:softmax"):
            kind, link = "multiclass", "softmax"
        elif objective.startswith(("reg:", "count:", "survival:")):
            kind = "regression"
            link = "log" if objective in XGBOOST_LOG_LINK else "identity"
        else:
            raise BoosterError(f"XGBoost objective {objective!r} is not supported")
        super().__init__(kind, n_classes, booster.num_features(), link)
        self.objective = objective
        self.booster = booster
        self.xgb = xgb
        # A booster fitted on a DataFrame names its columns (and marks categorical ones "c"):
        # a DMatrix of plain rows must carry the same names and types, or XGBoost refuses it.
        self.feature_names = booster.feature_names
        self.feature_types = booster.feature_types
        self.categorical = any(t == "c" for t in self.feature_types or ())

    def _dmatrix(self, x: np.ndarray) -> Any:
        return self.xgb.DMatrix(
            x,
            feature_names=self.feature_names,
            feature_types=self.feature_types,
            enable_categorical=self.categorical,
        )

    def _raw_margin(self, x: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(x, predict_type="margin")

    def _raw_predict(self, x: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(x)

    def _raw_contribs(self, x: np.ndarray) -> np.ndarray:
        return self.booster.predict(self._dmatrix(x), pred_contribs=True)

    def _shap_models(self) -> list[Any]:
        return [self.booster]

    def _shap_rows(self, x: np.ndarray) -> np.ndarray:
        # XGBoost compares float32 inputs with float32 thresholds: the rows as it reads them.
        return self._rows(x).astype(np.float32).astype(np.float64)

    def interactions(self, x: np.ndarray) -> np.ndarray | None:
        with self.lock:
            raw = self.booster.predict(self._dmatrix(self._rows(x)), pred_interactions=True)
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

        from models.adapters.lightgbm_check import lightgbm_checked

        data = lightgbm_checked(data)  # a malformed file crashes the library: refused first
        try:
            booster = lgb.Booster(model_str=data.decode("utf-8"))
        except Exception as exc:
            raise BoosterError(f"not a LightGBM model (text format): {exc}") from None
        dump = booster.dump_model()
        objective = str(dump.get("objective", "")).split()[0]
        per_iteration = booster.num_model_per_iteration()
        link = "identity"
        if objective in ("binary", "cross_entropy", "xentropy"):
            kind = "binary" if objective == "binary" else "regression"
            link = "logistic"
        elif objective in ("multiclass", "softmax", "multiclassova", "multiclass_ova", "ova"):
            kind, link = "multiclass", "softmax"
            if objective != "multiclass" and objective != "softmax":
                raise BoosterError("LightGBM one-vs-all objectives are not supported")
        elif objective in ("lambdarank", "rank_xendcg"):
            raise BoosterError("LightGBM ranking objectives are not supported here")
        else:
            kind = "regression"
            link = LIGHTGBM_LINKS.get(objective, "identity")
        super().__init__(
            kind, per_iteration if kind == "multiclass" else 0, booster.num_feature(), link
        )
        self.objective = objective
        self.booster = booster
        self.threads = max(1, torch.get_num_threads())
        self.trees: list[dict[str, Any]] = dump["tree_info"]
        self.per_iteration = per_iteration
        # pandas categoricals (and categorical_feature) become "==" splits on category codes
        self.categorical = any(_has_categorical_split(t["tree_structure"]) for t in self.trees)
        self._cuts: list[np.ndarray] = []
        self._ranked: list[dict[str, Any]] | None = None  # built on first use (_shap_models)

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

    def _shap_models(self) -> list[Any]:
        # shap reads a multiclass lgb.Booster as one output (every class's trees summed): one
        # model per class instead, tree i belonging to class i % per_iteration. LightGBM folds
        # its initial score into the first trees, so there is no base offset. The trees split
        # on ranks (_shap_rows), each threshold on its rank + 0.5.
        if self._ranked is None:
            self._cuts = _thresholds(self.trees, self.n_features)
            self._ranked = [_ranked(t, self._cuts) for t in self.trees]
        k = self.per_iteration
        return [
            {
                "trees": self._ranked[c::k],
                "tree_output": "raw_value",
                "input_dtype": np.float64,
                "internal_dtype": np.float64,
            }
            for c in range(k)
        ]

    def _shap_rows(self, x: np.ndarray) -> np.ndarray:
        # shap's interventional traversal compares with float32 thresholds (`float thres` in
        # shap/cext/tree_shap.h), LightGBM with float64 ones: a value within float32 rounding
        # of a threshold goes the wrong way (1.27 off on a diabetes row). Ranks route alike in
        # both: a value's rank is the number of the feature's thresholds below it.
        if self._ranked is None:
            self._shap_models()
        rows = self._rows(x)
        out = np.empty_like(rows)
        for f, cuts in enumerate(self._cuts):
            out[:, f] = np.searchsorted(cuts, rows[:, f], side="left")
        out[np.isnan(rows)] = np.nan  # missing stays missing (the default child)
        return out


def _splits(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "split_index" in node:
        yield node
        yield from _splits(node["left_child"])
        yield from _splits(node["right_child"])


def _has_categorical_split(node: dict[str, Any]) -> bool:
    return any(n.get("decision_type") == "==" for n in _splits(node))


def _thresholds(trees: list[dict[str, Any]], n_features: int) -> list[np.ndarray]:
    """Each feature's sorted distinct thresholds (float64) over every numerical split."""
    found: list[set[float]] = [set() for _ in range(n_features)]
    for tree in trees:
        for node in _splits(tree["tree_structure"]):
            found[node["split_feature"]].add(float(node["threshold"]))
    return [np.array(sorted(f), dtype=np.float64) for f in found]


def _ranked(tree: dict[str, Any], cuts: list[np.ndarray]) -> dict[str, Any]:
    """A copy of a dumped tree whose thresholds are ranks + 0.5: x <= t iff rank(x) <= it."""

    def copy(node: dict[str, Any]) -> dict[str, Any]:
        if "split_index" not in node:
            return dict(node)
        rank = int(np.searchsorted(cuts[node["split_feature"]], float(node["threshold"])))
        return {
            **node,
            "threshold": rank + 0.5,
            "left_child": copy(node["left_child"]),
            "right_child": copy(node["right_child"]),
        }

    return {**tree, "tree_structure": copy(tree["tree_structure"])}


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
