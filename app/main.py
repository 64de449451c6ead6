"""create_app(settings): the FastAPI application with its cache, registry and workers."""

from __future__ import annotations

import gc
import logging
import os
import signal
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import auth, docs, errors, ratelimit, repository, ui
from app.cache import Cache, MemoryCache, RedisCache
from app.dataplane import KeyMemo
from app.fair import FairSlots
from app.jobs import routes as job_routes
from app.jobs.queue import CeleryQueue, InProcessQueue, Queue
from app.jobs.runner import JobContext
from app.jobs.store import JobStore
from app.logging import RequestContext
from app.metrics import Metrics
from app.oip import router as oip_router
from app.pool import ComputePool
from app.readiness import mark_ready, missing_models
from app.remote_registration import remote_config
from app.routes import add_explain_routes, evaluate_router, router
from app.service import ExplainService
from app.settings import Settings
from models.adapters.remote import configure as configure_remote
from models.registry import ModelRegistry
from models.sandbox import configure_from_settings
from models.store import ModelStore

log = logging.getLogger(__name__)


class BodyLimit:
    """Answer 413 for bodies over `limit` bytes, by header or by counting the stream."""

    def __init__(self, app: ASGIApp, limit: int, upload_limit: int, rows_limit: int) -> None:
        self.app = app
        self.default_limit = limit
        self.upload_limit = upload_limit  # model uploads on /v2/repository/
        self.rows_limit = rows_limit  # an audit's uploaded instances on /v2/jobs/upload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["path"].startswith("/v2/repository/")
        limit = self.upload_limit if upload else self.default_limit
        if scope["path"] == "/v2/jobs/upload":  # spooled to disk, then read a chunk at a time
            limit = self.rows_limit
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._reject(send, limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise errors.PayloadTooLarge(f"request body over {limit} bytes")
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def _reject(send: Send, limit: int) -> None:
        body = b'{"error": "request body over %d bytes", "code": "payload_too_large"}' % limit
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


def make_cache(settings: Settings) -> Cache:
    if settings.redis_url:
        return RedisCache(
            settings.redis_url,
            settings.cache_ttl_s,
            settings.cache_timeout_s,
            settings.cache_local_entries,
            settings.cache_local_ttl_s,
        )
    return MemoryCache(settings.cache_max_entries)


def make_queue(settings: Settings, ctx: JobContext) -> Queue:
    backend = settings.job_queue
    if backend == "auto":
        backend = "celery" if settings.redis_url else "inprocess"
    if backend == "celery":
        if not settings.redis_url:
            raise ValueError("JOB_QUEUE=celery needs REDIS_URL")
        # with ctx, a chunk the broker refused is marked unqueued: the next sweep queues it
        return CeleryQueue(settings.redis_url, settings.job_visibility_timeout_s, ctx)
    return InProcessQueue(ctx, settings.job_workers)


def resume(jobs: JobStore, queue: Queue) -> None:
    """Queue again every chunk of unfinished jobs; chunks skip instances already stored."""
    for job in jobs.unfinished():
        for index in range(job.n_chunks):
            queue.submit(job.id, index)


_RESUME_LOCKS: list[Any] = []  # held for the life of the process


def cancel_after_sigterm(service: ExplainService, grace_s: float) -> None:
    """On SIGTERM give running explanations `grace_s` seconds, then cancel them: each answers
    503 shutting_down at its next model call, so the connections close and the process exits.
    uvicorn's own handler still runs (it stops accepting, waits for running requests, and after
    timeout_graceful_shutdown cancels what is left: app/__main__.py). Only where uvicorn
    handles the signal (the main thread of a server process; not under TestClient)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):  # not served by uvicorn: leave the process's handling alone
        return
    timers: list[threading.Timer] = []

    def on_sigterm(sig: int, frame: Any) -> None:
        if not timers:
            log.info("SIGTERM: running explanations have %.1f s, then are cancelled", grace_s)
            timers.append(threading.Timer(grace_s, service.stopping.set))
            timers[0].daemon = True
            timers[0].start()
        previous(sig, frame)

    signal.signal(signal.SIGTERM, on_sigterm)  # uvicorn restores its predecessor at exit


def resumes_here() -> bool:
    """Whether this process resumes unfinished in-process jobs: of the API processes one
    `python -m app` started (ATTRIBUTION_SUPERVISOR), only the first to lock a file does, so
    that no job runs twice at once."""
    supervisor = os.environ.get("ATTRIBUTION_SUPERVISOR")
    if not supervisor:
        return True
    import fcntl

    lock = Path(tempfile.gettempdir()) / f"attribution-resume-{supervisor}.lock"
    handle = lock.open("a")  # kept open: the lock lasts as long as the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _RESUME_LOCKS.append(handle)
    return True


def create_app(settings: Settings | None = None, registry: ModelRegistry | None = None) -> FastAPI:
    """Build the service; nothing heavy happens until the app starts."""
    settings = settings or Settings()
    configure_from_settings(settings)  # MODEL_SANDBOX, MODEL_WORKER_*: user models' workers
    registry = registry or ModelRegistry(
        settings.model_dir, device=settings.device, max_batch_bytes=settings.max_batch_bytes
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import torch

        torch.set_num_threads(settings.torch_threads)
        if settings.load_models_on_start:

            def load() -> None:
                registry.load_all()
                if not missing_models(registry.status()):
                    mark_ready()  # for the other API processes' readiness (app/readiness.py)
                if settings.load_background_models:
                    registry.load_all(include_background=True)  # the others: loaded already
                gc.freeze()  # the models' objects too (see below)

            # LMs last; readiness does not wait for them
            threading.Thread(target=load, name="load-models", daemon=True).start()
        # Objects made at start (modules, apps, torch) leave the collector's generations: with
        # them a full collection walks ~370k objects (0.1-0.25 s, a p99 spike under load).
        gc.freeze()
        # Nobody else finishes what a restart interrupted; of several API processes one does.
        if queue.backend == "inprocess" and resumes_here():
            threading.Thread(target=resume, args=(jobs, queue), daemon=True).start()
        cancel_after_sigterm(service, settings.shutdown_grace_s)
        yield
        # What still computes (abandoned threads, in-process job chunks) stops at its next
        # model call; unfinished jobs resume at the next start (or on another worker).
        service.stopping.set()
        queue.close()

    app = FastAPI(
        title="Attribution service",
        version="0.1.0",
        description="Attributions for registered models: Shapley values and more, one API.",
        lifespan=lifespan,
        docs_url=None,  # served offline by app/docs.py, with assets from a package
        redoc_url=None,
    )
    metrics = Metrics()
    service = ExplainService(settings, registry, make_cache(settings), metrics)
    jobs = JobStore(settings.database_url)
    service.jobs = jobs
    queue = make_queue(settings, JobContext(service, jobs))
    app.state.settings = settings
    app.state.service = service
    app.state.jobs = jobs
    app.state.queue = queue
    # Registered models live in the database every process shares; the folder caches files.
    app.state.user_models = ModelStore(settings.database_url, settings.user_model_dir)
    for name in app.state.user_models.import_folders(settings.user_model_dir):
        log.info("registered model %s imported from the folder layout", name)
    registry.use_store(app.state.user_models)
    configure_remote(remote_config(settings))  # REMOTE_*: remote models built from now on
    app.state.limiter = FairSlots(settings.explain_workers)  # round robin between keys
    app.state.read_limiter = anyio.CapacityLimiter(settings.read_workers)
    app.state.io_limiter = anyio.CapacityLimiter(settings.io_workers)
    app.state.key_memo = KeyMemo()  # cache keys of repeated small explain bodies
    app.state.pending_explains = 0  # explanations queued or running (bounded: 503 beyond)
    app.state.pool = ComputePool(app.state, metrics.registry)  # slots held until threads stop
    errors.install(app)
    # First: FastAPI matches routes in order, and an included router costs a pass over each of
    # its routes; the explain routes (the hot path) conflict with none of them.
    add_explain_routes(app)
    app.include_router(router)
    app.include_router(oip_router)  # OIP readiness, /versions/{version} forms, infer
    app.include_router(job_routes.router)
    app.include_router(repository.router)
    app.include_router(evaluate_router)  # POST /v2/models/{model}/evaluate
    ui.install(app)  # the web page at /, its static files, plot routes
    docs.install(app)  # /docs and /redoc without a CDN
    metrics.watch_jobs(queue, jobs, settings.redis_url)
    keys = auth.parse_keys(settings.api_keys)
    if not keys:
        log.warning("no API keys configured: every route is open (meant for local use)")
    limits = ratelimit.parse_limits(settings.rate_limit)
    if limits:  # inside the key check, so it counts per key
        app.add_middleware(
            ratelimit.RateLimit, items=limits, storage=ratelimit.make_storage(settings.redis_url)
        )
    app.add_middleware(auth.ApiKeyAuth, keys=keys)
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        upload_limit=settings.max_model_bytes + (1 << 20),
        rows_limit=settings.max_upload_bytes,
    )
    app.add_middleware(RequestContext, metrics=metrics)  # outermost: every answer has an id
    return app


def app_factory() -> Any:
    """For `uvicorn --factory app.main:app_factory`."""
    return create_app()
