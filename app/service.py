"""The explain service: look up, validate, consult the cache, run an explainer, shape."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.auth import may_use
from app.cache import (
    Cache,
    CacheUnavailable,
    cache_key,
    hit_answer,
    key_of,
    scope_part,
    spliced,
)
from app.errors import (
    ApiError,
    GatewayTimeout,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ShuttingDown,
    from_library,
)
from app.evaluate import attach_evaluation, split_evaluate
from app.inputs import check_range, default_target, resolve_targets, to_array
from app.jobs.store import JobStore, learned_baseline
from app.logging import current_request_id
from app.metrics import Metrics
from app.schemas import (
    ExplainData,
    ExplainMeta,
    ExplainRequestBase,
    ExplainResponse,
    ExplanationOut,
    PlayerOut,
    WarningOut,
    spec_fields,
)
from app.settings import Settings
from explainers.context import Artifacts, ExplainRequest, NotTrainedError, RunContext
from explainers.estimators.budget import ceiling
from explainers.explanation import ExplainResult, OptionError
from explainers.games import Cancelled, DeadlineExceeded, ExplainerError, deadline
from explainers.games.deadlines import any_of, stop_when
from explainers.registry import ExplainerSpec, get_explainer, unsupported
from explainers.trust.caveats import with_caveats
from explainers.trust.evaluation import EvaluateOptions
from models.adapters.remote import cache_version
from models.base import Model, ModelError, TextModel
from models.registry import ModelRegistry

log = logging.getLogger(__name__)

# Explainers whose one run explains several outputs from the same model evaluations (a target
# tuple reaches them); the others run once per output asked for (meta.targets says so).
SHARED_TARGETS = frozenset({"shapley"})


def array_digest(arr: np.ndarray | None) -> str | None:
    if arr is None:
        return None
    if arr.dtype.kind == "U":  # texts: hash the strings themselves, not their padded buffer
        return hashlib.sha256(json.dumps(arr.tolist()).encode()).hexdigest()
    return hashlib.sha256(str(arr.shape).encode() + arr.tobytes()).hexdigest()


SLOT_INPUTS, SLOT_SENT = "\x00inputs\x00", "\x00as_sent\x00"


def sent_digest(sent: Any) -> str:
    """The instances as sent: the answer echoes each as sent (`data`), so a row sent as a dict,
    or 50 instead of 50.0, is another answer even when the numbers are the same."""
    return hashlib.sha256(json.dumps(sent, separators=(",", ":")).encode()).hexdigest()[:16]


def keyed(parts: dict[str, Any], inputs: np.ndarray, sent: Any) -> str:
    """The cache key of a request: its parts (everything but the instances) and instances."""
    return cache_key({**parts, "inputs": array_digest(inputs), "as_sent": sent_digest(sent)})


@dataclass(frozen=True)
class Outcome:
    """An answer: typed for the service's callers, and its JSON for HTTP (made once)."""

    response: ExplainResponse  # with this request's id and meta.cache
    json: bytes

    @property
    def cache(self) -> str:
        return self.response.meta.cache


@dataclass
class Prepared:
    """A validated request that missed (or bypassed) the cache, ready to compute."""

    model: Model
    spec: ExplainerSpec
    req: ExplainRequestBase
    inputs: np.ndarray
    background: np.ndarray | None
    target: int | tuple[int, ...] | None  # a tuple: several outputs, in the order asked
    options: Any
    key: str
    status: str
    request_id: str
    fields: dict[str, Any]  # the explainer's own top-level request fields
    deadline: float | None  # time.monotonic() by which to answer (timeout_ms from arrival)
    evaluate: EvaluateOptions | None = None  # parameters.evaluate: figures for each explanation
    out_of_range: dict[int, str] | None = None  # allowed out-of-range instances: warnings
    timeout_ms: int | None = None  # the limit in force: the request's or the server's default
    default_limit: bool = False  # the limit is the server's DEFAULT_TIMEOUT_MS
    cancel: Callable[[], bool] | None = None  # true once the caller withdrew (client left)
    key_parts: dict[str, Any] | None = None  # the cache key's parts but the instances
    keys: list[str] | None = None  # row_keys, once made

    def row_keys(self) -> list[str]:
        """The cache key of each instance sent alone (a one-instance request, same fields): a
        batch answers each row under the key a request of that row alone looks up. `keyed`'s
        canonical JSON is made once with two slots, each row's digests put in (the same bytes
        as keyed's for that row alone)."""
        if self.keys is not None:
            return self.keys
        if self.key_parts is None:
            raise ValueError("a request prepared without its key's parts")
        slots = {**self.key_parts, "as_sent": SLOT_SENT, "inputs": SLOT_INPUTS}
        template = json.dumps(slots, sort_keys=True, separators=(",", ":"), default=str)
        # sorted keys: "as_sent" comes before "inputs"
        a, rest = template.split(json.dumps(SLOT_SENT), 1)
        b, c = rest.split(json.dumps(SLOT_INPUTS), 1)
        self.keys = [
            key_of(a + json.dumps(sent_digest([x])) + b + json.dumps(array_digest(row)) + c)
            for row, x in zip(self.inputs[:, None], self.req.inputs, strict=True)
        ]
        return self.keys

    def request(self, context: RunContext) -> ExplainRequest:
        """The explainer's typed request, for all the targets asked."""
        return ExplainRequest(
            self.model, self.inputs, self.options, self.target, self.req.seed, self.req.budget,
            self.background, self.fields, context,
        )  # fmt: skip


class ExplainService:
    def __init__(
        self, settings: Settings, registry: ModelRegistry, cache: Cache, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.cache = cache
        self.metrics = metrics
        self.jobs: JobStore | None = None  # set when a job store exists (learned baselines)
        # Set when the server shuts down: every computation stops at its next model call.
        self.stopping = threading.Event()

    @property
    def context(self) -> RunContext:
        """What this app's explainers get (explainers/context.py): the cache, trained artifacts
        in the model store (read now: the registry's store is set after construction), and
        learned baselines from the job store."""
        return RunContext(
            store=self.cache,
            artifacts=Artifacts(self.settings.model_dir, self.registry.store),
            baselines=lambda model, ref: learned_baseline(self.jobs, model, ref),
        )

    def model(self, name: str) -> Model:
        """The model called `name`, if the request's key may use it (another key's unshared
        model is answered as unknown: its name is not revealed)."""
        if not self.may_use(name):
            raise NotFound(f"unknown model {name!r}", code="unknown_model")
        try:
            return self.registry.get(name)
        except ModelError as exc:
            raise from_library(exc) from exc

    def may_use(self, name: str) -> bool:
        """Whether the running request's key may use model `name` (app/auth.py may_use)."""
        return may_use(*self.registry.owner(name))

    def explainer(self, model: Model, name: str) -> ExplainerSpec:
        try:
            spec = get_explainer(name)
        except KeyError as exc:
            raise from_library(exc) from exc
        refusal = unsupported(spec, model)
        if refusal is not None:
            raise from_library(refusal)
        return spec

    def explain(
        self, model_name: str, explainer_name: str, req: ExplainRequestBase, use_cache: bool
    ) -> Outcome:
        """Run (or fetch from the cache) one explain request; blocking, call off the loop."""
        prepared = self.prepare(model_name, explainer_name, req, use_cache)
        return prepared if isinstance(prepared, Outcome) else self.compute(prepared)

    def prepare(
        self,
        model_name: str,
        explainer_name: str,
        req: ExplainRequestBase,
        use_cache: bool,
        arrived: float | None = None,
        lookup: bool = True,
        default_timeout_ms: int = 0,
        whole_key: bool = True,
    ) -> Outcome | Prepared:
        """Validate and consult the cache: cheap, so hits never wait for a compute slot.

        `arrived` (time.monotonic()) starts the request's `timeout_ms`; default: now.
        `lookup=False`: the caller looks the key up itself (the HTTP route, without blocking
        the event loop) and counts it; the answer is then always a Prepared.
        `default_timeout_ms`: the limit of a request without timeout_ms (the HTTP route passes
        DEFAULT_TIMEOUT_MS; jobs pass nothing: an audit is not bounded by it); 0: none.
        `whole_key=False`: a batch keys each row (Prepared.row_keys), not the whole request
        (its `key` is empty: it is never looked up).
        """
        arrived = time.monotonic() if arrived is None else arrived
        timeout_ms = req.timeout_ms or default_timeout_ms or None
        limit = None if timeout_ms is None else arrived + timeout_ms / 1000
        model = self.model(model_name)
        spec = self.explainer(model, explainer_name)
        s = self.settings
        if req.inputs is not None and len(req.inputs) > s.max_instances:
            raise PayloadTooLarge(f"at most {s.max_instances} instances per request")
        if req.budget is not None and req.budget > s.max_budget:
            raise ApiError(f"budget may be at most {s.max_budget}", code="budget_too_large")
        fields = {name: getattr(req, name) for name in spec_fields(spec)}
        if spec.uses_inputs:
            inputs = to_array(model, req.inputs, "inputs")
        elif req.inputs is not None:
            raise InvalidInput(
                f"{spec.name} takes its instance as {', '.join(fields)}, not as inputs"
            )
        else:
            inputs = np.empty((0,), dtype=np.float32)
        background = None
        if req.background is not None:
            if isinstance(model, TextModel):
                raise InvalidInput(
                    "background does not apply to text models: absent words are deleted or "
                    "masked (parameters.absence)"
                )
            if not 1 <= len(req.background) <= s.max_background_rows:
                raise PayloadTooLarge(f"background needs 1 to {s.max_background_rows} rows")
            background = to_array(model, req.background, "background")
        params = getattr(req, "parameters")  # noqa: B009
        allow = bool(getattr(params, "allow_out_of_range", False))
        out_of_range = check_range(model, inputs, "inputs", allow)
        if background is not None:
            for message in check_range(model, background, "background", allow).values():
                out_of_range = dict.fromkeys(range(len(inputs)), message) | out_of_range
        target = resolve_targets(model, req.target)
        if req.target is None and not spec.explains_decision:
            target = default_target(model)
        params, evaluate = split_evaluate(spec, params)
        options = self._pin(spec, model, params)
        parts = {
            "model": model.name,
            # a remote model's: also its remote's metadata and the REMOTE_CACHE_TTL_S period
            "model_version": cache_version(model),
            "explainer": spec.name,
            "explainer_version": spec.version,
            "options": options.model_dump(mode="json"),
            "seed": req.seed,
            "budget": req.budget,
            "target": target,
            "background": array_digest(background),
            "fields": req.model_dump(mode="json", include=set(fields)),
            # `data` echoes large instances only when asked (app/schemas.py ECHO_LIMIT)
            **({"return_inputs": True} if getattr(req, "return_inputs", False) else {}),
            **({"evaluate": evaluate.model_dump(mode="json")} if evaluate else {}),
            **scope_part(s.cache_scope),  # CACHE_SCOPE=key: the key's own answers
        }
        key = keyed(parts, inputs, req.inputs) if whole_key else ""
        request_id = req.id or current_request_id() or uuid.uuid4().hex
        status = "bypass"
        if use_cache and not lookup:
            status = "miss"  # until the caller's look-up says otherwise
        elif use_cache:
            try:
                hit = self.cache.get(key)
                status = "miss"
            except CacheUnavailable:
                hit = None
            if hit is not None:
                self.metrics.cache.labels("hit").inc()
                return self.cached(hit.encode(), request_id)
            self.metrics.cache.labels(status).inc()
        return Prepared(
            model,
            spec,
            req,
            inputs,
            background,
            target,
            options,
            key,
            status,
            request_id,
            fields,
            limit,
            evaluate,
            out_of_range,
            timeout_ms,
            req.timeout_ms is None and timeout_ms is not None,
            key_parts=parts,
        )

    def inline_model(
        self, model_name: str, spec: ExplainerSpec, req: ExplainRequestBase
    ) -> Model | None:
        """The model when prepare(lookup=False) runs without I/O for this request: a loaded
        built-in, options that the explainer's pin leaves alone (no learned baseline or trained
        artifact to read) (the event loop may call it then; the route bounds the body's size)."""
        if model_name not in self.registry.builtin_names():
            return None  # registered models: the registry may read the shared store
        if spec.pin is not None and spec.pin.applies(getattr(req, "parameters", None)):
            return None
        return self.registry.peek(model_name)[0]  # None while not loaded: loading takes seconds

    def compute(self, p: Prepared, encode: bool = True) -> Outcome:
        """Run the explainer for a prepared request and store a cacheable answer. `encode`
        False: the caller makes the JSON it needs (a batch: each row's, app/batch.py), the
        answer is neither encoded (Outcome.json is empty) nor cached here."""
        model, spec, req, status = p.model, p.spec, p.req, p.status
        start = time.perf_counter()
        context = self.context
        try:
            stop = stop_when(any_of(p.cancel, self.stopping.is_set))
            with deadline(p.deadline), stop, ceiling(self.settings.max_budget):
                result = self._run(p, context)
                k = n_targets(p.target)
                rows, outside = p.inputs, p.out_of_range
                if k > 1:  # explanations [m * k]: instance-major, k outputs each
                    rows = np.repeat(p.inputs, k, axis=0)
                    outside = {i * k + j: w for i, w in (outside or {}).items() for j in range(k)}
                result = with_caveats(model, rows, result, outside)
                result = attach_evaluation(replace(p, inputs=rows), result, context)
        except DeadlineExceeded as exc:
            raise GatewayTimeout(
                f"{limit_text(p)} passed before an answer (the sampled Shapley estimators "
                "answer from their first completed round on, and not one fitted); raise "
                "timeout_ms or lower the budget"
            ) from exc
        except Cancelled as exc:
            if self.stopping.is_set():
                log.info("explanation %s cancelled: the server is shutting down", p.request_id)
                self.metrics.cancelled.labels("shutdown").inc()
                raise ShuttingDown(
                    "the server is shutting down: the explanation was cancelled; retry",
                    headers={"Retry-After": "1"},
                ) from exc
            raise from_library(exc) from exc
        except (ExplainerError, ModelError) as exc:
            raise from_library(exc) from exc
        elapsed = (time.perf_counter() - start) * 1000
        if any(e.partial for e in result.explanations):  # fewer samples than asked: never
            status = "bypass"  # served again from the cache
        response = self._shape(model, spec, req, result, elapsed, status)
        self.metrics.model_evals.labels(model.name, spec.name).inc(response.meta.n_model_evals)
        if not encode:
            return Outcome(response.model_copy(update={"id": p.request_id}), b"")
        try:
            blob = response.to_json()
        except ValueError:
            raise non_finite() from None
        answered = status
        if status == "miss":
            try:
                self.cache.set(p.key, blob)
            except CacheUnavailable:
                answered = "bypass"
        meta = response.meta.model_copy(update={"cache": answered})
        answer = spliced(blob.encode(), p.request_id, answered, was=status)
        if answer is None:  # to_json's layout always has both slots
            raise RuntimeError("an answer without its id and cache slots")
        return Outcome(response.model_copy(update={"id": p.request_id, "meta": meta}), answer)

    @staticmethod
    def _run(p: Prepared, context: RunContext) -> ExplainResult:
        """The explainer's result; with several targets, instance-major (each instance's
        explanations in the order asked) and meta.targets saying how the budget was spent."""

        def once(target: int | tuple[int, ...] | None) -> ExplainResult:
            return p.spec.explain(replace(p.request(context), target=target))

        if not isinstance(p.target, tuple):
            return once(p.target)
        targets = p.target
        if p.spec.name in SHARED_TARGETS:
            result = once(targets)
        else:
            result = per_target([once(t) for t in targets])
        asked = [e.output_index for e in result.explanations]
        if len(asked) % len(targets) or asked != list(targets) * (len(asked) // len(targets)):
            raise OptionError(
                f"{p.spec.name} explains one output of its own here; a target list does not apply"
            )
        default = "shared" if p.spec.name in SHARED_TARGETS else "per target"
        how = (result.meta.get("targets") or {}).get("budget", default)
        names = [p.model.output_names[t] for t in targets]
        meta = {"output_indices": list(targets), "output_names": names, "budget": how}
        return replace(result, meta={**result.meta, "targets": meta})

    @staticmethod
    def cached(blob: bytes, request_id: str) -> Outcome:
        """A stored answer as this request's cache hit (parsed once, for the typed result)."""
        response = ExplainResponse.model_validate_json(blob)
        meta = response.meta.model_copy(update={"cache": "hit"})
        answer = hit_answer(blob, request_id)
        typed = response.model_copy(update={"id": request_id, "meta": meta})
        return Outcome(typed, answer if answer is not None else typed.to_json().encode())

    def _pin(self, spec: ExplainerSpec, model: Model, options: Any) -> Any:
        """Bind the options to stored state (explainers/context.py Pin): part of the cache key,
        so that retraining or relearning never serves stale answers; 409 when nothing is
        trained yet."""
        if spec.pin is None or not spec.pin.applies(options):
            return options
        try:
            return spec.pin.bind(model, options, self.context)
        except NotTrainedError as exc:
            train = json.dumps({"kind": spec.train_job, "model": model.name})
            raise ApiError(
                f"{exc}; train one with POST /v2/jobs {train}", code="explainer_not_trained"
            ).with_status(409) from None
        except (ExplainerError, ModelError) as exc:
            raise from_library(exc) from exc

    @staticmethod
    def _shape(
        model: Model,
        spec: ExplainerSpec,
        req: ExplainRequestBase,
        result: ExplainResult,
        elapsed_ms: float,
        cache: str,
    ) -> ExplainResponse:
        """The typed answer (id "": each request's id is spliced into the stored JSON)."""
        undeclared = result.meta.keys() - ExplainMeta.model_fields.keys()
        if undeclared:  # a programming error: the answer's contract is app/schemas.py
            raise TypeError(f"{spec.name} answers undeclared meta {sorted(undeclared)}")
        k = len((result.meta.get("targets") or {}).get("output_indices") or [0])
        from app.schemas import echoed  # an instance over ECHO_LIMIT numbers: its digest

        asked = bool(getattr(req, "return_inputs", False))
        echoes = [echoed(x, asked) for x in req.inputs] if spec.uses_inputs else []
        explanations = [
            ExplanationOut(
                output_index=e.output_index,
                output_name=e.output_name or model.output_names[e.output_index],
                data=raw,
                **({} if digest is None else {"data_digest": digest}),
                values=e.values.tolist(),
                base_value=e.base_value,
                instance_output_value=e.instance_output_value,
                approximation_error=e.approximation_error,
                error_std=None if e.error_std is None else e.error_std.tolist(),
                interactions=e.interactions,
                players=None
                if e.players is None
                else [PlayerOut(text=p.text, start=p.start, end=p.end) for p in e.players],
                details=e.details,
                warnings=[WarningOut(code=w.code, message=w.message) for w in e.warnings],
                exact=e.exact,
                estimator=e.estimator,
                n_model_evals=e.n_model_evals,
            )
            for e, (raw, digest) in zip(
                result.explanations,
                [echo for echo in echoes for _ in range(k)]
                if spec.uses_inputs
                else [(None, None)] * len(result.explanations),
                strict=True,
            )
        ]
        meta = ExplainMeta(
            explainer=spec.name,
            explainer_version=spec.version,
            seed=req.seed,
            budget=result.budget,
            n_model_evals=sum(e.n_model_evals for e in result.explanations),
            n_instances=len(result.explanations) // k,
            exact=all(e.exact for e in result.explanations),
            additive=result.additive,
            compute_ms=round(elapsed_ms, 3),
            cache=cache,  # type: ignore[arg-type]  # one of hit, miss, bypass: validated
            partial=any(e.partial for e in result.explanations),
            parameters=result.parameters,
            **result.meta,
        )
        data = ExplainData(
            feature_names=list(result.player_names),
            output_names=list(model.output_names),
            explanations=explanations,
        )
        return ExplainResponse(
            model_name=model.name, model_version=model.version, id="", meta=meta, data=data
        )


def non_finite() -> ApiError:
    """An answer that JSON cannot carry."""
    return ApiError(
        "the explanation holds non-finite numbers (NaN or infinity): the model's outputs "
        "overflow or are undefined for these inputs",
        code="non_finite_output",
    )


def limit_text(p: Prepared) -> str:
    """The limit a request ran under, in words for its 504."""
    if p.default_limit:
        return f"the server's default time limit (DEFAULT_TIMEOUT_MS={p.timeout_ms} ms)"
    return f"timeout_ms={p.timeout_ms}"


def n_targets(target: int | tuple[int, ...] | None) -> int:
    """Explanations per instance."""
    return len(target) if isinstance(target, tuple) else 1


def per_target(results: list[ExplainResult]) -> ExplainResult:
    """One run per output, interleaved instance-major: [x0 t0, x0 t1, ..., x1 t0, ...]."""
    first = results[0]
    columns = [r.explanations for r in results]
    return replace(
        first,
        explanations=tuple(e for row in zip(*columns, strict=True) for e in row),
        additive=all(r.additive for r in results),
        meta={**first.meta, "targets": {"budget": "per target"}},
    )
