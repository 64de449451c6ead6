"""Typed results of the client: explanations, audits and evaluations, as shap.Explanation
objects and pandas DataFrames. Only numpy here; shap and pandas load when asked for."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xai.errors import NoExplanations


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


def flat_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Job results with one explanation each: an audit over several targets stores an
    instance's explanations together ("explanations", in the order asked); here each becomes
    a result of its own with the instance's index."""
    out = []
    for r in results:
        if "explanations" not in r:
            out.append(r)
            continue
        rest = {k: v for k, v in r.items() if k != "explanations"}
        out.extend({**rest, "explanation": e} for e in r["explanations"])
    return out


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
    """Job results as a DataFrame, one row per instance and output: index, output_index,
    output, base value, output value, then per player its value (a column named after it) and
    the instance's value (`input.<name>`); for text, the players' texts and values."""
    import pandas as pd

    rows = []
    for r in flat_results(results):
        row: dict[str, Any] = {"index": r["index"]}
        if "explanation" not in r:
            row.update(error=r.get("error"), code=r.get("code"))
        else:
            e = r["explanation"]
            row.update(
                output_index=e.get("output_index"),
                output=e["output_name"],
                base_value=e["base_value"],
                instance_output_value=e["instance_output_value"],
            )
            names = r.get("feature_names") or []
            if len(names) == len(e["values"]):
                row.update(zip(names, e["values"], strict=True))
                data = feature_row(e.get("data"), names)
                if data is not None:
                    row.update({f"input.{n}": x for n, x in zip(names, data, strict=True)})
            else:  # text: each instance has its own players
                row.update(
                    players=[p["text"] for p in e.get("players") or []], values=e["values"]
                )
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Explained:
    """An explanation of one or more instances, as the service returned it; with several
    targets (a list or "all"), each instance has one explanation per output, in the order
    asked, and the arrays gain a last axis of outputs (shap's multi-output layout)."""

    raw: dict[str, Any]
    # Each instance's index in its audit (AuditResult.explained: the failed rows are left
    # out); None: the instances are 0, 1, 2, ...
    indices: tuple[int, ...] | None = None

    @property
    def _indices(self) -> list[int]:
        return list(self.indices) if self.indices is not None else list(range(len(self._groups)))

    @property
    def explanations(self) -> list[dict[str, Any]]:
        """Flat, instance-major: with k targets, instance i's are [i * k, (i + 1) * k)."""
        return list(self.raw["data"]["explanations"])

    @property
    def feature_names(self) -> list[str]:
        return list(self.raw["data"]["feature_names"])

    @property
    def output_names(self) -> list[str] | None:
        """The outputs of each instance's explanations with several targets, else None."""
        targets = self.meta.get("targets")
        return list(targets["output_names"]) if targets else None

    @property
    def _groups(self) -> list[list[dict[str, Any]]]:
        """Per instance, its explanations (one, or one per target)."""
        flat = self.explanations
        k = len(self.output_names or [None])
        return [flat[i : i + k] for i in range(0, len(flat), k)]

    @property
    def is_text(self) -> bool:
        return any(e.get("players") for e in self.explanations)

    @property
    def values(self) -> np.ndarray:
        """[m, n], or [m, n, k] with several targets; for text an object array of
        per-instance arrays ([n_i] or [n_i, k]: players differ)."""
        if self.output_names is None:
            return _ragged([e["values"] for e in self.explanations])
        return _ragged([np.stack([e["values"] for e in g], axis=-1) for g in self._groups])

    @property
    def base_values(self) -> np.ndarray:
        """[m], or [m, k] with several targets."""
        if self.output_names is None:
            return np.array([e["base_value"] for e in self.explanations])
        return np.array([[e["base_value"] for e in g] for g in self._groups])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.raw.get("meta") or {})

    @property
    def warnings(self) -> list[list[dict[str, Any]]]:
        """Per explanation: the warnings ({code, message}) that say how far to trust it."""
        return [list(e.get("warnings") or []) for e in self.explanations]

    @property
    def instance_names(self) -> list[str]:
        """'<i>: <output name>': each instance explains its own output (as format=shap names
        them; shap's output_names would describe an output axis, which there is none of);
        with several targets, '<i>' (the outputs are the output axis). `<i>` is the
        instance's index in its audit for AuditResult.explained()."""
        if self.output_names is not None:
            return [str(i) for i in self._indices]
        return [
            f"{i}: {e['output_name']}"
            for i, e in zip(self._indices, self.explanations, strict=True)
        ]

    def to_frame(self) -> Any:
        """One row per instance and output (see `frame`)."""
        names = self.feature_names
        return frame(
            [
                {"index": i, "explanation": e, "feature_names": names}
                for i, g in zip(self._indices, self._groups, strict=True)
                for e in g
            ]
        )

    def to_shap(self) -> Any:
        """A shap.Explanation: values, base values, data (feature values; for text the tokens
        with their spacing, so shap.plots.text shows the text as written) and feature names;
        with several targets values [m, n, k], base values [m, k] and output_names."""
        import shap

        firsts = [g[0] for g in self._groups]
        extra: dict[str, Any] = {}
        if self.output_names is not None:
            extra["output_names"] = self.output_names
        if self.is_text:
            tokens = [text_tokens(e.get("data"), e.get("players") or []) for e in firsts]
            words = [[p["text"] for p in e.get("players") or []] for e in firsts]
            return shap.Explanation(
                values=self.values,
                base_values=self.base_values,
                data=_ragged(tokens),
                feature_names=_ragged(words),
                instance_names=self.instance_names,
                **extra,
            )
        values = self.values
        data = None
        rows = [feature_row(e.get("data"), self.feature_names) for e in firsts]
        if rows and all(row is not None for row in rows):
            try:
                data = np.array(rows, dtype=float)
            except (TypeError, ValueError):  # not numbers
                data = None
        return shap.Explanation(
            values=values,
            base_values=self.base_values,
            data=data,
            feature_names=self.feature_names,
            instance_names=self.instance_names,
            **extra,
        )


def _explained(result: dict[str, Any]) -> bool:
    """Whether a result line holds an explanation (one, or one per target)."""
    return "explanation" in result or "explanations" in result


def failure_message(errors: list[dict[str, Any]], total: int) -> str:
    """The server's wording for failed rows: '3 of 20 rows failed; first: row 0: <error>
    (<code>)'."""
    if not errors:
        return f"0 of {total} rows failed"
    first = errors[0]
    return (
        f"{len(errors)} of {total} rows failed; first: row {first.get('index')}: "
        f"{first.get('error')} ({first.get('code')})"
    )


@dataclass(frozen=True)
class AuditResult:
    """A finished job: its final status (with summary) and every result line.

    A row that failed is a line `{"index", "error", "code"}` without an explanation: `errors`
    lists them, `to_frame()` shows them in `error` and `code` columns, and `explained()` and
    `to_shap()` leave them out."""

    status: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        return dict(self.status.get("summary") or {})

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The failed rows, in instance order: {"index", "code", "error"} each."""
        return [
            {"index": r.get("index"), "code": r.get("code"), "error": r.get("error")}
            for r in self.results
            if not _explained(r)
        ]

    def to_frame(self) -> Any:
        """One row per instance: index, output, base value, output value, a column per
        feature; a failed row has its message and code in `error` and `code` columns (and no
        values). Every row is kept, also when all of them failed."""
        return frame(self.results)

    def explained(self) -> Explained:
        """The instances that have explanations as one answer (several targets: the class
        axis kept); failed rows are left out (see `errors`), and each instance keeps its index
        in the audit (`Explained.indices`, the instance names). NoExplanations (an XaiError
        naming the first row's error) when no row has one."""
        answered = [r for r in self.results if _explained(r)]
        if not answered:
            errors = self.errors
            job = self.status.get("id")
            where = f"audit {job}" if job else "the audit"
            if not errors:
                raise NoExplanations(f"{where} has no results to convert")
            raise NoExplanations(
                f"{where} has no explanation to convert: "
                f"{failure_message(errors, len(self.results))}"
            )
        several = [r for r in answered if "explanations" in r]
        ok = [r for r in flat_results(answered) if "explanation" in r]
        meta: dict[str, Any] = {}
        if several:
            names = [e["output_name"] for e in several[0]["explanations"]]
            meta["targets"] = {"output_names": names}
        indices = tuple(
            int(r["index"]) if r.get("index") is not None else i
            for i, r in enumerate(self.results)
            if _explained(r)
        )
        return Explained(
            {
                "data": {
                    "feature_names": ok[0].get("feature_names") or [],
                    "explanations": [r["explanation"] for r in ok],
                },
                "meta": meta,
            },
            indices=indices,
        )

    def to_shap(self) -> Any:
        """A shap.Explanation of the instances that have explanations (as Explained.to_shap):
        rows with errors are left out, so its rows are the audit's instances without the
        failed ones (`errors` lists those; `instance_names` start with each row's index in
        the audit). NoExplanations (an XaiError) when every row failed."""
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
