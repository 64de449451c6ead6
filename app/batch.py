"""The data plane's batch entry: many instances of one request's fields, each answered from the
cache under the key a request for that instance alone has, the misses computed together as one
request (one model call or one TreeSHAP call over many rows), each row's answer cached as that
one-instance request's answer.

The same service steps as a synchronous request (app/service.py: prepare validates and keys,
compute runs the explainer under the deadline and shapes the answer); a batch audit (app/jobs/
audit.py) calls it for each slice of a chunk. An explainer whose rows depend on each other in
one request (ExplainerSpec.rows_independent False), or a request whose answer holds figures over
all its instances (target_se's precision, parameters.evaluate, a request background's audit of
the predicted classes), is computed one instance at a time here: the same answers, row by row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from app.cache import CacheUnavailable
from app.errors import ApiError, Unprocessable
from app.schemas import ExplainResponse, request_model
from app.service import ExplainService, Prepared, non_finite
from explainers.games import Cancelled
from explainers.registry import ExplainerSpec
from models.modality import Modality

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowAnswer:
    """One instance's answer (a one-instance ExplainResponse) or its error."""

    response: ExplainResponse | None = None
    cache: str = "miss"  # how it was found: hit, miss or bypass
    error: str | None = None
    code: str | None = None
    # each explanation's JSON when this batch encoded it (the cache entry's pieces): a stored
    # result is made of them, not encoded again (app/jobs/audit.py)
    texts: tuple[str, ...] = ()


class Rows:
    """What the rows of a batch share: the service, the model, the explainer and the request's
    other fields; `prepare` makes a request of some instances."""

    def __init__(
        self, svc: ExplainService, model: str, spec: ExplainerSpec, fields: dict[str, Any]
    ) -> None:
        self.svc, self.model, self.spec, self.fields = svc, model, spec, fields

    def body(self, instances: Sequence[Any]) -> Any:
        """The request of these instances (raises pydantic's ValidationError)."""
        return request_model(self.spec)(inputs=list(instances), **self.fields)

    def prepare(self, instances: Sequence[Any]) -> Prepared:
        """Validate and key these instances as one request (lookup=False: never a hit)."""
        try:
            body = self.body(instances)
        except ValidationError as exc:
            raise Unprocessable(f"invalid instance: {exc.errors()[0]['msg']}") from None
        p = self.svc.prepare(
            self.model, self.spec.name, body, use_cache=True, lookup=False, whole_key=False
        )
        if not isinstance(p, Prepared):  # lookup=False never answers from the cache
            raise TypeError(f"prepare answered {type(p).__name__}")
        return p


def batchable(p: Prepared) -> bool:
    """Whether the request's rows can be computed together and each cached as its own answer."""
    if not p.spec.rows_independent or p.evaluate is not None:
        return False
    modality = p.model.modality
    # a default budget fits a text request's longest text, and an image request's players (as
    # superpixels) differ per image: a row's answer would depend on the rows beside it
    if modality != Modality.TABULAR and not (modality == Modality.TEXT and p.req.budget):
        return False
    if getattr(p.options, "target_se", None) is not None:  # meta.precision: over every row
        return False
    # a request background's audit covers the outputs explained: the predicted classes of all
    # the batch's rows unless a target fixes them
    return p.background is None or p.target is not None


def split(response: ExplainResponse, rows: int) -> list[ExplainResponse]:
    """A `rows`-instance answer as one answer per instance (each as if it had been asked alone:
    its explanations, its model evaluations, its share of the compute time)."""
    k = len(response.data.explanations) // max(rows, 1)
    meta, data = response.meta, response.data
    out = []
    for i in range(rows):
        mine = data.explanations[i * k : (i + 1) * k]
        update = {
            "n_model_evals": sum(e.n_model_evals for e in mine),
            "n_instances": 1,
            "exact": all(e.exact for e in mine),
            "compute_ms": round(meta.compute_ms / rows, 3),
        }
        out.append(
            response.model_copy(
                update={
                    "id": "",
                    "meta": meta.model_copy(update=update),
                    "data": data.model_copy(update={"explanations": mine}),
                }
            )
        )
    return out


def _failure(exc: ApiError) -> RowAnswer:
    return RowAnswer(error=exc.message, code=exc.code)


@dataclass(frozen=True)
class Computed:
    """A batch's rows computed: each row's answer, its explanations' JSON, how it was cached."""

    answers: list[ExplainResponse]
    texts: list[tuple[str, ...]]
    status: str  # miss (each row cached) or bypass


def compute_cached(svc: ExplainService, p: Prepared) -> Computed:
    """Compute a prepared batch whose rows all missed the cache as one request and cache each
    row's answer under its own key; an error is the batch's (raised)."""
    outcome = svc.compute(p, encode=False)
    answers = split(outcome.response, len(p.inputs))
    try:  # each row's JSON (the cache's entry); a NaN fails here as one request's would
        encoded = [encode(a) for a in answers]
    except ValueError:
        raise non_finite() from None
    status = "bypass" if outcome.response.meta.partial else p.status  # partial: never served
    if status == "miss":
        try:
            svc.cache.set_many(dict(zip(p.row_keys(), (b for b, _ in encoded), strict=True)))
        except CacheUnavailable as exc:
            log.warning("%d answers not cached: %s", len(encoded), exc)
            status = "bypass"
    svc.metrics.cache.labels(status).inc(len(answers))
    return Computed(answers, [t for _, t in encoded], status)


def compute_rows(
    rows: Rows, p: Prepared, cancel: Callable[[], bool] | None = None
) -> list[RowAnswer]:
    """Compute a prepared batch (every row missed the cache) and cache each row's answer; on an
    error of the batch, each row alone, so that the error is the row's. A crashed model worker
    and a cancel raise (the caller's attempt stops)."""
    p.cancel = cancel
    try:
        done = compute_cached(rows.svc, p)
    except ApiError as exc:
        if isinstance(exc.__cause__, Cancelled) or worker_crashed(exc.__cause__):
            raise
        if len(p.inputs) == 1:
            return [_failure(exc)]
        return [answer_one(rows, x, cancel) for x in p.req.inputs]  # which rows: each alone
    return [
        RowAnswer(a, done.status, texts=t) for a, t in zip(done.answers, done.texts, strict=True)
    ]


def joined(answers: Sequence[ExplainResponse], cache: str, request_id: str) -> ExplainResponse:
    """One-instance answers (from the cache or computed) as one request's answer: their
    explanations in order, model evaluations and compute time summed, `cache` as said."""
    first = answers[0]
    meta = first.meta.model_copy(
        update={
            "n_model_evals": sum(a.meta.n_model_evals for a in answers),
            "n_instances": sum(a.meta.n_instances for a in answers),
            "exact": all(a.meta.exact for a in answers),
            "partial": any(a.meta.partial for a in answers),
            "compute_ms": round(sum(a.meta.compute_ms for a in answers), 3),
            "cache": cache,
        }
    )
    explanations = [e for a in answers for e in a.data.explanations]
    data = first.data.model_copy(update={"explanations": explanations})
    return first.model_copy(update={"id": request_id, "meta": meta, "data": data})


SHELL_END = '"explanations": []}}'


def encode(answer: ExplainResponse) -> tuple[str, tuple[str, ...]]:
    """A one-instance answer's JSON as the cache stores it (ExplainResponse.to_json's bytes, id
    "" and meta.cache "miss") and each explanation's JSON, encoded once for both: the answer
    is its shell (explanations empty, the last field) with them put in. ValueError on NaN."""
    texts = tuple(
        json.dumps(e.model_dump(exclude_unset=True), allow_nan=False)
        for e in answer.data.explanations
    )
    shell = answer.model_copy(
        update={
            "meta": answer.meta.model_copy(update={"cache": "miss"}),
            "data": answer.data.model_copy(update={"explanations": []}),
        }
    ).to_json()
    if not shell.endswith(SHELL_END):  # another layout: encode it whole
        full = answer.model_copy(update={"meta": answer.meta.model_copy(update={"cache": "miss"})})
        return full.to_json(), texts
    return shell[: -len("[]}}")] + "[" + ", ".join(texts) + "]}}", texts


def answer_one(rows: Rows, instance: Any, cancel: Callable[[], bool] | None) -> RowAnswer:
    """One instance as its own request: from the cache, else computed."""
    try:
        p = rows.prepare([instance])
        hit = cached_rows(rows.svc, p).get(0)
        return hit if hit is not None else compute_rows(rows, p, cancel)[0]
    except ApiError as exc:
        if isinstance(exc.__cause__, Cancelled) or worker_crashed(exc.__cause__):
            raise
        return _failure(exc)


def cached_rows(svc: ExplainService, p: Prepared) -> dict[int, RowAnswer]:
    """The rows of a prepared batch that the cache answers (one round trip), by position."""
    try:
        blobs = svc.cache.get_many(p.row_keys())
    except CacheUnavailable:  # answered uncached, and said so
        p.status = "bypass"
        return {}
    hits = {
        i: RowAnswer(ExplainResponse.model_validate_json(b), "hit")
        for i, b in enumerate(blobs)
        if b is not None
    }
    if hits:
        svc.metrics.cache.labels("hit").inc(len(hits))
    return hits


def subset(p: Prepared, positions: list[int]) -> Prepared:
    """The prepared request of some of its rows (the cache answered the others)."""
    if len(positions) == len(p.inputs):
        return p
    outside = None
    if p.out_of_range is not None:
        where = {old: new for new, old in enumerate(positions)}
        outside = {where[i]: w for i, w in p.out_of_range.items() if i in where}
    inputs = [p.req.inputs[i] for i in positions]
    return replace(
        p,
        req=p.req.model_copy(update={"inputs": inputs}),
        inputs=p.inputs[positions],
        out_of_range=outside,
        keys=None if p.keys is None else [p.keys[i] for i in positions],
    )


def answer(
    rows: Rows, instances: Sequence[Any], cancel: Callable[[], bool] | None = None
) -> list[RowAnswer]:
    """Every one of `instances`, in order: the cache's answers in one round trip, the misses
    computed as one request when the explainer allows it, else one by one. A row that fails
    validation gets its error; so does every row of a batch that fails when each fails alone."""
    if not instances:
        return []
    try:
        p = rows.prepare(instances)
    except ApiError:  # some instance is invalid: each alone says which
        return [answer_one(rows, x, cancel) for x in instances]
    if not batchable(p):
        return [answer_one(rows, x, cancel) for x in instances]
    answers: dict[int, RowAnswer] = cached_rows(rows.svc, p)
    misses = [i for i in range(len(instances)) if i not in answers]
    if misses:
        sub = subset(p, misses)
        if sub.req.timeout_ms is not None:  # timeout_ms is per instance: from when they run
            sub.deadline = time.monotonic() + len(misses) * sub.req.timeout_ms / 1000
        answers.update(zip(misses, compute_rows(rows, sub, cancel), strict=True))
    return [answers[i] for i in range(len(instances))]


def dry_run(rows: Rows, instance: Any) -> None:
    """Raise the 4xx that every row would meet (a budget below the estimator's minimum, an
    option that does not apply): prepare one instance and run its explainer up to its first
    model call, which is cancelled."""
    p = rows.prepare([instance])
    try:
        rows.svc.compute(replace(p, status="bypass", cancel=lambda: True))
    except ApiError as exc:
        if isinstance(exc.__cause__, Cancelled):  # it reached a model call: valid
            return
        if exc.status < 500:
            raise


def worker_crashed(exc: BaseException | None) -> bool:
    """Whether a model call failed because its model worker died or hit a limit (a crash, not
    an answer about this instance): models/sandbox's ModelWorkerError."""
    try:
        from models.sandbox import ModelWorkerError
    except ImportError:  # a build without model workers
        return False
    return isinstance(exc, ModelWorkerError)
