"""Routes: thin handlers; the explain routes call the data plane (app/dataplane.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app import dataplane
from app.dataplane import heavy, off_loop, service
from app.errors import (
    ERROR_RESPONSES,
    NotFound,
)
from app.evaluate import EvaluateRequest, EvaluateResponse, run_evaluation
from app.jobs.unavailable import store_health
from app.oip_schemas import ModelMetadata, ModelSummary, TensorMeta
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
    request_model,
)
from app.service import ExplainService
from explainers.registry import EXPLAINERS, ExplainerSpec, catalog
from models.base import Model, RankerModel, TextModel
from models.modality import Modality

log = logging.getLogger(__name__)
router = APIRouter()
evaluate_router = APIRouter()  # included after the repository's routes (app/main.py)


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
    return [_summary(svc, name, loading) for name in svc.registry.names() if svc.may_use(name)]


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
        if model.modality == Modality.IMAGE and model.n_features > ECHO_LIMIT
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


def explain_route(spec: ExplainerSpec) -> Callable[..., Awaitable[Response]]:
    """The handler of POST /v2/models/{model}/explain/<spec.name>, typed by its options."""
    body_model = request_model(spec)

    async def handler(request: Request, model: str, body: body_model) -> Response:  # type: ignore[valid-type]
        return await dataplane.explain(request, spec, model, body)

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


@evaluate_router.post(
    "/v2/models/{model}/evaluate",
    tags=["explain"],
    response_model=EvaluateResponse,
    responses=ERROR_RESPONSES,
)
async def evaluate_attributions(
    request: Request, model: str, body: EvaluateRequest
) -> dict[str, Any]:
    """Deletion and insertion AUC, MuFidelity and max-sensitivity of attributions.

    References: Petsiuk et al. 2018; Bhatt et al. 2020; Yeh et al. 2019.
    """
    svc: ExplainService = request.app.state.service
    result: dict[str, Any] = await heavy(request, run_evaluation, svc, model, body)
    return result
