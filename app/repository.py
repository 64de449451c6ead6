"""Model repository routes (API.md): register model files (TorchScript, ONNX, XGBoost,
LightGBM), Hugging Face checkpoints or remote OIP models; unregister them. The declaration
of a registration is app/file_registration.py's (app/hf_registration.py's for checkpoints)."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import anyio
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from app.auth import KEY
from app.errors import ERROR_RESPONSES, ApiError, InvalidInput, NotFound, PayloadTooLarge
from app.file_registration import RegistrationForm, declare
from app.oip_schemas import ModelMetadata
from app.routes import metadata
from models.adapters.remote import reveal_remote_detail
from models.adapters.user import Declaration
from models.base import Model, ModelError
from models.sandbox import sandboxed_register as register_model  # worker processes
from models.store import ModelStore

router = APIRouter(tags=["repository"])
log = logging.getLogger(__name__)


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
    shared: bool = Form(
        False,
        description="with API keys: true lets every key explain and infer the model; false "
        "(default): the registering key and admin keys only. Its background rows are shown "
        "to the registering key (and admins) either way",
    ),
) -> JSONResponse:
    """Register (or re-register: a new version) a model; admin scope. The model belongs to the
    registering key: another key cannot replace or delete it (409)."""
    if sum(x is not None for x in (file, remote_url, uri)) != 1:
        raise InvalidInput("send exactly one of file (a model file), remote_url or uri")
    limit = request.app.state.settings.max_model_bytes
    uploads = (("model", file), ("background", background))
    files = {key: await _read(up, limit, key) for key, up in uploads if up is not None}
    form = RegistrationForm(name, modality, input_shape, output_names, feature_names, task,
                            format, remote_url, uri, remote_output, remote_headers, input_range,
                            onnx_output)  # fmt: skip
    decl = await declare(form, files, request.app.state.settings)
    # an admin's request: a remote model's own error messages are shown
    with reveal_remote_detail() if decl.format == "remote" else nullcontext():
        return await _store(request, decl, files, shared)


def _owned_elsewhere(registry: Any, name: str, action: str) -> None:
    """409 when `name` belongs to a key other than the request's."""
    owner, _ = registry.owner(name)
    key = KEY.get()
    if key is not None and owner is not None and owner != key.name:
        raise ApiError(
            f"model {name!r} belongs to another key: it cannot be {action} by this one "
            "(register under another name)",
            code="owned_by_another_key",
        ).with_status(409)


async def _store(
    request: Request, decl: Declaration, files: dict[str, bytes], shared: bool = False
) -> JSONResponse:
    """Build and check the model (its test pass), then store and register it: 201."""
    state = request.app.state
    registry = state.service.registry
    if decl.name in registry.builtin_names():
        raise ApiError(f"{decl.name!r} is a built-in model", code="conflict").with_status(409)
    await anyio.to_thread.run_sync(_owned_elsewhere, registry, decl.name, "replaced")

    def build() -> tuple[Model, dict[str, Any]]:
        try:
            # the test pass: there, under the server's MAX_BATCH_BYTES
            return register_model(decl, files, registry.device, registry.max_batch_bytes)
        except ModelError as exc:
            raise InvalidInput(str(exc), code="invalid_model") from None

    model, meta = await anyio.to_thread.run_sync(build)
    key = KEY.get()
    meta = {**meta, "owner": None if key is None else key.name, "shared": shared}
    replaced = await anyio.to_thread.run_sync(registry.known, decl.name)
    store: ModelStore = state.user_models
    await anyio.to_thread.run_sync(lambda: store.save(meta, files))
    await anyio.to_thread.run_sync(registry.register, model)  # one store query: off the loop
    log.info(
        "model %s %s by key %s (version %s, %s)",
        decl.name,
        "replaced" if replaced else "registered",
        meta["owner"] or "-",
        meta.get("version"),
        "shared" if shared else "private",
    )
    return JSONResponse(metadata(model).model_dump(), status_code=201)


@router.delete("/v2/repository/models/{model}", status_code=204, responses=ERROR_RESPONSES)
async def unregister(request: Request, model: str) -> Response:
    """Remove a registered model and its stored files; admin scope."""
    state = request.app.state
    registry = state.service.registry
    if model in registry.builtin_names():
        raise ApiError(f"{model!r} is a built-in model", code="conflict").with_status(409)
    if not await anyio.to_thread.run_sync(state.service.may_use, model):
        raise NotFound(f"unknown model {model!r}", code="unknown_model")
    await anyio.to_thread.run_sync(_owned_elsewhere, registry, model, "deleted")
    try:
        await anyio.to_thread.run_sync(registry.unregister, model)
    except KeyError:
        raise NotFound(f"unknown model {model!r}", code="unknown_model") from None
    await anyio.to_thread.run_sync(state.user_models.remove, model)
    key = KEY.get()
    log.info("model %s deleted by key %s", model, "-" if key is None else key.name)
    return Response(status_code=204)
