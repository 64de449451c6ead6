"""The Shapley explainer on tree models: when exact TreeSHAP answers, and in which output space.

Tree models (XGBoost, LightGBM) are explained in their raw margin (log-odds for classifiers, log
for log-link regressors) by default, the space in which path-dependent TreeSHAP is exact and
additive (Lundberg et al., Nature MI 2020). With background rows (the request's, or the model's
with masker `background` or `interventional`) they are explained exactly by interventional
TreeSHAP, in the margin. `auto` uses TreeSHAP unless the request asks for something it cannot
give exactly (a baseline, another index, the probability: a nonlinear function of the margin,
which shap's probability output only rescales); then the model-agnostic estimators answer and
the answer says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explainers.estimators.tree import tree_interventional, tree_shapley, tree_sii
from explainers.explanation import Explanation, OptionError
from explainers.masking import MaskerOptions, masker_references
from explainers.shapley.runs import pick
from models.base import Model

PATH_DEPENDENT = {
    "type": "path-dependent",
    "source": "model",
    "detail": "absent features follow the trees' own training cover (path-dependent TreeSHAP)",
}
# meta.parameters.output_space of a margin, by the objective's link (prediction = link^-1(margin))
MARGIN_SPACES = {"logistic": "log-odds", "softmax": "log-odds", "log": "log", "identity": "raw"}


def output_space(model: Model, output: str) -> str:
    """`auto` -> the margin for tree models, the model's prediction otherwise."""
    if output == "auto":
        return "margin" if model.tree is not None else "prediction"
    if output == "margin" and model.tree is None:
        raise OptionError(
            "output 'margin' applies to tree models (XGBoost, LightGBM); this model's output is "
            "its prediction"
        )
    return output


def space_label(model: Model, space: str) -> dict[str, str]:
    """meta.parameters.output_space of a tree model: log-odds, log, raw or probability."""
    tree = model.tree
    if tree is None:
        return {}
    if space == "prediction":
        probability = model.task == "classification" or tree.link == "logistic"
        return {"output_space": "probability" if probability else "raw"}
    return {"output_space": MARGIN_SPACES.get(tree.link, "margin")}


def tree_mode(
    model: Model,
    space: str,
    index: str,
    max_order: int,
    masker: str | None,
    background: bool,
) -> tuple[str | None, str | None]:
    """("path-dependent" or "interventional", None) when TreeSHAP answers this request exactly,
    else (None, why). `masker`: the requested masker type; `background`: the request sent rows."""
    tree = model.tree
    if tree is None:
        return None, "estimator 'tree' needs an XGBoost or LightGBM model"
    if masker == "baseline":
        return None, (
            "TreeSHAP takes absence from background rows or the trees' cover: a baseline masker "
            "is explained model-agnostically"
        )
    rows = background or masker is not None or (
        space == "prediction" and model.background is not None
    )
    if rows:
        if index != "SV":
            return None, (
                f"interventional TreeSHAP (background rows) gives Shapley values only: {index} "
                "with a background is explained model-agnostically"
            )
        why = tree.why_not_interventional(space == "prediction")
        return ("interventional", None) if why is None else (None, why)
    if space != "margin":
        return None, (
            "path-dependent TreeSHAP explains the raw margin; output 'prediction' without "
            "background rows (the request's or the model's) is explained model-agnostically"
        )
    if index not in ("SV", "SII") or (index == "SII" and max_order != 2):
        return None, (
            f"TreeSHAP gives SV and pairwise SII (max_order 2), not {index} order {max_order}"
        )
    if index == "SII" and not tree.has_interactions:
        return None, f"{tree.library} computes no interaction values"
    return "path-dependent", None


def interventional_rows(
    model: Model, background: np.ndarray | None
) -> tuple[np.ndarray, dict[str, Any]]:
    """The background rows of interventional TreeSHAP (the request's, else the model's) and
    the masker echo."""
    rows, echo = masker_references(model, MaskerOptions(type="background"), background)
    echo = {
        **echo,
        "type": "interventional",
        "detail": "absent features take each background row's values in turn (interventional "
        "TreeSHAP, shap.TreeExplainer)",
    }
    return rows.reshape(len(rows), -1), echo


def tree_explanations(
    model: Model,
    inputs: np.ndarray,
    index: str,
    target: int | tuple[int, ...] | None,
    space: str = "margin",
    background: np.ndarray | None = None,
) -> list[Explanation]:
    """Exact TreeSHAP explanations of `inputs` [m, *input_shape] for one output each, or each
    output of a target tuple (instance-major): path-dependent in the margin, or interventional
    against `background` rows [r, n] in the margin (the prediction for an identity link)."""
    if model.tree is None:
        raise OptionError(f"{model.name} is not a tree model")
    rows = inputs.reshape(inputs.shape[0], -1)
    if background is not None:
        estimates = tree_interventional(model.tree, rows, background, space)
    else:
        estimates = tree_shapley(model.tree, rows)
    outs = [
        target
        if isinstance(target, tuple)
        else (target,)
        if target is not None
        else ((int(np.argmax(e.full_value)) if model.task == "classification" else 0),)
        for e in estimates
    ]
    if any(not 0 <= o < model.n_outputs for os in outs for o in os):
        raise OptionError(f"target out of range for {model.n_outputs} outputs")
    if index == "SV":
        return [pick(e, model, o) for e, os in zip(estimates, outs, strict=True) for o in os]
    return [
        pick(tree_sii(model.tree, rows[i : i + 1], o)[0], model, o)
        for i, os in enumerate(outs)
        for o in os
    ]
