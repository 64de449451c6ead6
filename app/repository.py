"""Model repository routes (API.md): register TorchScript uploads or remote OIP models."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from app.errors import ERROR_RESPONSES, ApiError, InvalidInput, NotFound, PayloadTooLarge
from app.routes import metadata
from app.schemas import ModelMetadata
from models.base import ModelError
from models.user import Declaration, UserModelStore, remote_model, torchscript_model

router = APIRouter(tags=["repository"])
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def _json_list(field: str, raw: str | None) -> list[Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidInput(f"{field} must be a JSON list") from None
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{field} must be a non-empty JSON list")
    return value


def declaration(
    name: str,
    modality: str,
    input_shape: str,
    output_names: str,
    feature_names: str | None,
    task: str | None,
) -> Declaration:
    if not NAME.match(name):
        raise InvalidInput("name: 1-64 characters of a-z, 0-9, '.', '_' or '-', starting alnum")
    if modality not in ("tabular", "image"):
        raise InvalidInput("modality must be tabular or image for registered models")
    shape = _json_list("input_shape", input_shape) or []
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 4096 for d in shape):
        raise InvalidInput("input_shape must list positive integers (without the batch axis)")
    size = 1
    for d in shape:
        size *= d
    if size > 100_000:
        raise InvalidInput("input_shape is too large (over 100,000 features)")
    outputs = _json_list("output_names", output_names) or []
    features = _json_list("feature_names", feature_names) or [f"x{i}" for i in range(size)]
    if not all(isinstance(o, str) for o in [*outputs, *features]) or len(features) != size:
        raise InvalidInput(f"feature_names must be {size} strings; output_names strings")
    task = task or ("classification" if len(outputs) > 1 else "regression")
    if task not in ("classification", "regression"):
        raise InvalidInput("task must be classification or regression")
    return Declaration(name, modality, task, tuple(shape), tuple(outputs), tuple(features))


@router.post(
    "/v2/repository/models",
    status_code=201,
    response_model=ModelMetadata,
    responses={**ERROR_RESPONSES, 409: {"description": "name of a built-in model"}},
)
async def register(
    request: Request,
    name: str = Form(...),
    modality: str = Form(...),
    input_shape: str = Form(..., description="JSON list, without the batch dimension"),
    output_names: str = Form(..., description="JSON list"),
    feature_names: str | None = Form(None, description="JSON list"),
    task: str | None = Form(None, description="classification or regression"),
    file: UploadFile | None = File(None, description="TorchScript module (torch.jit.save)"),
    remote_url: str | None = Form(None, description="Open Inference Protocol model URL"),
) -> JSONResponse:
    """Register (or re-register: a new version) a model; admin scope."""
    state = request.app.state
    registry = state.service.registry
    decl = declaration(name, modality, input_shape, output_names, feature_names, task)
    if name in registry.builtin_names():
        raise ApiError(f"{name!r} is a built-in model", code="conflict").with_status(409)
    if (file is None) == (remote_url is None):
        raise InvalidInput("send exactly one of file (TorchScript) or remote_url")
    data = None
    if file is not None:
        data = await file.read(state.settings.max_model_bytes + 1)
        if len(data) > state.settings.max_model_bytes:
            raise PayloadTooLarge(
                f"model files are limited to {state.settings.max_model_bytes} bytes"
            )

    def build() -> Any:
        try:
            if data is not None:
                return torchscript_model(decl, data)
            return remote_model(decl, remote_url or "")
        except ModelError as exc:
            raise InvalidInput(str(exc), code="invalid_model") from None

    model = await anyio.to_thread.run_sync(build)
    store: UserModelStore = state.user_models
    await anyio.to_thread.run_sync(lambda: store.save(model, decl, data, remote_url))
    registry.register(model)
    return JSONResponse(metadata(model).model_dump(), status_code=201)


@router.delete("/v2/repository/models/{model}", status_code=204, responses=ERROR_RESPONSES)
async def unregister(request: Request, model: str) -> Response:
    """Remove a registered model and its stored files; admin scope."""
    state = request.app.state
    registry = state.service.registry
    if model in registry.builtin_names():
        raise ApiError(f"{model!r} is a built-in model", code="conflict").with_status(409)
    try:
        registry.unregister(model)
    except KeyError:
        raise NotFound(f"unknown model {model!r}", code="unknown_model") from None
    await anyio.to_thread.run_sync(state.user_models.remove, model)
    return Response(status_code=204)
