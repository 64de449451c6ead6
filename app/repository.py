"""Model repository routes (API.md): register model files (TorchScript, ONNX, XGBoost,
LightGBM), Hugging Face checkpoints or remote OIP models; unregister them. The declaration
of a registration is app/file_registration.py's (app/hf_registration.py's for checkpoints)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from app.errors import ERROR_RESPONSES, ApiError, InvalidInput, NotFound, PayloadTooLarge
from app.file_registration import NAME, declaration, sniff_format
from app.hf_registration import hf_declaration
from app.oip_schemas import ModelMetadata
from app.remote_registration import prepare_remote
from app.routes import metadata
from models.adapters.facts import Facts
from models.adapters.remote import reveal_remote_detail
from models.adapters.user import Declaration
from models.base import Model, ModelError
from models.modality import Modality
from models.sandbox import sandboxed_facts as file_facts  # booster files: read in workers
from models.sandbox import sandboxed_register as register_model  # worker processes
from models.store import ModelStore

router = APIRouter(tags=["repository"])


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
    modality: str | None = Form(
        None, description="tabular or image; default: what the file states"
    ),
    input_shape: str | None = Form(
        None, description="JSON list, without the batch dimension; default: the file's"
    ),
    output_names: str | None = Form(
        None, description="JSON list; default: the file's outputs (class labels where stored)"
    ),
    feature_names: str | None = Form(
        None, description="JSON list; default: the names the file stores, else x0, x1, ..."
    ),
    task: str | None = Form(
        None,
        description="classification or regression; default: the file's (objective, "
        "classifier node), else classification when there are several outputs",
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
    uri: str | None = Form(
        None,
        description="huggingface: a checkpoint folder under the server's MODEL_REPOSITORY "
        "(instead of file, for models beyond the upload size)",
    ),
    remote_output: str | None = Form(
        None, description="remote models: the output to request by name (default: the first)"
    ),
    remote_headers: str | None = Form(
        None,
        description='remote models: a JSON object of headers to send, e.g. {"Authorization": '
        '"Bearer ..."} (credentials in remote_url\'s userinfo become a Basic one); stored '
        "apart from the URL, never shown",
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
    limit = state.settings.max_model_bytes
    if sum(x is not None for x in (file, remote_url, uri)) != 1:
        raise InvalidInput("send exactly one of file (a model file), remote_url or uri")
    files: dict[str, bytes] = {}
    if file is not None:
        files["model"] = await _read(file, limit, "model")
    if background is not None:
        files["background"] = await _read(background, limit, "background")
    if remote_headers is not None and remote_url is None:
        raise InvalidInput("remote_headers applies to remote models only")
    remote_auth = None
    if remote_url is not None:  # no credentials in the URL; its host allowed
        remote_url, remote_auth = await anyio.to_thread.run_sync(
            prepare_remote, remote_url, remote_headers, state.settings
        )
    fmt = "remote" if remote_url is not None else "huggingface" if uri is not None else (
        format or sniff_format(files["model"])
    )
    if fmt == "huggingface" or uri is not None:  # a checkpoint folder: models/adapters/hf.py
        if not NAME.match(name):
            raise InvalidInput("name: 1-64 characters of a-z, 0-9, '.', '_' or '-'")
        if format not in (None, "huggingface") or background is not None:
            raise InvalidInput("uri and Hugging Face checkpoints take no background or other "
                               "format: send format huggingface (or none)")  # fmt: skip
        decl = await anyio.to_thread.run_sync(
            lambda: hf_declaration(
                name,
                files.get("model"),
                uri,
                state.settings.model_repository,
                modality=modality,
                task=task,
                output_names=output_names,
                input_shape=input_shape,
                feature_names=feature_names,
            )
        )
        return await _store(request, decl, files)
    if fmt == "remote" and modality == Modality.TEXT and background is not None:
        raise InvalidInput("a remote text model takes no background rows (absent words are "
                           "deleted or masked)")  # fmt: skip
    facts = Facts()
    if "model" in files:
        try:
            facts = await anyio.to_thread.run_sync(file_facts, fmt, files["model"])
        except ModelError as exc:
            raise InvalidInput(str(exc), code="invalid_model") from None
    decl = declaration(
        name,
        fmt,
        facts,
        modality=modality,
        input_shape=input_shape,
        output_names=output_names,
        feature_names=feature_names,
        task=task,
        input_range=input_range,
        onnx_output=onnx_output,
        remote_url=remote_url,
        remote_output=remote_output,
        remote_auth=remote_auth,
    )
    if fmt == "remote":  # an admin's request: the remote's own error messages are shown
        with reveal_remote_detail():
            return await _store(request, decl, files)
    return await _store(request, decl, files)


async def _store(request: Request, decl: Declaration, files: dict[str, bytes]) -> JSONResponse:
    """Build and check the model (its test pass), then store and register it: 201."""
    state = request.app.state
    registry = state.service.registry
    if decl.name in registry.builtin_names():
        raise ApiError(f"{decl.name!r} is a built-in model", code="conflict").with_status(409)

    def build() -> tuple[Model, dict[str, Any]]:
        try:
            # the test pass: there, under the server's MAX_BATCH_BYTES
            return register_model(decl, files, registry.device, registry.max_batch_bytes)
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
