"""The `audit` job kind: one explain request's fields over many instances, chunked, through
the shared cache; its summary (mean |value| per feature and class, top-k stability).
A classifier's audit explains one class for every instance: the request's `target`, else the
first class (index 0), never each instance's own predicted class."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from app.cache import CacheUnavailable
from app.errors import ApiError, InvalidInput, PayloadTooLarge, Unprocessable
from app.inputs import resolve_targets, to_array
from app.jobs.context import CancelWatch, JobContext, store_results
from app.jobs.results import AuditResult, flat, read_results
from app.jobs.store import Job, JobStore
from app.schemas import ExplainResponse, request_model, spec_fields
from app.service import ExplainService, Prepared
from explainers.games import Cancelled
from explainers.registry import get_explainer

if TYPE_CHECKING:
    from app.jobs.routes import JobRequest

log = logging.getLogger(__name__)
WRITE_EVERY = 10  # instances between result writes: bounds rework after a crash


def validate_audit(svc: ExplainService, body: JobRequest, max_instances: int) -> dict[str, Any]:
    """Fail at submission, not in a worker: model, explainer, options and every instance."""
    if body.inputs is None:
        raise Unprocessable("an audit needs inputs")
    if len(body.inputs) > max_instances:
        raise PayloadTooLarge(f"at most {max_instances} instances per job")
    model = svc.model(body.model)
    spec = svc.explainer(model, body.explainer)
    fields = body.model_dump(include={"target", "seed", "budget", "background", "parameters"})
    fields.update(body.model_extra or {})
    if fields.get("target") is None and model.task == "classification":
        # one class for every row, as shap's audits: the first class unless `target` says
        # (each row's own predicted class would mix classes in one beeswarm and one mean)
        fields["target"] = 0
    body_model = request_model(spec)
    try:
        if spec.uses_inputs:
            body_model(inputs=body.inputs[:1], **fields)
        else:
            for i, instance in enumerate(body.inputs):
                if not isinstance(instance, dict):
                    raise InvalidInput(
                        f"inputs[{i}]: a {spec.name} instance is an object of "
                        f"{', '.join(spec_fields(spec))}"
                    )
                body_model(**{**fields, **instance})
    except ValidationError as exc:
        raise Unprocessable(
            f"invalid request for {spec.name}: {exc.errors()[0]['msg']}",
            detail=[{k: v for k, v in e.items() if k != "ctx"} for e in exc.errors()],
        ) from None
    if spec.uses_inputs:
        to_array(model, body.inputs, "inputs")
    resolve_targets(model, body.target)  # a bad target list fails here, not per instance
    return {"explainer": spec.name, "fields": fields, "inputs": body.inputs}


def audit_total(body: JobRequest) -> int:
    """One result per instance."""
    return len(body.inputs or [])


def _store(ctx: JobContext, job: Job, results: dict[int, AuditResult]) -> None:
    """Write results in the job store's JSON (AuditResult.stored)."""
    store_results(ctx, job.id, {i: r.stored() for i, r in results.items()})


def run_audit(ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Explain each instance as a one-instance request, through the shared cache.

    The chunk's instances are looked up in one round trip (MGET); results are written every
    WRITE_EVERY computed instances and at the end, hits and errors with them: a cached re-run
    costs one look-up and one write per chunk. Computed answers enter the cache together, in
    one round trip at the chunk's end (Cache.set_many), not one SET each.
    """
    req = job.request
    spec = get_explainer(req["explainer"])
    body_model = request_model(spec)
    svc = ctx.service
    pending: dict[int, AuditResult] = {}
    prepared: dict[int, Prepared] = {}
    for i in todo:
        try:
            instance = req["inputs"][i]
            body = (
                body_model(inputs=[instance], **req["fields"])
                if spec.uses_inputs
                else body_model(**{**req["fields"], **instance})
            )
            p = svc.prepare(job.model, req["explainer"], body, use_cache=True, lookup=False)
            if isinstance(p, Prepared):
                prepared[i] = p
            else:  # lookup=False never answers; kept for the type
                pending[i] = AuditResult.of_answer(p.response)
        except ApiError as exc:
            pending[i] = AuditResult.failed(exc.message, exc.code)
        except ValidationError as exc:
            message = f"invalid instance: {exc.errors()[0]['msg']}"
            pending[i] = AuditResult.failed(message, "invalid")
    try:
        blobs = svc.cache.get_many([p.key for p in prepared.values()])
    except CacheUnavailable:
        blobs = [None] * len(prepared)
        for p in prepared.values():
            p.status = "bypass"
    for i, blob in zip(list(prepared), blobs, strict=True):
        if blob is not None:
            pending[i] = AuditResult.of_answer(ExplainResponse.model_validate_json(blob), "hit")
            del prepared[i]
    hits = sum(b is not None for b in blobs)
    if hits:
        svc.metrics.cache.labels("hit").inc(hits)
    if prepared:
        svc.metrics.cache.labels(next(iter(prepared.values())).status).inc(len(prepared))
    answers: dict[str, str] = {}  # cache key -> JSON of the answers computed here

    def flush() -> None:
        """Cache the answers computed so far, in one round trip. Before their results are
        stored: a worker killed in between leaves instances that a redelivery recomputes (or
        finds cached), never stored results that no later run puts in the cache."""
        try:
            svc.cache.set_many(answers)
        except CacheUnavailable as exc:
            log.warning("job %s: %d answers not cached: %s", job.id, len(answers), exc)
        answers.clear()

    try:
        _compute(ctx, job, prepared, pending, answers, flush)
    finally:  # cancelled or failed part-way: what was computed is still a valid answer
        flush()


def _compute(
    ctx: JobContext,
    job: Job,
    prepared: dict[int, Prepared],
    pending: dict[int, AuditResult],
    answers: dict[str, str],
    flush: Callable[[], None],
) -> None:
    """Compute the instances that missed; store results every WRITE_EVERY and at the end,
    each time after `flush` has cached the answers computed since the last."""
    watch = CancelWatch(ctx, job.id)
    for count, (i, p) in enumerate(prepared.items(), start=1):
        if watch():  # the remaining instances don't run
            return
        if p.req.timeout_ms is not None:  # each instance's time limit starts when it runs
            p.deadline = time.monotonic() + p.req.timeout_ms / 1000
        try:
            pending[i] = AuditResult.of_answer(ctx.service.compute(p, defer=answers).response)
        except ApiError as exc:
            if isinstance(exc.__cause__, Cancelled):
                raise exc.__cause__ from None
            crash = exc.__cause__
            if crash is not None and model_crashed(crash):  # the attempt fails (retried)
                _store(ctx, job, pending)  # what was computed before stays
                raise crash from None
            pending[i] = AuditResult.failed(exc.message, exc.code)
        if count % WRITE_EVERY == 0:
            if watch(fresh=True):  # nothing is stored after a cancel
                return
            flush()
            _store(ctx, job, pending)
            pending = {}
    if not watch(fresh=True):
        flush()
        _store(ctx, job, pending)


def model_crashed(exc: BaseException | None) -> bool:
    """Whether a model call failed because its model worker died or hit a limit (a crash,
    not an answer about this instance): models/sandbox's ModelWorkerError."""
    try:
        from models.sandbox import ModelWorkerError
    except ImportError:  # a build without model workers
        return False
    return isinstance(exc, ModelWorkerError)


def top_k_bootstrap(
    values: np.ndarray, names: list[str], k: int, resamples: int = 200, seed: int = 0
) -> dict[str, Any]:
    """How stable the summary's top features are: resample the instances with replacement and
    recompute the top k by mean |value|. `same_top_k`: share of resamples with the same set;
    `in_top_k`: per feature, share of resamples that rank it in the top k (Efron 1979)."""
    rng = np.random.default_rng(seed)
    full = set(np.argsort(-values.mean(axis=0))[:k].tolist())
    counts = np.zeros(values.shape[1])
    same = 0
    for _ in range(resamples):
        pick = rng.integers(0, len(values), len(values))
        top = np.argsort(-values[pick].mean(axis=0))[:k]
        counts[top] += 1
        same += set(top.tolist()) == full
    order = np.argsort(-counts)
    return {
        "resamples": resamples,
        "same_top_k": same / resamples,
        "in_top_k": {names[j]: counts[j] / resamples for j in order if counts[j] > 0},
    }


def summarise_audit(store: JobStore, job: Job, top_k: int = 3) -> dict[str, Any]:
    """Mean |value| per feature, per explained class, how stable the top features are, and how
    many instances carry each warning code. With several targets, each instance's
    explanations count as rows (per_class: one entry per output)."""
    stored = read_results(store, job.id)
    summary: dict[str, Any] = {
        "instances": len(stored),
        "errors": sum(r.error is not None for r in stored),
    }
    answered = [r for r in stored if r.error is None]
    ok = [(row, row.explanation) for row in flat(answered) if row.explanation is not None]
    if not ok:
        return summary
    hits = sum(r.cache == "hit" for r in answered)  # instances
    codes = [code for _, e in ok for code in e.warnings]
    summary["warnings"] = {c: codes.count(c) for c in sorted(set(codes))}  # instances per code
    names = ok[0][0].feature_names
    if not names:  # text: every instance has its own players; count classes only
        classes = [e.output_name for _, e in ok]
        summary["per_class"] = {c: {"instances": classes.count(c)} for c in sorted(set(classes))}
        summary["cache_hits"] = hits
        return summary
    same = [e for row, e in ok if row.feature_names == names]
    values = np.abs(np.array([e.values for e in same]))  # [m, n]
    mean_abs = values.mean(axis=0)
    order = np.argsort(-mean_abs)
    k = min(top_k, len(names))
    top = set(order[:k].tolist())
    per_row_top = np.argsort(-values, axis=1)[:, :k]
    summary.update(
        feature_names=list(names),
        mean_abs_value=mean_abs.tolist(),
        top_features=[names[j] for j in order[:k]],
        top1_agreement=float(np.mean(per_row_top[:, 0] == order[0])),
        topk_jaccard=float(
            np.mean([len(top & set(r)) / len(top | set(r)) for r in per_row_top.tolist()])
        ),
        top_features_bootstrap=top_k_bootstrap(values, list(names), k),
        per_class={},
        cache_hits=hits,
    )
    outputs = np.array([e.output_index for e in same])
    for o in np.unique(outputs):
        name = same[int(np.flatnonzero(outputs == o)[0])].output_name
        rows = values[outputs == o]
        summary["per_class"][name] = {
            "instances": len(rows),
            "mean_abs_value": rows.mean(axis=0).tolist(),
        }
    audits = [r.background_audit for r in answered if r.explanations and r.background_audit]
    if audits:
        summary["background_audit"] = dict(audits[0])
    return summary
