"""Interventional TreeSHAP of users' boosters (trained on DataFrames) through the library path:
equal to shap's TreeExplainer(data=background, feature_perturbation="interventional") and to
enumerating the interventional game; efficient against the booster's own output; the output
space said for every objective; honest fallbacks where shap has no exact answer."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from math import factorial
from typing import Any

import numpy as np
import pytest
import shap

from explainers.explanation import OptionError
from explainers.masking import MaskerOptions
from explainers.shapley.explainer import ShapleyOptions, explain
from models.adapters.user import register
from models.base import Model
from tests import byom_models as bm
from tests.models.test_trees_frames import declaration

FIXTURES: dict[str, Callable[[str], bm.UserModel]] = {
    "xgb-multiclass": lambda n: bm.xgboost_frame(n, "multiclass"),
    "xgb-binary": lambda n: bm.xgboost_frame(n, "binary"),
    "xgb-regression": lambda n: bm.xgboost_frame(n, "regression"),
    "lgbm-multiclass": lambda n: bm.lightgbm_frame(n, "multiclass", categorical=False),
    "lgbm-binary": lambda n: bm.lightgbm_frame(n, "binary", categorical=False),
    "lgbm-regression": lambda n: bm.lightgbm_frame(n, "regression"),
}
_CACHE: dict[str, tuple[bm.UserModel, Model]] = {}


def fitted(name: str, background: bool = False) -> tuple[bm.UserModel, Model]:
    """The fixture and its registered model (with its 20 background rows stored, or none)."""
    key = f"{name}{'+bg' if background else ''}"
    if key not in _CACHE:
        um = FIXTURES[name](name)
        assert um.file is not None
        files = {"model": um.file}
        if background:
            buf = io.BytesIO()
            np.save(buf, um.background)
            files["background"] = buf.getvalue()
        _CACHE[key] = (um, register(declaration(um), files)[0])
    return _CACHE[key]


def peer(um: bm.UserModel, bg: np.ndarray, output: str = "raw") -> shap.TreeExplainer:
    """shap's own interventional TreeSHAP on the user's fitted estimator, every row kept."""
    masker = shap.maskers.Independent(bg, max_samples=len(bg))
    return shap.TreeExplainer(
        um.native, data=masker, feature_perturbation="interventional", model_output=output
    )


def shap_values(explainer: shap.TreeExplainer, x: np.ndarray) -> np.ndarray:
    """[m, n, k] (one output: k = 1)."""
    sv = np.asarray(explainer.shap_values(x, check_additivity=False))
    return sv.reshape(len(x), x.shape[1], -1)


def rows(um: bm.UserModel) -> np.ndarray:
    x, _ = bm.frame_data("regression" if "regression" in um.name else "binary")
    return bm.as_numbers(x)[1::9][:20]  # 20 rows, none of them in the background


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_interventional_equals_shap_and_is_efficient(name: str) -> None:
    um, model = fitted(name)
    assert model.tree is not None
    x, bg = rows(um), um.background
    truth = shap_values(peer(um, bg), x)  # [m, n, k]
    if "binary" in name:  # shap's one output is class 1's log-odds; class 0's is its negative
        truth = np.concatenate([-truth, truth], axis=2)
    assert truth.shape[2] == model.n_outputs
    for out in range(model.n_outputs):
        result = explain(model, x, options=ShapleyOptions(), target=out, background=bg)
        params = result.parameters
        assert params["estimator"] == "tree" and params["output"] == "margin"
        assert params["masker"]["type"] == "interventional"
        assert params["masker"]["source"] == "request" and params["masker"]["rows"] == len(bg)
        assert params["output_space"] == ("raw" if "regression" in name else "log-odds")
        values = np.array([e.values for e in result.explanations])
        np.testing.assert_allclose(values, truth[:, :, out], atol=1e-6)
        for e, m in zip(result.explanations, model.tree.margin(x)[:, out], strict=True):
            assert e.exact and e.estimator == "tree" and not e.warnings
            assert e.instance_output_value == pytest.approx(m, abs=1e-9)  # the booster's own
            assert e.values.sum() + e.base_value == pytest.approx(m, rel=1e-6, abs=1e-5)
        # base: the booster's own mean margin over the background
        mean = model.tree.margin(bg)[:, out].mean()
        assert result.explanations[0].base_value == pytest.approx(mean, abs=1e-9)


def test_interventional_equals_enumerating_the_game() -> None:
    """Independent of shap: every coalition of the 10 diabetes features over the background,
    evaluated by the booster's own predict (the model-agnostic exact estimator)."""
    _, model = fitted("xgb-regression")
    um = _CACHE["xgb-regression"][0]
    x, bg = rows(um)[:2], um.background
    tree = explain(model, x, options=ShapleyOptions(), background=bg)
    exact = explain(model, x, options=ShapleyOptions(estimator="exact"), background=bg)
    assert exact.explanations[0].estimator == "exact"
    for t, e in zip(tree.explanations, exact.explanations, strict=True):
        # float32 at the end of Model.predict on the exact side: outputs of about 150
        np.testing.assert_allclose(t.values, e.values, atol=2e-4)
        assert t.base_value == pytest.approx(e.base_value, abs=2e-4)


def test_probability_is_exact_model_agnostic_not_shaps_rescaling() -> None:
    """shap's interventional model_output="probability" scales each background row's margin
    values by the change in probability (shap/cext/tree_shap.h): additive, but not the Shapley
    values of the probability game. We answer that game exactly (enumeration, 6 features) and
    say why TreeSHAP did not."""
    um = bm.xgboost_model("xgb-prob", "classification")
    assert um.file is not None
    model = register(declaration(um), {"model": um.file})[0]
    x, bg = um.rows[:1].astype(np.float64), um.background[:5].astype(np.float64)
    result = explain(model, x, options=ShapleyOptions(output="prediction"), target=1,
                     background=bg)  # fmt: skip
    assert "nonlinear" in fallback(result) and result.parameters["output_space"] == "probability"
    e = result.explanations[0]
    assert e.estimator == "exact" and e.exact
    truth = enumerate_game(lambda r: um.predict(r)[:, 1], x[0], bg)
    np.testing.assert_allclose(e.values, truth, atol=2e-6)
    rescaled = shap_values(peer(um, bg, "probability"), x)[0, :, 0]
    assert abs(rescaled.sum() - truth.sum()) < 1e-6  # both additive ...
    assert np.abs(rescaled - truth).max() > 0.05  # ... but shap's is another attribution


def enumerate_game(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, bg: np.ndarray) -> Any:
    """Shapley values of v(S) = mean over background rows b of f(x_S, b_rest), every S."""
    n = len(x)
    masks = np.array(list(itertools.product([False, True], repeat=n)))
    v = {tuple(m): float(np.mean(f(np.where(m, x, bg)))) for m in masks}
    phi = np.zeros(n)
    for m in masks:
        s = int(m.sum())
        for i in np.flatnonzero(m):
            without = m.copy()
            without[i] = False
            w = factorial(s - 1) * factorial(n - s) / factorial(n)
            phi[i] += w * (v[tuple(m)] - v[tuple(without)])
    return phi


def test_stored_background_and_masker_names() -> None:
    um, model = fitted("xgb-binary", background=True)
    x = rows(um)[:2]
    # The default request stays path-dependent, stored background or not.
    default = explain(model, x, options=ShapleyOptions())
    assert default.parameters["masker"]["type"] == "path-dependent"
    assert default.parameters["output_space"] == "log-odds"
    truth = shap_values(peer(um, um.background), x)[:, :, 0]
    for kind in ("background", "interventional"):
        options = ShapleyOptions(masker=MaskerOptions(type=kind))
        result = explain(model, x, options=options, target=1)
        masker = result.parameters["masker"]
        assert masker["type"] == "interventional" and masker["source"] == "model"
        assert masker["rows"] == len(um.background)
        np.testing.assert_allclose([e.values for e in result.explanations], truth, atol=1e-6)
    # output prediction: the probability game over the stored rows, model-agnostically
    result = explain(model, x[:1], options=ShapleyOptions(output="prediction"), target=1)
    assert "nonlinear" in fallback(result)
    assert result.parameters["masker"] == {"type": "background", "source": "model", "rows": 20}
    # no background anywhere: a clear error, as for the model-agnostic masker
    _, bare = fitted("xgb-binary")
    options = ShapleyOptions(masker=MaskerOptions(type="interventional"))
    with pytest.raises(OptionError, match="no default background"):
        explain(bare, x, options=options)


def fallback(result: Any) -> str:
    e = result.explanations[0]
    assert e.estimator != "tree"
    (caveat,) = [w for w in e.warnings if w.code == "estimator_fallback"]
    return str(caveat.message)


def test_fallbacks_say_why_and_tree_refuses() -> None:
    um, model = fitted("xgb-multiclass")
    x, bg = rows(um)[:1], um.background[:6]
    wine = bm.as_numbers(bm.frame_data("binary", categorical=True)[0])
    cases: list[tuple[Model, np.ndarray, np.ndarray, dict[str, Any], str]] = [
        (model, x, bg, {"output": "prediction"}, "softmax link"),
        (model, x, bg, {"index": "SII"}, "Shapley values only"),
    ]
    for cat in (
        bm.xgboost_frame("xgb-cat", "binary", categorical=True),
        bm.lightgbm_frame("lgbm-cat", "binary"),
    ):
        assert cat.file is not None
        m = register(declaration(cat), {"model": cat.file})[0]
        cases.append((m, wine[:1], wine[::30], {}, "categorical splits"))
    for m, rows_, back, params, why in cases:
        result = explain(m, rows_, options=ShapleyOptions(**params), target=1, background=back)
        assert why in fallback(result), (params, fallback(result))
        e = result.explanations[0]
        assert abs(e.values.sum() + e.base_value - e.instance_output_value) < 1e-4
        with pytest.raises(OptionError, match=why):
            explain(m, rows_, options=ShapleyOptions(estimator="tree", **params), target=1,
                    background=back)  # fmt: skip


def test_log_link_output_space() -> None:
    um = bm.xgboost_frame("xgb-poisson", "regression", "count:poisson")
    assert um.file is not None
    model = register(declaration(um), {"model": um.file})[0]
    x = um.rows
    result = explain(model, x, options=ShapleyOptions())
    assert result.parameters["output_space"] == "log"
    pred = um.predict(x)[:, 0]
    for e, p in zip(result.explanations, pred, strict=True):
        assert e.instance_output_value == pytest.approx(np.log(p), abs=1e-5)  # margin = log(y)
    interventional = explain(model, x, options=ShapleyOptions(), background=um.background)
    assert interventional.parameters["output_space"] == "log"
    assert interventional.parameters["estimator"] == "tree"
    # The prediction exp(margin): shap has no such output, so model-agnostic, said so.
    options = ShapleyOptions(output="prediction")
    result = explain(model, x[:1], options=options, background=um.background[:5])
    assert "log link" in fallback(result) and result.parameters["output_space"] == "raw"
    # An identity link: the prediction is the margin, explained by interventional TreeSHAP.
    _, identity = fitted("xgb-regression")
    result = explain(identity, x[:1], options=options, background=um.background[:5])
    assert result.parameters["estimator"] == "tree"
    assert result.parameters["output_space"] == "raw"


def test_lightgbm_value_within_float32_rounding_of_a_threshold() -> None:
    """shap's interventional traversal holds thresholds as float32; LightGBM splits on float64.
    A value just above a threshold t, below float32(t), must go right as in LightGBM: exact
    values, efficient against the booster, equal to enumerating the game."""
    um, model = fitted("lgbm-regression")
    tree = model.tree
    assert tree is not None
    booster = um.native.booster_
    f, t = next(
        (n["split_feature"], float(n["threshold"]))
        for tree_info in booster.dump_model()["tree_info"]
        for n in splits(tree_info["tree_structure"])
        if abs(n["threshold"]) > 1e-30 and f32(n["threshold"]) != n["threshold"]
    )  # a threshold that float32 cannot hold
    x = um.rows[:1].copy()
    x[0, f] = np.nextafter(t, np.inf) if f32(t) > t else t  # LightGBM: right / left
    assert (x[0, f] > t) != (x[0, f] > f32(t))  # float32 routes it the other way
    bg = um.background
    result = explain(model, x, options=ShapleyOptions(), background=bg)
    e = result.explanations[0]
    assert e.estimator == "tree" and not e.warnings
    assert e.instance_output_value == pytest.approx(float(booster.predict(x)[0]), abs=1e-9)
    assert e.values.sum() + e.base_value == pytest.approx(e.instance_output_value, abs=1e-4)
    exact = explain(model, x, options=ShapleyOptions(estimator="exact"), background=bg)
    np.testing.assert_allclose(e.values, exact.explanations[0].values, atol=2e-4)


def f32(v: float) -> float:
    """v rounded to float32, as a float64 (numpy would compare a float32 in float32)."""
    return float(np.float32(v))


def splits(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The split nodes of a dumped LightGBM tree."""
    if "split_index" in node:
        yield node
        yield from splits(node["left_child"])
        yield from splits(node["right_child"])
