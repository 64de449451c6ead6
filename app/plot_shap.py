"""shap.Explanation arguments of an explain response (`format=shap`): shap's plots
(text, waterfall, beeswarm) work on them as on shap's own explanations."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.schemas import ExplainResponse
from xai.results import text_tokens  # the client's helper: the same tokens on both sides


def shap_arguments(answer: ExplainResponse) -> dict[str, Any]:
    """Keyword arguments of shap.Explanation (as JSON lists) for every explanation of a response.

    Tabular and image players share names, so values are [m, n]; text players differ per
    instance, so values and data are per-instance lists (shap's ragged text form): data holds
    the tokens with their spacing (shap.plots.text joins them as written), feature_names the
    players' words.
    """
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
        n = len(args["feature_names"])
        data: list[list[Any] | None] = []
        for e in explanations:
            flat = list(np.ravel(np.asarray(e.data, dtype=object))) if e.data else []
            data.append(flat if len(flat) == n else None)
        if all(row is not None for row in data):
            args["data"] = data
    if all(e.error_std is not None for e in explanations):
        args["error_std"] = [e.error_std for e in explanations]
    return args
