"""Routes: thin handlers that validate, call the service off the event loop, and shape."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app.cache import CacheUnavailable, hit_answer, scope_tag
from app.errors import (
    ERROR_RESPONSES,
    ApiError,
    GatewayTimeout,
    NotFound,
    Overloaded,
)
from app.jobs.unavailable import store_health
from app.logging import current_request_id
from app.pool import ComputePool
from app.readiness import (
    mark_ready,
    may_name_models,
    missing_models,
    processes_waiting,
    public_body,
)
from app.schemas import (
    ECHO_LIMIT,
    ExplainerInfo,
    ExplainRequestBase,
    ExplainResponse,
    ModelMetadata,
    ModelSummary,
    TensorMeta,
    request_model,
)
from app.service import ExplainService, Outcome, Prepared, limit_text
from explainers.registry import EXPLAINERS, ExplainerSpec, catalog
from models.base import Model, RankerModel, TextModel

log = logging.getLogger(__name__)
router = APIRouter()


def service(request: Request) -> ExplainService:
    svc: ExplainService = request.app.state.service
    return svc


async def off_loop(request: Request, fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking work (model loading, explaining) in the bounded worker pool."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=request.app.state.limiter)


@router.get("/v2/health/live", tags=["health"])
async def live() -> dict[str, Any]:
    return {"live": True, "status": "live"}  # OIP clients read `live`


@router.get("/v2/health/ready", tags=["health"], responses={503: ERROR_RESPONSES[503]})
async def ready(request: Request) -> JSONResponse:
    svc = service(request)
    models = svc.registry.status()
    cache = await anyio.to_thread.run_sync(svc.cache.health)
    jobs = await anyio.to_thread.run_sync(store_health, request.app.state.jobs)
    svc.metrics.cache_up.set(1 if cache["ok"] else 0)
    # Background models (the LMs) report their state here but do not hold readiness back.
    missing = missing_models(models)
    waiting = None
    if not missing and svc.settings.load_models_on_start:
        mark_ready()  # this process is; the others of the same server may not be yet
        waiting = processes_waiting()
    not_ready = bool(missing) or waiting is not None
    body: dict[str, Any] = {
        "ready": not not_ready,
        "status": "ready" if not not_ready and cache["ok"] and jobs["ok"] else "degraded",
        "models": models,
        "cache": cache,
        "jobs": jobs,  # the job database: {"ok"} or {"ok": false, "error"} (job routes: 503)
    }
    if missing:
        body.update(error=f"models not loaded: {missing}", code="not_ready")
    elif waiting is not None:
        body.update(
            error=f"API processes with their models loaded: {waiting[0]} of {waiting[1]}",
            code="not_ready",
        )
    elif not cache["ok"] or not jobs["ok"]:
        down = [] if cache["ok"] else ["cache unreachable: answering uncached"]
        body["detail"] = "; ".join(down + ([] if jobs["ok"] else [jobs["error"]]))
    if not may_name_models(svc.settings.api_keys, getattr(request.state, "api_key", None)):
        body = public_body(body, missing)  # public route, no key: counts, not names
    return JSONResponse(body, status_code=503 if not_ready else 200)


@router.get("/v2", tags=["health"])
async def server_metadata() -> dict[str, Any]:
    return {
        "name": "attribution-service",
        "version": "0.1.0",
        "extensions": ["explain", "cache", "binary_tensor_data"],
    }


def _summary(svc: ExplainService, name: str, loading: bool) -> ModelSummary:
    """A model's listing entry; never loads it (a listing must stay cheap)."""
    model, modality, error = svc.registry.peek(name)
    if model is not None:
        return ModelSummary(name=name, version=model.version, modality=modality, state="ready")
    if error is not None:
        return ModelSummary(name=name, version=None, modality=modality, state="failed", error=error)
    return ModelSummary(
        name=name, version=None, modality=modality, state="loading" if loading else "unloaded"
    )


@router.get("/v2/models", tags=["models"], response_model=list[ModelSummary])
async def list_models(request: Request) -> list[ModelSummary]:
    svc = service(request)
    loading = svc.settings.load_models_on_start
    return [_summary(svc, name, loading) for name in svc.registry.names()]


def metadata(model: Model) -> ModelMetadata:
    ranker = isinstance(model, RankerModel)  # documents in, one score each; query a parameter
    return ModelMetadata(
        name=model.name,
        versions=[model.version],
        platform=model.platform,
        inputs=[
            TensorMeta(
                name="documents" if ranker else "input",
                datatype="BYTES" if isinstance(model, TextModel) or ranker else "FP32",
                shape=[-1, *model.input_shape],  # text: [-1], one string per row
            )
        ],
        outputs=[TensorMeta(name="output", datatype="FP32", shape=[-1, model.n_outputs])],
        modality=model.modality,
        task=model.task,
        # An image's pixel names (x0, x1, ...) say nothing its input shape does not: past
        # ECHO_LIMIT values they are left out (1.5 MB of names at 3x224x224).
        feature_names=[]
        if model.modality == "image" and model.n_features > ECHO_LIMIT
        else list(model.feature_names),
        output_names=list(model.output_names),
        explainers=catalog(model),
        capabilities={
            "differentiable": model.differentiable,
            "classifier": model.task == "classification",
            "tree": None if model.tree is None else model.tree.library,
            "input_range": None if model.input_range is None else list(model.input_range),
            "device": (getattr(model, "info", {}) or {}).get("device", "cpu"),
        },
        background=model.background_info or None,
        info=getattr(model, "info", {}) or {},
    )


@router.get(
    "/v2/models/{model}",
    tags=["models"],
    response_model=ModelMetadata,
    responses={404: ERROR_RESPONSES[404], 503: ERROR_RESPONSES[503]},
)
async def model_metadata(request: Request, model: str) -> ModelMetadata:
    return metadata(await off_loop(request, service(request).model, model))


@router.get("/v2/explainers", tags=["explainers"], response_model=list[ExplainerInfo])
async def list_explainers() -> list[ExplainerInfo]:
    return [
        ExplainerInfo(
            name=s.name,
            version=s.version,
            modalities=list(s.modalities),
            description=s.description,
            reference=s.reference,
            options_schema=s.options.model_json_schema(),
        )
        for s in EXPLAINERS
    ]


GRACE_S = 0.25  # past a deadline: let a cooperative explainer return its partial estimate first


async def client_left(request: Request) -> None:
    """Return once the client has closed the connection. The body was read before the
    handler ran, so the ASGI receive channel has nothing else to say but `http.disconnect`;
    the middlewares (app/main.py, app/logging.py, app/auth.py) pass it through."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def bounded_compute(
    request: Request, svc: ExplainService, prepared: Prepared
) -> Outcome | None:
    """Compute on the bounded pool; 503 when too much waits, 504 at the request's deadline,
    None when the client left first (there is nobody to answer).

    Sampling estimators watch the deadline themselves (and may answer with a partial
    estimate). Whenever the route stops waiting (deadline, client gone, server shutting down)
    it withdraws the work too: the thread stops at its next deadline check, and nothing is
    cached. Until it has stopped it keeps its compute slot and counts against
    MAX_PENDING_EXPLAINS (app/pool.py): abandoned work never runs beside EXPLAIN_WORKERS others.
    """
    state = request.app.state
    pool: ComputePool = state.pool
    if pool.full():
        raise Overloaded(
            f"{state.pending_explains} explanations are already queued or running (abandoned "
            "ones still stopping included); retry soon",
            headers={"Retry-After": "1"},
        )
    withdrawn = threading.Event()
    prepared.cancel = withdrawn.is_set
    done: list[Outcome] = []
    failed: list[Exception] = []
    left = False

    async def work(scope: anyio.CancelScope) -> None:
        try:
            done.append(await pool.run(svc.compute, prepared))
        except Exception as exc:  # the answer's error, raised below outside the task group
            failed.append(exc)
        scope.cancel()

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal left
        await client_left(request)
        left = True
        scope.cancel()

    reason = "shutdown"  # the task itself was cancelled: uvicorn's graceful shutdown ran out
    try:
        wait = math.inf
        if prepared.deadline is not None:
            wait = max(prepared.deadline - time.monotonic(), 0) + GRACE_S
        with anyio.move_on_after(wait):
            async with anyio.create_task_group() as tg:
                tg.start_soon(work, tg.cancel_scope)
                tg.start_soon(watch, tg.cancel_scope)
        if done:
            return done[0]
        if failed:
            raise failed[0]
        reason = "disconnect" if left else "deadline"
        if left:
            return None
        raise GatewayTimeout(
            f"{limit_text(prepared)} passed before an answer",
        )
    finally:
        if not done and not failed:
            withdrawn.set()
            svc.metrics.cancelled.labels(reason).inc()
            log.info(
                "explanation %s cancelled (%s): %s on %s",
                prepared.request_id,
                reason,
                prepared.spec.name,
                prepared.model.name,
            )


INLINE_BODY_BYTES = 64 * 1024  # bodies up to this size are validated on the event loop
MEMO_BODY_BYTES = 8 * 1024  # bodies up to this size have their cache key remembered
HIT_HEADERS = {"X-Cache": "HIT"}


class KeyMemo:
    """Cache keys of small bodies prepared on the event loop before, so that a repeated request
    (the usual cache hit) skips turning JSON into arrays and hashing them. Keyed by the model's
    version, the explainer, the cache scope's key name (CACHE_SCOPE=key) and the body's exact
    bytes: such a request reads nothing else, so the same bytes always prepare alike. Bounded:
    oldest out first."""

    def __init__(self, entries: int = 1024) -> None:
        self.entries = entries
        self._keys: dict[tuple[str, str, str, str, bytes], str] = {}

    def get(self, memo_key: tuple[str, str, str, str, bytes]) -> str | None:
        return self._keys.get(memo_key)

    def put(self, memo_key: tuple[str, str, str, str, bytes], key: str) -> None:
        if len(self._keys) >= self.entries:
            del self._keys[next(iter(self._keys))]
        self._keys[memo_key] = key


async def cached_answer(
    svc: ExplainService, key: str, request_id: str
) -> tuple[bytes | None, bool]:
    """(the stored answer as bytes with the request's id spliced in, or None; whether the cache
    answered: when Redis is down the request goes on uncached). Counts the look-up."""
    try:
        blob = await svc.cache.aget(key)
    except CacheUnavailable:
        svc.metrics.cache.labels("bypass").inc()
        return None, False
    if blob is None:
        svc.metrics.cache.labels("miss").inc()
        return None, True
    svc.metrics.cache.labels("hit").inc()
    answer = hit_answer(blob, request_id)
    if answer is None:  # not the layout to_json writes: decode and encode once
        answer = svc.cached(blob, request_id).json
    return answer, True


async def prepare_request(
    request: Request,
    svc: ExplainService,
    model: str,
    spec: ExplainerSpec,
    body: ExplainRequestBase,
    use_cache: bool,
    arrived: float,
    inline: bool,
) -> Prepared:
    """Validate and key a request without looking it up: on the event loop when `inline` (a
    small request for a loaded built-in: ~0.1 ms of pure CPU, cheaper than a thread hop),
    else on a wide pool, so that it never waits behind explanations being computed."""
    # Synchronous requests without timeout_ms run under the server's DEFAULT_TIMEOUT_MS.
    default = request.app.state.settings.default_timeout_ms
    run = partial(
        svc.prepare, model, spec.name, body, use_cache, arrived, False, default_timeout_ms=default
    )
    if inline:
        prepared = run()
    else:
        prepared = await anyio.to_thread.run_sync(run, limiter=request.app.state.io_limiter)
    if not isinstance(prepared, Prepared):  # lookup=False never answers from the cache
        raise TypeError(f"prepare answered {type(prepared).__name__}")
    return prepared


def explain_route(spec: ExplainerSpec) -> Callable[..., Awaitable[Response]]:
    """The handler of POST /v2/models/{model}/explain/<spec.name>, typed by its options."""
    body_model = request_model(spec)

    async def handler(request: Request, model: str, body: body_model) -> Response:  # type: ignore[valid-type]
        svc = service(request)
        use_cache = "no-cache" not in request.headers.get("cache-control", "").lower()
        start = time.perf_counter()
        arrived = time.monotonic()
        status = 500
        try:
            prepared: Prepared | None = None
            key = memo_key = None
            length = request.headers.get("content-length", "")
            small = length.isdigit() and int(length) <= INLINE_BODY_BYTES
            inline = svc.inline_model(model, spec, body) if small else None
            if inline is not None and use_cache and int(length) <= MEMO_BODY_BYTES:
                tag = scope_tag(svc.settings.cache_scope)  # the key is in the cache key too
                memo_key = (inline.version, model, spec.name, tag, await request.body())
                key = request.app.state.key_memo.get(memo_key)
            if key is None:
                prepared = await prepare_request(
                    request, svc, model, spec, body, use_cache, arrived, inline is not None
                )
                if prepared.status == "miss":
                    key = prepared.key
                    if memo_key is not None:
                        request.app.state.key_memo.put(memo_key, key)
            available = True
            if key is not None:
                rid = getattr(body, "id", None) or current_request_id() or uuid.uuid4().hex
                rid = prepared.request_id if prepared is not None else rid
                hit, available = await cached_answer(svc, key, rid)
                if hit is not None:
                    status = 200
                    return Response(hit, media_type="application/json", headers=HIT_HEADERS)
            if prepared is None:  # known key, not (or no longer) cached
                prepared = await prepare_request(
                    request, svc, model, spec, body, use_cache, arrived, True
                )
            if not available:
                prepared.status = "bypass"
            outcome = await bounded_compute(request, svc, prepared)
            if outcome is None:  # the client left: nobody reads an answer (nginx's 499)
                status = 499
                return Response(status_code=499)
            status = 200
        except ApiError as exc:
            status = exc.status
            raise
        finally:
            # Only known models become label values: a typo must not start a new series.
            known = status == 200 or svc.registry.known(model)
            label = model if known else "<unknown>"
            svc.metrics.requests.labels(label, spec.name, str(status)).inc()
            svc.metrics.duration.labels(label, spec.name, str(status)).observe(
                time.perf_counter() - start
            )
        return Response(
            outcome.json,
            media_type="application/json",
            headers={"X-Cache": outcome.cache.upper()},
        )

    handler.__annotations__["body"] = body_model  # resolved now, not as a string
    handler.__name__ = f"explain_{spec.name.replace('-', '_')}"
    handler.__doc__ = f"{spec.description}. Reference: {spec.reference}."
    return handler


def add_explain_routes(app: FastAPI) -> None:
    for spec in EXPLAINERS:
        app.add_api_route(
            f"/v2/models/{{model}}/explain/{spec.name}",
            explain_route(spec),
            methods=["POST"],
            tags=["explain"],
            response_model=ExplainResponse,
            responses=ERROR_RESPONSES,
        )

    @app.post(
        "/v2/models/{model}/explain/{explainer}",
        tags=["explain"],
        responses=ERROR_RESPONSES,
        include_in_schema=False,
    )
    async def unknown_explainer(request: Request, model: str, explainer: str) -> None:
        svc = service(request)
        await off_loop(request, svc.model, model)
        raise NotFound(
            f"unknown explainer {explainer!r}; known: {[s.name for s in EXPLAINERS]}",
            code="unknown_explainer",
        )


@router.get("/metrics", tags=["health"], response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(service(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


__all__ = ["ExplainRequestBase", "add_explain_routes", "router"]
