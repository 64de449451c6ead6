"""Boosters trained on pandas DataFrames (column names and categorical types stored in the file)
predict, and explain by path-dependent TreeSHAP, exactly as their own library does on the
DataFrame, from the plain numbers (category codes) the service receives."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from models.adapters.user import register
from models.declaration import Declaration
from tests import byom_models as bm

# name -> (builder, the DataFrame it was fitted on: dataset kind, categorical column)
FIXTURES: dict[str, tuple[Callable[[str], bm.UserModel], str, bool]] = {
    "xgb-multiclass": (lambda n: bm.xgboost_frame(n, "multiclass"), "multiclass", False),
    "xgb-binary": (lambda n: bm.xgboost_frame(n, "binary"), "binary", False),
    "xgb-regression": (lambda n: bm.xgboost_frame(n, "regression"), "regression", False),
    "xgb-poisson": (
        lambda n: bm.xgboost_frame(n, "regression", "count:poisson"), "regression", False
    ),
    "xgb-categorical": (
        lambda n: bm.xgboost_frame(n, "binary", categorical=True), "binary", True
    ),
    "lgbm-categorical": (lambda n: bm.lightgbm_frame(n, "multiclass"), "multiclass", True),
    "lgbm-categorical-binary": (lambda n: bm.lightgbm_frame(n, "binary"), "binary", True),
}


def declaration(um: bm.UserModel) -> Declaration:
    """The registration form as a declaration, every field given explicitly."""
    form = um.form
    return Declaration(
        name=form["name"],
        modality="tabular",
        task=form["task"],
        input_shape=tuple(json.loads(form["input_shape"])),
        output_names=tuple(json.loads(form["output_names"])),
        feature_names=tuple(json.loads(form["feature_names"])),
        format="lightgbm" if um.name.startswith("lgbm") else "xgboost",
    )


def native_contribs(um: bm.UserModel, frame: Any) -> np.ndarray:
    """The library's own TreeSHAP on the DataFrame: [m, k, n + 1], binary as [-c, c]."""
    import xgboost as xgb

    est = um.native
    if um.name.startswith("lgbm"):
        raw = np.asarray(est.predict(frame, pred_contrib=True))
    else:
        dm = xgb.DMatrix(frame, enable_categorical=True)
        raw = np.asarray(est.get_booster().predict(dm, pred_contribs=True))
    raw = raw.reshape(len(frame), -1, frame.shape[1] + 1)
    binary = getattr(est, "n_classes_", 0) == 2
    return np.concatenate([-raw, raw], axis=1) if binary else raw


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_frame_boosters_match_their_library_on_the_dataframe(name: str) -> None:
    build, data, categorical = FIXTURES[name]
    um = build(name)
    assert um.file is not None
    model, _ = register(declaration(um), {"model": um.file})
    x, _ = bm.frame_data(data, categorical)
    rows = bm.as_numbers(x)
    # float32 at the end of Model.predict: the same tolerance as the other black boxes
    np.testing.assert_allclose(model.predict(rows), um.predict(rows), rtol=1e-5, atol=1e-6)
    tree = model.tree
    assert tree is not None
    contribs = tree.contributions(rows[:25])
    np.testing.assert_allclose(contribs, native_contribs(um, x.iloc[:25]), atol=1e-6)
    np.testing.assert_allclose(contribs.sum(axis=2), tree.margin(rows[:25]), atol=1e-4)
    if tree.has_interactions:  # XGBoost's interaction values from the same named DMatrix
        phi = tree.interactions(rows[:2])
        assert phi is not None
        np.testing.assert_allclose(phi.sum(axis=3), contribs[:2], atol=1e-4)


def test_poisson_margin_is_the_log_of_the_prediction() -> None:
    um = bm.xgboost_frame("xgb-poisson", kind="regression", objective="count:poisson")
    assert um.file is not None
    model, _ = register(declaration(um), {"model": um.file})
    tree = model.tree
    assert tree is not None and tree.link == "log"
    rows = um.rows
    np.testing.assert_allclose(tree.margin(rows)[:, 0], np.log(tree.predict(rows)[:, 0]),
                               atol=1e-6)  # fmt: skip


def test_links_of_the_objectives() -> None:
    links = {
        "reg:squarederror": "identity", "reg:gamma": "log", "reg:tweedie": "log",
        "count:poisson": "log",
    }  # fmt: skip
    for objective, link in links.items():
        um = bm.xgboost_frame(f"xgb-{objective}", kind="regression", objective=objective)
        assert um.file is not None
        model, _ = register(declaration(um), {"model": um.file})
        assert model.tree is not None and model.tree.link == link, objective
        if link == "log":
            rows = um.rows
            np.testing.assert_allclose(
                np.exp(model.tree.margin(rows)), model.tree.predict(rows), rtol=1e-5
            )
