"""The job code: one chunk of instances at a time, idempotent, the same in every queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from app.cache import CacheUnavailable
from app.errors import ApiError
from app.jobs.store import FINISHED, Job, JobStore
from app.schemas import ExplainResponse, request_model
from app.service import ExplainService, Prepared
from explainers.games import Cancelled, stop_when
from explainers.registry import get_explainer

log = logging.getLogger(__name__)
WRITE_EVERY = 10  # instances between result writes: bounds rework after a crash
CANCEL_POLL_S = 0.2  # how stale a running chunk's view of its job's cancel flag may be


@dataclass
class JobContext:
    service: ExplainService
    store: JobStore


def run_chunk(ctx: JobContext, job_id: str, chunk: int) -> None:
    """Compute the missing results of one chunk; finish the job when all are stored."""
    job = ctx.store.get(job_id)
    if job is None or job.status in FINISHED:
        return
    ctx.store.mark_running(job_id)
    indices = job.chunk(chunk)
    stored = ctx.store.stored_indices(job_id, indices)  # one query, not one per instance
    todo = [i for i in indices if i not in stored]
    try:
        # A cancel reaches the explainers at their next model call (sampling: the next round).
        with stop_when(CancelWatch(ctx, job_id)):
            KINDS[job.kind](ctx, job, todo)
    except Cancelled:
        log.info("job %s chunk %d stopped: cancelled", job_id, chunk)
        return
    except Exception as exc:
        log.exception("job %s chunk %d failed", job_id, chunk)
        ctx.store.finish(job_id, "failed", error=f"{type(exc).__name__}: {exc}")
        return
    done = ctx.store.add_results(job_id, {})
    if done >= job.total:
        ctx.store.finish(job_id, "succeeded", summary=SUMMARIES[job.kind](ctx.store, job))


def _cancelled(ctx: JobContext, job_id: str) -> bool:
    job = ctx.store.get(job_id)
    return job is None or job.status in FINISHED


class CancelWatch:
    """Whether a job was cancelled (or finished elsewhere), asking the store at most every
    CANCEL_POLL_S seconds: explainers call it before every model call."""

    def __init__(self, ctx: JobContext, job_id: str) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.asked = -float("inf")
        self.cancelled = False

    def __call__(self, fresh: bool = False) -> bool:
        now = time.monotonic()
        if not self.cancelled and (fresh or now - self.asked >= CANCEL_POLL_S):
            self.asked = now
            self.cancelled = _cancelled(self.ctx, self.job_id)
        return self.cancelled


def _audit_result(answer: ExplainResponse, cache: str | None = None) -> dict[str, Any]:
    """What a job stores of a one-instance answer (`cache`: how it was found, default as it
    says)."""
    result: dict[str, Any] = {
        "explanation": answer.data.explanations[0].model_dump(exclude_unset=True),
        "feature_names": answer.data.feature_names,
        "cache": answer.meta.cache if cache is None else cache,
    }
    if answer.meta.background_audit is not None:
        result["background_audit"] = answer.meta.background_audit
    return result


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
    pending: dict[int, dict[str, Any]] = {}
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
                pending[i] = _audit_result(p.response)
        except ApiError as exc:
            pending[i] = {"error": exc.message, "code": exc.code}
        except ValidationError as exc:
            pending[i] = {"error": f"invalid instance: {exc.errors()[0]['msg']}", "code": "invalid"}
    try:
        blobs = svc.cache.get_many([p.key for p in prepared.values()])
    except CacheUnavailable:
        blobs = [None] * len(prepared)
        for p in prepared.values():
            p.status = "bypass"
    for i, blob in zip(list(prepared), blobs, strict=True):
        if blob is not None:
            pending[i] = _audit_result(ExplainResponse.model_validate_json(blob), "hit")
            del prepared[i]
    hits = sum(b is not None for b in blobs)
    if hits:
        svc.metrics.cache.labels("hit").inc(hits)
    if prepared:
        svc.metrics.cache.labels(next(iter(prepared.values())).status).inc(len(prepared))
    answers: dict[str, str] = {}  # cache key -> JSON of the answers computed here
    try:
        _compute(ctx, job, prepared, pending, answers)
    finally:  # cancelled or failed part-way: what was computed is still a valid answer
        try:
            svc.cache.set_many(answers)
        except CacheUnavailable as exc:
            log.warning("job %s: %d answers not cached: %s", job.id, len(answers), exc)


def _compute(
    ctx: JobContext,
    job: Job,
    prepared: dict[int, Prepared],
    pending: dict[int, dict[str, Any]],
    answers: dict[str, str],
) -> None:
    """Compute the instances that missed; store results every WRITE_EVERY and at the end."""
    watch = CancelWatch(ctx, job.id)
    for count, (i, p) in enumerate(prepared.items(), start=1):
        if watch():  # the remaining instances don't run
            return
        if p.req.timeout_ms is not None:  # each instance's time limit starts when it runs
            p.deadline = time.monotonic() + p.req.timeout_ms / 1000
        try:
            pending[i] = _audit_result(ctx.service.compute(p, defer=answers).response)
        except ApiError as exc:
            if isinstance(exc.__cause__, Cancelled):
                raise exc.__cause__ from None
            pending[i] = {"error": exc.message, "code": exc.code}
        if count % WRITE_EVERY == 0:
            if watch(fresh=True):  # nothing is stored after a cancel
                return
            ctx.store.add_results(job.id, pending)
            pending = {}
    if not watch(fresh=True):
        ctx.store.add_results(job.id, pending)


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
    """Mean |value| per feature, per predicted class, how stable the top features are, and how
    many instances carry each warning code."""
    results = store.all_results(job.id)
    ok = [r for r in results if "error" not in r]
    summary: dict[str, Any] = {"instances": len(results), "errors": len(results) - len(ok)}
    if not ok:
        return summary
    codes = [w["code"] for r in ok for w in r["explanation"].get("warnings") or []]
    summary["warnings"] = {c: codes.count(c) for c in sorted(set(codes))}  # instances per code
    names = ok[0]["feature_names"]
    if not names:  # text: every instance has its own players; count classes only
        classes = [r["explanation"]["output_name"] for r in ok]
        summary["per_class"] = {c: {"instances": classes.count(c)} for c in sorted(set(classes))}
        summary["cache_hits"] = sum(r["cache"] == "hit" for r in ok)
        return summary
    same = [r for r in ok if r["feature_names"] == names]
    values = np.abs(np.array([r["explanation"]["values"] for r in same]))  # [m, n]
    mean_abs = values.mean(axis=0)
    order = np.argsort(-mean_abs)
    k = min(top_k, len(names))
    top = set(order[:k].tolist())
    per_row_top = np.argsort(-values, axis=1)[:, :k]
    summary.update(
        feature_names=names,
        mean_abs_value=mean_abs.tolist(),
        top_features=[names[j] for j in order[:k]],
        top1_agreement=float(np.mean(per_row_top[:, 0] == order[0])),
        topk_jaccard=float(
            np.mean([len(top & set(r)) / len(top | set(r)) for r in per_row_top.tolist()])
        ),
        top_features_bootstrap=top_k_bootstrap(values, names, k),
        per_class={},
        cache_hits=sum(r["cache"] == "hit" for r in ok),
    )
    outputs = np.array([r["explanation"]["output_index"] for r in same])
    for o in np.unique(outputs):
        name = same[int(np.flatnonzero(outputs == o)[0])]["explanation"]["output_name"]
        rows = values[outputs == o]
        summary["per_class"][name] = {
            "instances": len(rows),
            "mean_abs_value": rows.mean(axis=0).tolist(),
        }
    audits = [r["background_audit"] for r in ok if r.get("background_audit")]
    if audits:
        summary["background_audit"] = audits[0]
    return summary


def run_learn_baseline(ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Learn baseline values (Ren et al. 2023) for a model; one result, the baseline."""
    if not todo:
        return
    import torch

    from explainers.learned_baseline import learn_baseline, low_order_objective

    model = ctx.service.model(job.model)
    opts = job.request["parameters"]
    data = model.reference if model.reference is not None else model.background
    if data is None:
        raise ValueError(f"model {model.name!r} has no reference data to learn from")
    x = np.asarray(job.request.get("inputs") or data[: opts["rows"]], dtype=np.float32)
    logodds = model.task == "classification"
    if opts.get("labels") is not None:  # the paper's target: log-odds of the true label
        target = np.asarray(opts["labels"], dtype=np.int64)
    elif logodds:
        target = model.predict(x).argmax(axis=1)
    else:
        target = np.zeros(len(x), dtype=np.int64)
    learned = learn_baseline(
        model.module,
        x.reshape(len(x), -1),
        target,
        data.reshape(len(data), -1),
        logodds=logodds,
        init=opts["init"],
        lr=opts["lr"],
        iterations=opts["iterations"],
        sample_num=opts["sample_num"],
        low_order=opts["low_order"],
        deviation=opts["deviation"],
        seed=opts["seed"],
    )

    def objective(b: np.ndarray) -> float:  # fixed contexts, comparable across baselines
        with torch.no_grad():
            return float(
                low_order_objective(
                    model.module,
                    torch.as_tensor(x.reshape(len(x), -1)),
                    torch.as_tensor(target),
                    torch.as_tensor(b, dtype=torch.float32),
                    logodds=logodds,
                    sample_num=opts["sample_num"],
                    low_order=opts["low_order"],
                    generator=torch.Generator().manual_seed(opts["seed"] + 7),
                )
            )

    ctx.store.add_results(
        job.id,
        {
            0: {
                "model_version": model.version,
                "target": "labels" if opts.get("labels") is not None else "predicted",
                "baseline": learned.baseline.tolist(),
                "lower": learned.lower.tolist(),
                "upper": learned.upper.tolist(),
                "objective": {
                    "zero": objective(np.zeros(model.n_features)),
                    "mean": objective(data.reshape(len(data), -1).mean(axis=0)),
                    "learned": objective(learned.baseline),
                    "training": list(learned.objective),
                },
            }
        },
    )


def summarise_learned(store: JobStore, job: Job) -> dict[str, Any]:
    result = store.all_results(job.id)[0]
    return {
        "baseline_ref": job.id,
        "model_version": result["model_version"],
        "target": result.get("target", "predicted"),  # whose log-odds: predicted or labels
        "objective": result["objective"],
    }


def run_train_salvage(ctx: JobContext, job: Job, todo: list[int]) -> None:
    """Train a Salvage surrogate and explainer (Naouar et al. 2025); one result per epoch
    (the progress), the last one names the stored artifact. A configuration already trained
    for this model version is reused (training is seeded)."""
    if not todo:
        return
    from explainers import salvage
    from explainers.salvage_store import SalvageStore

    model = ctx.service.model(job.model)
    opts = salvage.SalvageTrainOptions(**job.request["parameters"])
    store = SalvageStore.within(ctx.service.context.need_artifacts("salvage"))
    inputs = job.request.get("inputs")
    info = None if inputs else store.info(model.name, model.version, opts.digest())
    if info is None:
        count = 0

        def progress(record: dict[str, Any]) -> bool:
            nonlocal count
            ctx.store.add_results(job.id, {count: record})
            count += 1
            return not _cancelled(ctx, job.id)

        data = None if not inputs else np.asarray(inputs, dtype=np.float32)
        if data is not None:
            data = data.reshape(len(data), *model.input_shape)
        trained = salvage.train(model, opts, data, progress)
        if trained is None:  # cancelled
            return
        info = store.save(model, trained)
    else:
        ctx.store.add_results(job.id, dict(enumerate(info.history)))
    ctx.store.add_results(
        job.id,
        {
            job.total - 1: {
                "artifact": info.id,
                "model_version": info.model_version,
                "config": info.config,
                "metrics": info.metrics,
            }
        },
    )


def summarise_salvage(store: JobStore, job: Job) -> dict[str, Any]:
    result = store.all_results(job.id)[-1]
    return {
        "artifact": result["artifact"],
        "model_version": result["model_version"],
        "objective": result["config"]["objective"],
        "sampler": result["config"]["sampler"],
        "metrics": result["metrics"],
        "explain": f"POST /v2/models/{job.model}/explain/salvage with "
        f'{{"parameters": {{"artifact": "{result["artifact"]}"}}}}',
    }


KINDS: dict[str, Callable[[JobContext, Job, list[int]], None]] = {
    "audit": run_audit,
    "learn-baseline": run_learn_baseline,
    "train-salvage": run_train_salvage,
}
SUMMARIES: dict[str, Callable[[JobStore, Job], dict[str, Any]]] = {
    "audit": summarise_audit,
    "learn-baseline": summarise_learned,
    "train-salvage": summarise_salvage,
}
