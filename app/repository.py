"""Model repository routes (API.md): register model files (TorchScript, ONNX, XGBoost,
LightGBM) or remote OIP models."""

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
from models.base import Model, ModelError
from models.store import ModelStore
from models.user import FORMATS, Declaration
from models.user import register as register_model

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


def _input_range(raw: str | None) -> tuple[float, float] | None:
    values = _json_list("input_range", raw)
    if values is None:
        return None
    ok = len(values) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    )
    if not ok or not values[0] < values[1]:
        raise InvalidInput("input_range must be [low, high] with low < high")
    return float(values[0]), float(values[1])


def sniff_format(data: bytes) -> str:
    """The upload's format from its first bytes (a zip is TorchScript; never a pickle)."""
    head = data[:512].lstrip()
    if data[:2] == b"PK":
        return "torchscript"
    if head.startswith(b"tree\n") or head.startswith(b"tree\r\n"):
        return "lightgbm"
    if head.startswith(b"{") and (b'"learner"' in data[:4096] or b"learner" in data[:64]):
        return "xgboost"  # JSON, or UBJSON whose first key is "learner"
    return "onnx"


def declaration(
    name: str,
    modality: str,
    input_shape: str,
    output_names: str,
    feature_names: str | None,
    task: str | None,
    fmt: str,
    input_range: str | None = None,
    onnx_output: str | None = None,
    remote_url: str | None = None,
    remote_output: str | None = None,
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
    if fmt not in FORMATS:
        raise InvalidInput(f"format must be one of {list(FORMATS)}")
    if remote_output is not None and fmt != "remote":
        raise InvalidInput("remote_output applies to remote models only")
    if onnx_output is not None and fmt != "onnx":
        raise InvalidInput("onnx_output applies to ONNX models only")
    return Declaration(
        name,
        modality,
        task,
        tuple(shape),
        tuple(outputs),
        tuple(features),
        format=fmt,
        input_range=_input_range(input_range),
        onnx_output=onnx_output,
        remote_url=remote_url,
        remote_output=remote_output,
    )


async def _read(upload: UploadFile, limit: int, what: str) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"{what} files are limited to {limit} bytes")
    return data


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
    task: str | None = Form(
        None, description="classification or regression (default: classification when there "
        "are several outputs)"
    ),
    file: UploadFile | None = File(
        None,
        description="the model: TorchScript (torch.jit.save), ONNX, XGBoost JSON/UBJSON or "
        "LightGBM text; never a pickle",
    ),
    format: str | None = Form(
        None, description="torchscript, onnx, xgboost or lightgbm; default: read from the file"
    ),
    remote_url: str | None = Form(None, description="Open Inference Protocol model URL"),
    remote_output: str | None = Form(
        None, description="remote models: the output to request by name (default: the first)"
    ),
    input_range: str | None = Form(
        None, description="JSON [low, high] of valid input values (e.g. [0, 1] for images)"
    ),
    onnx_output: str | None = Form(
        None, description="ONNX: the output to explain; default the first float [N, k] tensor"
    ),
    background: UploadFile | None = File(
        None, description="default background rows: CSV with a header of feature names, or .npy"
    ),
) -> JSONResponse:
    """Register (or re-register: a new version) a model; admin scope."""
    state = request.app.state
    registry = state.service.registry
    limit = state.settings.max_model_bytes
    if (file is None) == (remote_url is None):
        raise InvalidInput("send exactly one of file (a model file) or remote_url")
    files: dict[str, bytes] = {}
    if file is not None:
        files["model"] = await _read(file, limit, "model")
    if background is not None:
        files["background"] = await _read(background, limit, "background")
    fmt = "remote" if remote_url is not None else (format or sniff_format(files["model"]))
    decl = declaration(
        name,
        modality,
        input_shape,
        output_names,
        feature_names,
        task,
        fmt,
        input_range,
        onnx_output,
        remote_url,
        remote_output,
    )
    if name in registry.builtin_names():
        raise ApiError(f"{name!r} is a built-in model", code="conflict").with_status(409)

    def build() -> tuple[Model, dict[str, Any]]:
        try:
            return register_model(decl, files, registry.device)  # the test pass: there
        except ModelError as exc:
            raise InvalidInput(str(exc), code="invalid_model") from None

    model, meta = await anyio.to_thread.run_sync(build)
    store: ModelStore = state.user_models
    await anyio.to_thread.run_sync(lambda: store.save(meta, files))
    await anyio.to_thread.run_sync(registry.register, model)  # one store query: off the loop
    return JSONResponse(metadata(model).model_dump(), status_code=201)


@router.delete("/v2/repository/models/{model}", status_code=204, responses=ERROR_RESPONSES)
async def unregister(request: Request, model: str) -> Response:
    """Remove a registered model and its stored files; admin scope."""
    state = request.app.state
    registry = state.service.registry
    if model in registry.builtin_names():
        raise ApiError(f"{model!r} is a built-in model", code="conflict").with_status(409)
    try:
        await anyio.to_thread.run_sync(registry.unregister, model)
    except KeyError:
        raise NotFound(f"unknown model {model!r}", code="unknown_model") from None
    await anyio.to_thread.run_sync(state.user_models.remove, model)
    return Response(status_code=204)
