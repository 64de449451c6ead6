"""The Shapley explainer on tree models: when exact TreeSHAP answers, and in which output space.

Tree models (XGBoost, LightGBM) are explained in their raw margin (log-odds for classifiers) by
default, the space in which TreeSHAP is exact and additive (Lundberg et al., Nature MI 2020).
`auto` uses TreeSHAP unless the request asks for something it cannot give (another output
space, a background or masker, another index); then the model-agnostic estimators answer and
the answer says why.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators.tree import tree_shapley, tree_sii
from explainers.explanation import Explanation, OptionError
from explainers.shapley_runs import pick
from models.base import Model

PATH_DEPENDENT = {
    "type": "path-dependent",
    "source": "model",
    "detail": "absent features follow the trees' own training cover (path-dependent TreeSHAP)",
}


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


def why_not_tree(
    model: Model, space: str, index: str, max_order: int, custom_absence: bool
) -> str | None:
    """Why TreeSHAP cannot answer this request (None: it can)."""
    if model.tree is None:
        return "estimator 'tree' needs an XGBoost or LightGBM model"
    if space != "margin":
        return (
            "TreeSHAP explains the raw margin; output 'prediction' is explained "
            "model-agnostically"
        )
    if custom_absence:
        return (
            "TreeSHAP is path-dependent (absence from the trees' cover): a background or masker "
            "is explained model-agnostically"
        )
    if index not in ("SV", "SII") or (index == "SII" and max_order != 2):
        return f"TreeSHAP gives SV and pairwise SII (max_order 2), not {index} order {max_order}"
    if index == "SII" and not model.tree.has_interactions:
        return f"{model.tree.library} computes no interaction values"
    return None


def tree_explanations(
    model: Model, inputs: np.ndarray, index: str, target: int | tuple[int, ...] | None
) -> list[Explanation]:
    """Exact TreeSHAP explanations of `inputs` [m, *input_shape] for one margin each, or each
    margin of a target tuple (instance-major)."""
    if model.tree is None:
        raise OptionError(f"{model.name} is not a tree model")
    rows = inputs.reshape(inputs.shape[0], -1)
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
