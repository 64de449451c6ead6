"""The data plane of the explain routes: cache look-up, preparation and bounded compute.

The routes (app/routes.py, app/ui.py) are thin: they parse the typed body and call `explain`.
Here a request is keyed (a remembered key for a small repeated body, KeyMemo), answered from
the cache when it can be, else prepared by the service (app/service.py) and computed on the
bounded pool (app/pool.py) under its deadline, withdrawn when its client leaves.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

import anyio
from fastapi import Request, Response

from app import batch
from app.cache import CacheUnavailable, hit_answer, scope_tag
from app.errors import ApiError, GatewayTimeout, KeyBusy, Overloaded
from app.fair import identity
from app.logging import current_request_id
from app.pool import ComputePool
from app.schemas import ExplainRequestBase
from app.service import ExplainService, Outcome, Prepared, limit_text, non_finite
from explainers.registry import ExplainerSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


def service(request: Request) -> ExplainService:
    svc: ExplainService = request.app.state.service
    return svc


async def off_loop(request: Request, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking read (model loading and metadata, infer, examples) off the event loop,
    on the read threads (READ_WORKERS): never behind the explanations' compute slots."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=request.app.state.read_limiter)


GRACE_S = 0.25  # past a deadline: let a cooperative explainer return its partial estimate first


async def client_left(request: Request) -> None:
    """Return once the client has closed the connection. The body was read before the
    handler ran, so the ASGI receive channel has nothing else to say but `http.disconnect`;
    the middlewares (app/main.py, app/logging.py, app/auth.py) pass it through."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def admit(request: Request) -> str:
    """Whose heavy work this is (app/fair.py identity), once there is room for it: 503 when
    MAX_PENDING_EXPLAINS are queued or running, else 429 when that key has its share."""
    state = request.app.state
    pool: ComputePool = state.pool
    who = identity(request)
    if pool.full():
        raise Overloaded(
            f"{state.pending_explains} explanations are already queued or running (abandoned "
            "ones still stopping included); retry soon",
            headers={"Retry-After": "1"},
        )
    if pool.full_for(who):
        raise KeyBusy(
            f"this key has {pool.by_key.get(who, 0)} explanations queued or running, its share "
            f"(MAX_PENDING_PER_KEY={pool.share()}); retry soon: other keys are served meanwhile",
            headers={"Retry-After": "1"},
        )
    return who


async def heavy(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a compute slot in its key's turn, admitted as an explanation is (/evaluate:
    it has no deadline of its own)."""
    who = admit(request)
    pool: ComputePool = request.app.state.pool
    return await pool.run(fn, *args, who=who)


async def bounded_compute(
    request: Request,
    svc: ExplainService,
    prepared: Prepared,
    run: Callable[[Prepared], T] | None = None,
) -> T | Outcome | None:
    """Compute on the bounded pool (`run`, default svc.compute); 503 when too much waits, 504
    at the request's deadline, None when the client left first (there is nobody to answer).

    Sampling estimators watch the deadline themselves (and may answer with a partial
    estimate). Whenever the route stops waiting (deadline, client gone, server shutting down)
    it withdraws the work too: the thread stops at its next deadline check, and nothing is
    cached. Until it has stopped it keeps its compute slot and counts against
    MAX_PENDING_EXPLAINS (app/pool.py): abandoned work never runs beside EXPLAIN_WORKERS others.
    """
    pool: ComputePool = request.app.state.pool
    who = admit(request)
    withdrawn = threading.Event()
    prepared.cancel = withdrawn.is_set
    done: list[Any] = []
    compute: Callable[[Prepared], Any] = svc.compute if run is None else run
    failed: list[Exception] = []
    left = False

    async def work(scope: anyio.CancelScope) -> None:
        try:
            done.append(await pool.run(compute, prepared, who=who))
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


async def explain(
    request: Request, spec: ExplainerSpec, model: str, body: ExplainRequestBase
) -> Response:
    """One explain request, from the cache or computed: the key of a small repeated body is
    remembered (KeyMemo), else the request is prepared (validated and keyed) and looked up; a
    miss computes on the bounded pool. Counts the request and its duration per model,
    explainer and status."""
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
            if use_cache and len(prepared.inputs) > 1 and batch.batchable(prepared):
                outcome = await rows_answer(request, svc, prepared)
                status = 200 if outcome is not None else 499
                if outcome is None:  # the client left
                    return Response(status_code=499)
                return Response(
                    outcome.json,
                    media_type="application/json",
                    headers={"X-Cache": outcome.cache.upper()},
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


async def rows_answer(request: Request, svc: ExplainService, p: Prepared) -> Outcome | None:
    """A request of several instances through the batch entry (app/batch.py), as an audit's
    slice: each row looked up under the key a request of it alone has (one round trip), the
    misses computed as one request on the bounded pool and cached a row at a time, the answer
    joined from the rows. None: the client left."""
    io = request.app.state.io_limiter
    hits = await anyio.to_thread.run_sync(batch.cached_rows, svc, p, limiter=io)
    answers = {i: h.response for i, h in hits.items() if h.response is not None}
    misses = [i for i in range(len(p.inputs)) if i not in answers]
    cache = "hit" if p.status == "miss" else p.status  # bypass: the cache did not answer
    if misses:
        sub = batch.subset(p, misses)
        done = await bounded_compute(request, svc, sub, partial(batch.compute_cached, svc))
        if done is None:
            return None
        computed = cast(batch.Computed, done)
        answers.update(zip(misses, computed.answers, strict=True))
        cache = computed.status
    response = batch.joined([answers[i] for i in range(len(p.inputs))], cache, p.request_id)
    try:  # the rows were encoded once already (cached or just computed): no NaN here
        text = response.to_json()
    except ValueError:
        raise non_finite() from None
    return Outcome(response, text.encode())
