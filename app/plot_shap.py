"""shap.Explanation arguments of an explain response (`format=shap`): shap's plots
(text, waterfall, beeswarm) work on them as on shap's own explanations.

`text_tokens` and `feature_row` are the server's side of a rule the client applies to the same
answers (xai/results.py, installed without the server): tests/test_client.py checks both agree.
Audit tables read instances through `feature_row` too (app/jobs/results.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.errors import InvalidInput
from app.schemas import ExplainResponse


def shap_arguments(answer: ExplainResponse) -> dict[str, Any]:
    """Keyword arguments of shap.Explanation (as JSON lists) for every explanation of a response.

    Tabular and image players share names, so values are [m, n]; text players differ per
    instance, so values and data are per-instance lists (shap's ragged text form): data holds
    the tokens with their spacing (shap.plots.text joins them as written), feature_names the
    players' words. With several targets (meta.targets), shap's multi-output layout.
    """
    targets = answer.meta.targets
    if targets is not None:
        names = targets.get("output_names")
        count = len(answer.data.explanations)
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) for n in names)
            or count % len(names)
        ):
            raise InvalidInput(
                "meta.targets needs output_names: the outputs of each instance's explanations, "
                f"in order (a non-empty list of names that divides the {count} explanations)"
            )
        return _multi_output(answer, names)
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


def text_tokens(text: Any, players: list[dict[str, Any]]) -> list[str]:
    """Each player's text with the characters up to the next player ('The ', 'food ', ...), as
    shap's text maskers cut tokens: the tokens join back into the text, spaces and punctuation
    included (the characters before the first player go with it). Without the text (or with
    offsets that don't match it), a space wherever the offsets skip characters."""
    if not players:
        return []
    starts = [int(p["start"]) for p in players]
    ends = [int(p["end"]) for p in players]
    ordered = all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    if (
        isinstance(text, str)
        and ordered
        and all(text[p["start"] : p["end"]] == p["text"] for p in players)
    ):
        cuts = [0, *starts[1:], len(text)]
        return [text[a:b] for a, b in itertools.pairwise(cuts)]
    gaps = [s > e for e, s in zip(ends, starts[1:], strict=False)] + [False]
    return [p["text"] + (" " if gap else "") for p, gap in zip(players, gaps, strict=True)]


def feature_row(data: Any, names: Sequence[str]) -> list[Any] | None:
    """An instance as sent, in the players' order: a row (flat or nested list) or a
    {feature: value} object; None when it is not one value per player (texts, image
    patches, no data)."""
    if isinstance(data, dict):
        return [data[n] for n in names] if set(data) == set(names) else None
    if data is None or isinstance(data, str):
        return None
    try:
        flat = np.ravel(np.asarray(data, dtype=object)).tolist()
    except ValueError:  # ragged
        return None
    return flat if len(flat) == len(names) else None
