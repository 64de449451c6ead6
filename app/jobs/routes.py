"""Job routes (API.md): submit, status, results as JSON lines, cancel, list.

A job belongs to the key that submitted it: a `jobs` key lists, reads and cancels only its own
(another's is 404, as if unknown), an admin key every job; with no keys configured all are
open. Idempotency keys are per key.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app import job_plot_images, job_plot_vega, job_plots, job_tables
from app.auth import ApiKey, is_admin
from app.errors import (
    ERROR_RESPONSES,
    ApiError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unprocessable,
)
from app.inputs import to_array
from app.jobs import uploads
from app.jobs.kinds import NAMES, kind
from app.jobs.queue import Queue
from app.jobs.results import read_results
from app.jobs.store import FINISHED, RECEIVING, Job, JobStore
from app.service import ExplainService

router = APIRouter(tags=["jobs"])


if TYPE_CHECKING:
    KindName = str
else:
    KindName = Literal[NAMES]  # the JSON schema's enum: app/jobs/kinds.py's table


class JobRequest(BaseModel):
    """A batch audit (one explain request's fields over many instances) or a training job.

    An explainer's own top-level request fields (COCOA's `corpus`, ...) are accepted as extra
    keys and checked against that explainer's request schema. For explainers whose fields carry
    the instance (RankSHAP's `query`/`documents`), each of `inputs` is a dict of those fields.
    """

    model_config = ConfigDict(extra="allow")
    kind: KindName = "audit"
    model: str
    explainer: str = "shapley"
    inputs: list[Any] | None = Field(
        None,
        min_length=1,
        description="audit: the instances; learn-baseline: explicands; train-salvage: training "
        "images (default: the model's reference data); train-autognothi: training sentences "
        "(default: generated from the VADER lexicon)",
    )
    target: int | str | list[int | str] | None = Field(
        None,
        description='audit: an output (index or name), a list of outputs or "all" for '
        "every row (each row's result then holds `explanations`, one per output in that "
        "order); default: each row's predicted class (classifiers) or the single output",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1)
    budget: int | None = Field(None, ge=1)
    background: list[Any] | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    chunk_size: int | None = Field(None, ge=1, le=10_000, description="instances per task")


class Progress(BaseModel):
    done: int
    total: int
    rate: float | None = Field(None, description="instances per second since the start")
    eta_s: float | None = None


class JobStatus(BaseModel):
    id: str
    kind: str
    model: str
    status: Literal[
        "receiving",
        "queued",
        "running",
        "succeeded",
        "succeeded_with_errors",
        "failed",
        "cancelled",
    ] = Field(
        ...,
        description="receiving: an upload's instances are still being read; "
        "succeeded_with_errors: finished, some rows failed (`error` and the "
        "summary's `errors` and `first_errors` say which); failed: every row failed, or the job "
        "as a whole",
    )
    progress: Progress
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: str | None
    summary: dict[str, Any] | None
    owner: str | None = Field(
        None, description="the name of the API key that submitted it (none: an open service)"
    )


def status_of(job: Job) -> JobStatus:
    rate = eta = None
    if job.started_at is not None and job.done:
        elapsed = (job.finished_at or time.time()) - job.started_at
        rate = job.done / max(elapsed, 1e-9)
        eta = (job.total - job.done) / rate if job.status == "running" else 0.0
    return JobStatus(
        id=job.id,
        kind=job.kind,
        model=job.model,
        status=job.status,
        progress=Progress(done=job.done, total=job.total, rate=rate, eta_s=eta),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=job.error,
        summary=job.summary,
        owner=job.owner,
    )


def _parts(request: Request) -> tuple[ExplainService, JobStore, Queue]:
    state = request.app.state
    return state.service, state.jobs, state.queue


def _key(request: Request) -> ApiKey | None:
    """The request's API key (app/auth.py); None when the service is open."""
    return getattr(request.state, "api_key", None)


def owner_filter(request: Request) -> str | None:
    """Whose jobs this request sees: its key's name, or None (all) for admin keys and an
    open service."""
    key = _key(request)
    return None if key is None or is_admin(key) else key.name


@router.post("/v2/jobs", status_code=202, responses=ERROR_RESPONSES)
async def submit(
    request: Request,
    body: JobRequest,
    idempotency_key: str | None = Header(None, max_length=200),
) -> JSONResponse:
    """Submit a job; 202 with its id and a Location header. Same Idempotency-Key, same job."""
    return await _submit(request, body, idempotency_key)


UPLOAD_CHUNK = 1000  # instances per task of an uploaded audit without chunk_size


@router.post(
    "/v2/jobs/upload",
    status_code=202,
    responses=ERROR_RESPONSES,
    openapi_extra=uploads.FORM_SCHEMA,
)
async def submit_upload(
    request: Request,
    idempotency_key: str | None = Header(None, max_length=200),
) -> JSONResponse:
    """Submit an audit whose instances come from an uploaded file (a `job` field, the job as
    JSON without inputs, and a `file` part), read and stored a chunk at a time (a million rows
    are never held at once). A file in no format read here is refused from its first bytes,
    before the rest is received. The first chunk is validated as an inline job would be (and
    its first instance run up to its first model call); every chunk's instances are checked
    before the job is queued: a bad row is a 400 naming its line, and nothing is kept."""
    job, file = await uploads.form(request)
    try:
        fields = json.loads(job)
    except json.JSONDecodeError as exc:
        raise Unprocessable(f"job is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise Unprocessable("job must be a JSON object")
    if "inputs" in fields:
        raise Unprocessable("job: the instances come in the file, not in inputs")
    size = fields.get("chunk_size") or UPLOAD_CHUNK
    if not isinstance(size, int) or not 1 <= size <= 10_000:
        raise Unprocessable("chunk_size must be an integer from 1 to 10000")
    rows = uploads.batches(file.file, file.filename or "", size)
    first = await anyio.to_thread.run_sync(next, rows, None)
    if first is None:
        raise InvalidInput("the file holds no instances")
    try:
        body = JobRequest(**{**fields, "inputs": first, "chunk_size": size})
    except ValidationError as exc:
        raise Unprocessable(
            f"invalid job: {exc.errors()[0]['msg']}",
            detail=[{k: v for k, v in e.items() if k != "ctx"} for e in exc.errors()],
        ) from None
    if kind(body.kind).training:
        return await _submit(request, body, idempotency_key)  # its inputs are few: inline
    return await _submit(request, body, idempotency_key, more=rows)


async def _receive(
    request: Request, body: JobRequest, job: Job, first: list[Any], more: Iterator[list[Any]]
) -> Job:
    """Store an uploaded job's instances a chunk at a time, each checked as the first was;
    then queue it. A bad chunk discards the job (400 naming the rows)."""
    svc, store, _ = _parts(request)
    limit = request.app.state.settings.max_job_instances
    model = svc.model(body.model)
    total, chunk = 0, 0
    try:
        batch: list[Any] | None = first
        while batch is not None:
            if total + len(batch) > limit:
                raise PayloadTooLarge(f"at most {limit} instances per job")
            if chunk:  # the first was validated with the job
                try:
                    await anyio.to_thread.run_sync(to_array, model, batch, "inputs")
                except InvalidInput as exc:
                    raise InvalidInput(
                        f"instances {total}-{total + len(batch) - 1}: {exc.message}"
                    ) from None
            await anyio.to_thread.run_sync(store.append_inputs, job.id, chunk, batch)
            total += len(batch)
            chunk += 1
            batch = await anyio.to_thread.run_sync(next, more, None)
    except BaseException:
        await anyio.to_thread.run_sync(store.discard, job.id)
        raise
    return await anyio.to_thread.run_sync(store.received, job.id, total)


async def _submit(
    request: Request,
    body: JobRequest,
    idempotency_key: str | None,
    more: Iterator[list[Any]] | None = None,
) -> JSONResponse:
    """Validate, store and queue a job; `more`: an upload's further chunks of instances (the
    job is stored `receiving` until they are all read)."""
    key = _key(request)
    owner = None if key is None else key.name
    job_kind = kind(body.kind)
    training = job_kind.training
    if training and key is not None and not key.allows("admin"):
        raise ApiError("training jobs need the 'admin' scope", code="forbidden").with_status(403)
    svc, store, queue = _parts(request)
    settings = request.app.state.settings
    stored = await anyio.to_thread.run_sync(
        job_kind.validate, svc, body, settings.max_job_instances
    )
    total = job_kind.total(body)
    chunk = body.chunk_size or settings.job_chunk_size or min(1000, max(50, -(-total // 8)))
    if training:  # one task trains; its results are progress records
        chunk = total
    rows = None if training else stored.pop("inputs", None)  # stored a chunk a row
    status = "queued" if more is None else RECEIVING
    job, created = await anyio.to_thread.run_sync(
        lambda: store.create(
            body.kind,
            body.model,
            stored,
            total,
            chunk,
            idempotency_key,
            owner,
            None if more is not None else rows,
            status,
        )
    )
    if created and more is not None:
        job = await _receive(request, body, job, rows or [], more)
    if created:
        for index in range(job.n_chunks):
            await anyio.to_thread.run_sync(queue.submit, job.id, index)
    headers = {"Location": f"/v2/jobs/{job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse({"id": job.id, "status": job.status}, status_code=202, headers=headers)


def _job(store: JobStore, job_id: str, owner: str | None = None) -> Job:
    """The job, if `owner` may see it (None: anyone); else 404, as for an unknown id."""
    job = store.get(job_id, owner)
    if job is None:
        raise NotFound(f"unknown job {job_id!r}", code="unknown_job")
    return job


@router.get("/v2/jobs", response_model=list[JobStatus])
async def list_jobs(
    request: Request, limit: int = Query(100, ge=1, le=1000), status: str | None = None
) -> list[JobStatus]:
    store, owner = _parts(request)[1], owner_filter(request)
    jobs = await anyio.to_thread.run_sync(lambda: store.recent(limit, status, owner))
    return [status_of(j) for j in jobs]


@router.get("/v2/jobs/{job_id}", response_model=JobStatus, responses={404: ERROR_RESPONSES[404]})
async def job_status(request: Request, job_id: str) -> JobStatus:
    store = _parts(request)[1]
    return status_of(await anyio.to_thread.run_sync(_job, store, job_id, owner_filter(request)))


@router.get(
    "/v2/jobs/{job_id}/results",
    responses={404: ERROR_RESPONSES[404], 200: {"content": {"application/x-ndjson": {}}}},
    response_class=StreamingResponse,
)
async def job_results(
    request: Request,
    job_id: str,
    offset: int = Query(0, ge=0, description="first instance index to return (resume here)"),
    limit: int | None = Query(None, ge=1, le=100_000),
    format: Literal["jsonl", "csv", "parquet"] = Query(
        "jsonl", description="jsonl; or csv/parquet: a row per instance (app/job_tables.py)"
    ),
) -> Response:
    """Stored results in instance order as JSON lines: {"index": i, "explanation": ...}; or as
    a table (CSV, Parquet) with value.<feature> and input.<feature> columns."""
    store = _parts(request)[1]
    job = await anyio.to_thread.run_sync(_job, store, job_id, owner_filter(request))
    if format == "jsonl":
        return StreamingResponse(
            _pages(store.result_pages(job_id, offset, limit)), media_type="application/x-ndjson"
        )
    stream = job_tables.csv_stream if format == "csv" else job_tables.parquet_stream
    media = "text/csv" if format == "csv" else "application/vnd.apache.parquet"
    name = f"{job.model}-{job.id[:12]}.{format}"
    disposition = {"Content-Disposition": f'attachment; filename="{name}"'}
    # a sync iterator: Starlette reads each page of it in a worker thread
    table = stream(lambda: store.result_pages(job_id, offset, limit))
    return StreamingResponse(table, media_type=media, headers=disposition)


async def _pages(pages: Iterator[list[str]]) -> AsyncIterator[str]:
    """A page of results lines at a time, each read off the event loop."""
    done = object()
    while (page := await anyio.to_thread.run_sync(next, pages, done)) is not done:
        yield "".join(cast(list[str], page))


@router.get(
    "/v2/jobs/{job_id}/plot",
    response_class=Response,
    responses={
        **ERROR_RESPONSES,
        200: {"content": {"image/png": {}, "image/svg+xml": {}, "application/json": {}}},
    },
)
async def job_plot(
    request: Request,
    job_id: str,
    kind: job_plots.GlobalKind = Query("summary", description="summary, beeswarm, dependence"),
    feature: str | None = Query(None, description="dependence: the feature (default: the top)"),
    color: str = Query(
        "auto",
        description="dependence colours: auto (the strongest interacting feature), a feature "
        "name, or value (the attribution's sign)",
    ),
    format: Literal["png", "svg", "vega", "vega-lite"] = Query("png"),
    max_features: int = Query(20, ge=1, le=1000, description="rows; the rest are summed in one"),
) -> Response:
    """A global view of a finished audit after shap's plots: mean |value| per feature
    (summary), one dot per instance and feature (beeswarm), value against attribution
    (dependence). 409 while the job runs; 400 for text audits or an unknown feature."""
    store = _parts(request)[1]
    job = await anyio.to_thread.run_sync(_job, store, job_id, owner_filter(request))
    if job.kind != "audit":
        raise InvalidInput(f"plots show audits; job {job_id} is a {job.kind} job")
    if job.status not in FINISHED:
        raise ApiError(
            f"job {job_id} is {job.status}: plots need a finished audit", code="job_not_finished"
        ).with_status(409)
    results = await anyio.to_thread.run_sync(read_results, store, job_id)
    explainer = job.request.get("explainer", "")
    audit = job_plots.audit(results, f"{job.model} · {explainer}")
    if format in ("vega", "vega-lite"):
        spec = job_plot_vega.vega_lite(audit, kind, feature, color, max_features)
        return JSONResponse(spec)
    image = await anyio.to_thread.run_sync(
        job_plot_images.image_bytes, audit, format, kind, feature, color, max_features
    )
    return Response(image, media_type={"png": "image/png", "svg": "image/svg+xml"}[format])


@router.delete("/v2/jobs/{job_id}", response_model=JobStatus, responses={404: ERROR_RESPONSES[404]})
async def cancel(request: Request, job_id: str) -> JobStatus:
    """Cancel a job of this key (an admin key: any job); 404 for another key's."""
    store = _parts(request)[1]
    await anyio.to_thread.run_sync(_job, store, job_id, owner_filter(request))
    await anyio.to_thread.run_sync(lambda: store.finish(job_id, "cancelled"))
    return status_of(await anyio.to_thread.run_sync(_job, store, job_id))
