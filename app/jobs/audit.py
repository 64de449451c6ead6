"""The `audit` job kind: one explain request's fields over many instances, computed in slices
through the data plane's batch entry (app/batch.py: the cache's answers in one round trip, the
misses as one request, each row cached as its own answer), stored a slice at a time; its
summary (mean |value| per feature and class, top-k stability, the rows that failed).
A classifier's audit explains the output a synchronous request of the same row explains: the
one default-target rule (app/inputs.py default_target), or the request's `target`."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from app.batch import RowAnswer, Rows, answer, dry_run, worker_crashed
from app.errors import ApiError, InvalidInput, PayloadTooLarge, Unprocessable
from app.inputs import resolve_targets, to_array
from app.jobs.context import CancelWatch, JobContext, store_results
from app.jobs.results import AuditResult, stored_json
from app.jobs.store import Job, JobStore
from app.schemas import request_model, spec_fields
from app.service import ExplainService
from explainers.games import Cancelled
from explainers.registry import ExplainerSpec, get_explainer

if TYPE_CHECKING:
    from app.jobs.routes import JobRequest

log = logging.getLogger(__name__)
FIRST_SLICE = 8  # instances in a chunk's first slice; later ones are sized by its time
SLICE_S = 1.0  # seconds of compute between result writes: progress, and rework after a crash
FIRST_ERRORS = 5  # failed rows quoted in a summary


def validate_audit(svc: ExplainService, body: JobRequest, max_instances: int) -> dict[str, Any]:
    """Fail at submission, not in a worker: model, explainer, options, every instance, and
    what every row would meet before its first model call (a budget below the estimator's
    minimum): one instance is run up to that call."""
    if body.inputs is None:
        raise Unprocessable("an audit needs inputs")
    if len(body.inputs) > max_instances:
        raise PayloadTooLarge(f"at most {max_instances} instances per job")
    model = svc.model(body.model)
    spec = svc.explainer(model, body.explainer)
    fields = body.model_dump(include={"target", "seed", "budget", "background", "parameters"})
    fields.update(body.model_extra or {})
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
        dry_run(Rows(svc, body.model, spec, fields), body.inputs[0])
    resolve_targets(model, body.target)  # a bad target list fails here, not per instance
    return {"explainer": spec.name, "fields": fields, "inputs": body.inputs}


def audit_total(body: JobRequest) -> int:
    """One result per instance."""
    return len(body.inputs or [])


def result(row: RowAnswer) -> AuditResult:
    """What the job stores of one row's answer."""
    if row.response is None:
        return AuditResult.failed(row.error or "failed", row.code or "error")
    return AuditResult.of_answer(row.response, row.cache)


def payload(row: RowAnswer) -> dict[str, Any] | str:
    """The stored JSON of one row's answer, from the explanations' JSON when the batch encoded
    them (results.stored_json), else AuditResult.stored's object."""
    if row.response is None or not row.texts:
        return result(row).stored()
    return stored_json(row.response, row.cache, row.texts)


def run_audit(ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Answer the chunk's missing instances a slice at a time (app/batch.py answer), storing
    each slice's results in one write. The first slice has FIRST_SLICE instances; the next ones
    as many as take about SLICE_S at the rate measured so far (a TreeSHAP chunk soon runs as
    one call). A cancel is seen between slices and at the explainers' model calls."""
    if not todo:
        return
    spec = get_explainer(job.request["explainer"])
    instances = ctx.store.inputs(job, range(todo[0], todo[-1] + 1))
    fields = job.request["fields"]
    watch = CancelWatch(ctx, job.id)
    done, size = 0, FIRST_SLICE
    while done < len(todo):
        if watch(fresh=True):  # nothing is stored after a cancel
            return
        part = todo[done : done + size]
        start = time.perf_counter()
        try:
            answers = _answer(ctx, job, spec, fields, [instances[i] for i in part], watch)
        except ApiError as exc:
            cause = exc.__cause__
            # a cancel stops the chunk; a crashed model worker fails the attempt (retried)
            if cause is not None and (isinstance(cause, Cancelled) or worker_crashed(cause)):
                raise cause from None
            raise
        if watch(fresh=True):
            return
        stored = {i: payload(a) for i, a in zip(part, answers, strict=True)}
        store_results(ctx, job.id, stored)
        done += len(part)
        per_row = (time.perf_counter() - start) / len(part)
        size = max(1, min(len(todo), int(SLICE_S / max(per_row, 1e-6))))


def _answer(
    ctx: JobContext,
    job: Job,
    spec: ExplainerSpec,
    fields: dict[str, Any],
    instances: list[Any],
    watch: CancelWatch,
) -> list[RowAnswer]:
    """The slice's answers: through the batch entry, or (an explainer whose own fields carry
    the instance) each instance's fields as one request."""
    svc = ctx.service
    if spec.uses_inputs:
        return answer(Rows(svc, job.model, spec, fields), instances, watch)
    out = []
    for instance in instances:
        rows = Rows(svc, job.model, spec, {**fields, **instance})
        out.append(_fields_answer(rows, watch))
    return out


def _fields_answer(rows: Rows, watch: CancelWatch) -> RowAnswer:
    """One request whose fields are the instance (RankSHAP's query and documents, ...)."""
    try:
        body = request_model(rows.spec)(**rows.fields)
        outcome = rows.svc.explain(rows.model, rows.spec.name, body, use_cache=True)
    except ValidationError as exc:
        return RowAnswer(error=f"invalid instance: {exc.errors()[0]['msg']}", code="invalid")
    except ApiError as exc:
        if isinstance(exc.__cause__, Cancelled) or worker_crashed(exc.__cause__):
            raise
        return RowAnswer(error=exc.message, code=exc.code)
    return RowAnswer(outcome.response, outcome.cache)


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
        # the resample's mean as counts times rows: no [m, n] copy of a million rows
        drawn = np.bincount(rng.integers(0, len(values), len(values)), minlength=len(values))
        top = np.argsort(-(drawn @ values) / len(values))[:k]
        counts[top] += 1
        same += set(top.tolist()) == full
    order = np.argsort(-counts)
    return {
        "resamples": resamples,
        "same_top_k": same / resamples,
        "in_top_k": {names[j]: counts[j] / resamples for j in order if counts[j] > 0},
    }


class _Tally:
    """What a summary needs of the stored results, gathered in one pass a page at a time: the
    values of the explanations over the first explanation's players as float64 blocks, their
    outputs, counts; never every parsed result at once (a million rows)."""

    def __init__(self) -> None:
        self.instances = 0
        self.failed: list[dict[str, Any]] = []
        self.errors = 0
        self.hits = 0
        self.codes: dict[str, int] = {}
        self.names: tuple[str, ...] | None = None
        self.blocks: list[np.ndarray] = []  # |values| [rows, n] of explanations over `names`
        self.outputs: list[int] = []
        self.output_names: dict[int, str] = {}
        self.text_classes: dict[str, int] = {}
        self.background_audit: dict[str, Any] | None = None
        self.explained = 0

    def add(self, results: list[AuditResult]) -> None:
        block: list[tuple[float, ...]] = []
        for r in results:
            self.instances += 1
            if not r.explanations:
                self.errors += 1
                if len(self.failed) < FIRST_ERRORS:
                    self.failed.append({"index": r.index, "code": r.code, "error": r.error})
                continue
            self.hits += r.cache == "hit"
            if r.background_audit and self.background_audit is None:
                self.background_audit = dict(r.background_audit)
            for row in r.rows():
                e = row.explanation
                if e is None:
                    continue
                self.explained += 1
                for code in e.warnings:
                    self.codes[code] = self.codes.get(code, 0) + 1
                if self.names is None:
                    self.names = row.feature_names or ()
                if not self.names:  # text: every instance has its own players
                    self.text_classes[e.output_name] = self.text_classes.get(e.output_name, 0) + 1
                elif row.feature_names == self.names:
                    block.append(e.values)
                    self.outputs.append(e.output_index)
                    self.output_names.setdefault(e.output_index, e.output_name)
        if block:
            self.blocks.append(np.abs(np.asarray(block, dtype=np.float64)))


DEFAULT_TARGET_RULE = (
    "default, as a synchronous explain of each row: a binary classifier's positive class (its "
    "second output), a multi-class classifier's predicted class, a regressor's output"
)


def target_said(asked: Any) -> str:
    """Which output the audit explains, in words (per_class says which were explained)."""
    return DEFAULT_TARGET_RULE if asked is None else f"as asked: {json.dumps(asked)}"


def summarise_audit(store: JobStore, job: Job, top_k: int = 3) -> dict[str, Any]:
    """Mean |value| per feature, per explained class, how stable the top features are, how
    many instances carry each warning code, and the rows that failed. With several targets,
    each instance's explanations count as rows (per_class: one entry per output). Read a page
    of results at a time."""
    tally = _Tally()
    for page in store.payload_pages(job.id):
        tally.add([AuditResult.parse({"index": i, **json.loads(p)}) for i, p in page])
    summary: dict[str, Any] = {
        "instances": tally.instances,
        "errors": tally.errors,
        "first_errors": tally.failed,
        "target": target_said(job.request.get("fields", {}).get("target")),
    }
    if not tally.explained:
        return summary
    summary["warnings"] = dict(sorted(tally.codes.items()))  # instances per code
    names = tally.names or ()
    if not names:
        summary["per_class"] = {c: {"instances": n} for c, n in sorted(tally.text_classes.items())}
        summary["cache_hits"] = tally.hits
        return summary
    values = np.concatenate(tally.blocks)  # [m, n]
    mean_abs = values.mean(axis=0)
    order = np.argsort(-mean_abs)
    k = min(top_k, len(names))
    top = set(order[:k].tolist())
    agree, jaccard = 0, 0.0
    for start in range(0, len(values), 100_000):  # bounded temporaries
        per_row_top = np.argsort(-values[start : start + 100_000], axis=1)[:, :k]
        agree += int(np.sum(per_row_top[:, 0] == order[0]))
        jaccard += sum(len(top & set(r)) / len(top | set(r)) for r in per_row_top.tolist())
    summary.update(
        feature_names=list(names),
        mean_abs_value=mean_abs.tolist(),
        top_features=[names[j] for j in order[:k]],
        top1_agreement=agree / len(values),
        topk_jaccard=jaccard / len(values),
        top_features_bootstrap=top_k_bootstrap(values, list(names), k),
        per_class={},
        cache_hits=tally.hits,
    )
    outputs = np.asarray(tally.outputs)
    for o in np.unique(outputs):
        rows = values[outputs == o]
        summary["per_class"][tally.output_names[int(o)]] = {
            "instances": len(rows),
            "mean_abs_value": rows.mean(axis=0).tolist(),
        }
    if tally.background_audit is not None:
        summary["background_audit"] = tally.background_audit
    return summary
