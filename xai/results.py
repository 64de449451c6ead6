"""Typed results of the client: explanations, audits and evaluations, as shap.Explanation
objects and pandas DataFrames. Only numpy here; shap and pandas load when asked for."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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


def _ragged(rows: list[Any]) -> np.ndarray:
    """An array of rows, or an object array of 1-d arrays when their lengths differ."""
    arrays = [np.asarray(row) for row in rows]
    if len({a.shape for a in arrays}) <= 1:
        return np.asarray(rows)
    out = np.empty(len(arrays), dtype=object)
    out[:] = arrays
    return out


def shap_explanation(arguments: dict[str, Any]) -> Any:
    """A shap.Explanation from a `format=shap` answer (POST .../plot?format=shap or /v2/plots).

    Text players differ per instance, so their values, tokens and names become object arrays
    of arrays, the ragged form shap's text plot reads.
    """
    import shap

    kwargs = dict(arguments)
    for key in ("values", "data", "error_std"):
        if key in kwargs:
            kwargs[key] = _ragged(kwargs[key])
    names = kwargs.get("feature_names")
    if names and isinstance(names[0], list):  # text: the words name the players per instance
        kwargs["feature_names"] = _ragged(names)
    kwargs["base_values"] = np.asarray(kwargs["base_values"])
    return shap.Explanation(**kwargs)


def frame(results: list[dict[str, Any]]) -> Any:
    """Job results as a DataFrame, one row per instance: index, output, base value, output
    value, then one column per player (tabular audits) or the players' texts and values."""
    import pandas as pd

    rows = []
    for r in results:
        row: dict[str, Any] = {"index": r["index"]}
        if "explanation" not in r:
            row.update(error=r.get("error"), code=r.get("code"))
        else:
            e = r["explanation"]
            row.update(
                output=e["output_name"],
                base_value=e["base_value"],
                instance_output_value=e["instance_output_value"],
            )
            names = r.get("feature_names") or []
            if len(names) == len(e["values"]):
                row.update(zip(names, e["values"], strict=True))
            else:  # text: each instance has its own players
                row.update(
                    players=[p["text"] for p in e.get("players") or []], values=e["values"]
                )
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Explained:
    """An explanation of one or more instances, as the service returned it."""

    raw: dict[str, Any]

    @property
    def explanations(self) -> list[dict[str, Any]]:
        return list(self.raw["data"]["explanations"])

    @property
    def feature_names(self) -> list[str]:
        return list(self.raw["data"]["feature_names"])

    @property
    def is_text(self) -> bool:
        return any(e.get("players") for e in self.explanations)

    @property
    def values(self) -> np.ndarray:
        """[m, n]; for text, an object array of per-instance arrays (players differ)."""
        return _ragged([e["values"] for e in self.explanations])

    @property
    def base_values(self) -> np.ndarray:
        return np.array([e["base_value"] for e in self.explanations])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.raw["meta"])

    @property
    def warnings(self) -> list[list[dict[str, Any]]]:
        """Per instance: the warnings ({code, message}) that say how far to trust it."""
        return [list(e.get("warnings") or []) for e in self.explanations]

    @property
    def instance_names(self) -> list[str]:
        """'<i>: <output name>': each instance explains its own output (as format=shap names
        them; shap's output_names would describe an output axis, which there is none of)."""
        return [f"{i}: {e['output_name']}" for i, e in enumerate(self.explanations)]

    def to_frame(self) -> Any:
        """One row per instance (see `frame`)."""
        names = self.feature_names
        return frame(
            [
                {"index": i, "explanation": e, "feature_names": names}
                for i, e in enumerate(self.explanations)
            ]
        )

    def to_shap(self) -> Any:
        """A shap.Explanation: values, base values, data (feature values; for text the tokens
        with their spacing, so shap.plots.text shows the text as written) and feature names."""
        import shap

        if self.is_text:
            tokens = [text_tokens(e.get("data"), e.get("players") or []) for e in self.explanations]
            return shap.Explanation(
                values=self.values,
                base_values=self.base_values,
                data=_ragged(tokens),
                feature_names=_ragged(
                    [[p["text"] for p in e.get("players") or []] for e in self.explanations]
                ),
                instance_names=self.instance_names,
            )
        values = self.values
        data = None
        try:
            rows = np.array([np.ravel(e["data"]) for e in self.explanations], dtype=float)
            data = rows if rows.shape == values.shape else None
        except (TypeError, ValueError):  # no data, or not numbers
            pass
        return shap.Explanation(
            values=values,
            base_values=self.base_values,
            data=data,
            feature_names=self.feature_names,
            instance_names=self.instance_names,
        )


@dataclass(frozen=True)
class AuditResult:
    """A finished job: its final status (with summary) and every result line."""

    status: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        return dict(self.status.get("summary") or {})

    def to_frame(self) -> Any:
        """One row per instance: index, output, base value, output value, a column per
        feature (errors in an `error` column)."""
        return frame(self.results)

    def explained(self) -> Explained:
        ok = [r for r in self.results if "explanation" in r]
        return Explained(
            {
                "data": {
                    "feature_names": ok[0]["feature_names"] if ok else [],
                    "explanations": [r["explanation"] for r in ok],
                },
                "meta": {},
            }
        )

    def to_shap(self) -> Any:
        return self.explained().to_shap()


@dataclass(frozen=True)
class Evaluated:
    """Faithfulness figures of attributions (POST /v2/models/{model}/evaluate)."""

    raw: dict[str, Any]

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        return list(self.raw["evaluations"])

    def to_frame(self) -> Any:
        """One row per instance: the scalar figures (curves left out; they are in `raw`)."""
        import pandas as pd

        rows = []
        for i, e in enumerate(self.evaluations):
            row: dict[str, Any] = {"index": i}
            for key, value in e.items():
                if isinstance(value, dict) and key == "sensitivity":
                    row.update({f"sensitivity_{k}": v for k, v in value.items()})
                elif not isinstance(value, dict | list):
                    row[key] = value
            rows.append(row)
        return pd.DataFrame(rows)
