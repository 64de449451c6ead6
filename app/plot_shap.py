"""shap.Explanation arguments of an explain response (`format=shap`): shap's plots
(text, waterfall, beeswarm) work on them as on shap's own explanations."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.schemas import ExplainResponse
from xai.results import (  # the client's helpers: the same tokens and rows on both sides
    feature_row,
    text_tokens,
)


def shap_arguments(answer: ExplainResponse) -> dict[str, Any]:
    """Keyword arguments of shap.Explanation (as JSON lists) for every explanation of a response.

    Tabular and image players share names, so values are [m, n]; text players differ per
    instance, so values and data are per-instance lists (shap's ragged text form): data holds
    the tokens with their spacing (shap.plots.text joins them as written), feature_names the
    players' words. With several targets (meta.targets), shap's multi-output layout.
    """
    targets = answer.meta.targets
    if targets is not None:
        return _multi_output(answer, list(targets["output_names"]))
    explanations = answer.data.explanations
    ragged = any(e.players for e in explanations)
    args: dict[str, Any] = {
        "values": [e.values for e in explanations],
        "base_values": [e.base_value for e in explanations],
        # each instance explains one output (its own target): shap's output_names and
        # output_indexes describe an output axis instead, so the names go to instance_names
        "instance_names": [f"{i}: {e.output_name}" for i, e in enumerate(explanations)],
    }
    if ragged:
        players = [[p.model_dump() for p in e.players or []] for e in explanations]
        args["data"] = [
            text_tokens(e.data, ps) for e, ps in zip(explanations, players, strict=True)
        ]
        args["feature_names"] = [[p["text"] for p in ps] for ps in players]
    else:
        args["feature_names"] = list(answer.data.feature_names)
        data = [feature_row(e.data, args["feature_names"]) for e in explanations]
        if all(row is not None for row in data):
            args["data"] = data
    if all(e.error_std is not None for e in explanations):
        args["error_std"] = [e.error_std for e in explanations]
    return args


def _multi_output(answer: ExplainResponse, names: list[str]) -> dict[str, Any]:
    """Several targets: shap's multi-output layout, values [m, n, k] and base_values [m, k]
    (text: per instance [n_i, k]), output_names the k outputs in the order asked."""
    k = len(names)
    flat = answer.data.explanations
    groups = [flat[i : i + k] for i in range(0, len(flat), k)]  # per instance, k outputs

    def stacked(field: str) -> list[Any]:
        return [
            np.stack([np.asarray(getattr(e, field), dtype=float) for e in g], axis=-1).tolist()
            for g in groups
        ]

    args: dict[str, Any] = {
        "values": stacked("values"),
        "base_values": [[e.base_value for e in g] for g in groups],
        "output_names": names,
        "instance_names": [str(i) for i in range(len(groups))],
    }
    if any(e.players for e in flat):
        players = [[p.model_dump() for p in g[0].players or []] for g in groups]
        args["data"] = [text_tokens(g[0].data, ps) for g, ps in zip(groups, players, strict=True)]
        args["feature_names"] = [[p["text"] for p in ps] for ps in players]
    else:
        args["feature_names"] = list(answer.data.feature_names)
        rows = [feature_row(g[0].data, args["feature_names"]) for g in groups]
        if all(row is not None for row in rows):
            args["data"] = rows
    if all(e.error_std is not None for e in flat):
        args["error_std"] = stacked("error_std")
    return args
