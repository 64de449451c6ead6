"""Typed results of a batch audit: what a job stores per instance (its explanation, one per
output with several targets, or its error), parsed once where results leave the job store, so
the summary, the tables and the plots read attributes.

The stored JSON keeps its shape: `AuditResult.stored()` writes it and `AuditResult.parse` reads
it back; an explanation keeps its stored object as it was (`raw`). The fields read from it have
been required in every explanation since the first stored job (app/schemas.py ExplanationOut).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.plot_shap import feature_row

if TYPE_CHECKING:
    from app.jobs.store import JobStore
    from app.schemas import ExplainResponse


@dataclass(frozen=True)
class StoredExplanation:
    """One explanation as an audit stores it: ExplanationOut's JSON with the fields that were
    set (`raw`, written back unchanged), and the fields the server reads from it."""

    raw: Mapping[str, Any]
    values: tuple[float, ...]  # one per player
    output_index: int
    output_name: str
    base_value: float
    instance_output_value: float
    exact: bool
    estimator: str
    data: Any  # the instance as sent (a row, a {feature: value} object, a text, ...)
    players: tuple[str, ...] = ()  # text models: the players' texts, in order
    warnings: tuple[str, ...] = ()  # the warnings' codes

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> StoredExplanation:
        return cls(
            raw=raw,
            values=tuple(raw["values"]),
            output_index=raw["output_index"],
            output_name=raw["output_name"],
            base_value=raw["base_value"],
            instance_output_value=raw["instance_output_value"],
            exact=raw["exact"],
            estimator=raw["estimator"],
            data=raw["data"],
            players=tuple(p["text"] for p in raw.get("players") or []),
            warnings=tuple(w["code"] for w in raw.get("warnings") or []),
        )

    def feature_row(self, names: tuple[str, ...]) -> list[Any] | None:
        """The instance in the players' order, or None when it is not one value per player
        (app/plot_shap.py's rule, which format=shap applies too)."""
        return feature_row(self.data, names)


@dataclass(frozen=True)
class AuditRow:
    """One row of an audit's tables and plots: an instance's explanation of one output, or
    (explanation None) the instance's error."""

    index: int | None
    explanation: StoredExplanation | None
    feature_names: tuple[str, ...] | None
    error: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class AuditResult:
    """What an audit stores of one instance: its explanation, its explanations (`several`:
    a target list, in the order asked), or an error and its code."""

    explanations: tuple[StoredExplanation, ...] = ()
    several: bool = False
    feature_names: tuple[str, ...] | None = None  # empty for text: players differ per instance
    cache: str | None = None  # how its answer was found: hit, miss or bypass
    background_audit: Mapping[str, Any] | None = None
    error: str | None = None
    code: str | None = None
    index: int | None = None  # the instance; GET .../results lines carry it

    @classmethod
    def of_answer(cls, answer: ExplainResponse, cache: str | None = None) -> AuditResult:
        """A one-instance answer (`cache`: how it was found, default as the answer says)."""
        return cls(
            explanations=tuple(
                StoredExplanation.parse(e.model_dump(exclude_unset=True))
                for e in answer.data.explanations
            ),
            several=answer.meta.targets is not None,
            feature_names=tuple(answer.data.feature_names),
            cache=answer.meta.cache if cache is None else cache,
            background_audit=answer.meta.background_audit,
        )

    @classmethod
    def failed(cls, error: str, code: str) -> AuditResult:
        return cls(error=error, code=code)

    @classmethod
    def parse(cls, stored: Mapping[str, Any]) -> AuditResult:
        """A stored result (with `index` when it comes from a results line). Anything without
        an explanation reads as an error-like row (a training job's records, too)."""
        several = "explanations" in stored
        if several:
            raws = stored["explanations"]
        else:
            raws = [stored["explanation"]] if "explanation" in stored else []
        names = stored.get("feature_names")
        return cls(
            explanations=tuple(StoredExplanation.parse(e) for e in raws),
            several=several,
            feature_names=None if names is None else tuple(names),
            cache=stored.get("cache"),
            background_audit=stored.get("background_audit"),
            error=stored.get("error"),
            code=stored.get("code"),
            index=stored.get("index"),
        )

    def stored(self) -> dict[str, Any]:
        """The JSON object the job store keeps (without the index, which is its key)."""
        if not self.explanations:
            return {"error": self.error, "code": self.code}
        raws = [dict(e.raw) for e in self.explanations]
        out: dict[str, Any] = {
            **({"explanations": raws} if self.several else {"explanation": raws[0]}),
            "feature_names": list(self.feature_names or ()),
            "cache": self.cache,
        }
        if self.background_audit is not None:
            out["background_audit"] = dict(self.background_audit)
        return out

    def rows(self) -> list[AuditRow]:
        """A row per explanation (several targets: one per output, in the order asked), or
        one row for an instance without one."""
        if not self.explanations:
            return [AuditRow(self.index, None, self.feature_names, self.error, self.code)]
        return [AuditRow(self.index, e, self.feature_names) for e in self.explanations]


def stored_json(answer: ExplainResponse, cache: str, texts: tuple[str, ...]) -> str:
    """AuditResult.of_answer(answer, cache).stored() as JSON text, made of the explanations'
    JSON `texts` already encoded (app/batch.py encode) instead of encoding them again."""
    several = answer.meta.targets is not None
    head = (
        '{"explanations": [' + ", ".join(texts) + "]" if several else '{"explanation": ' + texts[0]
    )
    tail = [
        f'"feature_names": {json.dumps(list(answer.data.feature_names))}',
        f'"cache": {json.dumps(cache)}',
    ]
    if answer.meta.background_audit is not None:
        tail.append(f'"background_audit": {json.dumps(answer.meta.background_audit)}')
    return head + ", " + ", ".join(tail) + "}"


def flat(results: list[AuditResult]) -> list[AuditRow]:
    """Every result's rows, in order."""
    return [row for r in results for row in r.rows()]


def read_results(store: JobStore, job_id: str) -> list[AuditResult]:
    """A job's stored results, parsed, in instance order."""
    return [AuditResult.parse(r) for r in store.all_results(job_id, with_index=True)]
