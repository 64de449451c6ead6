"""Open Inference Protocol (v2) model routes: per-model readiness, the `/versions/{version}`
forms, and infer with JSON or binary tensor data (the binary tensor data extension).

Infer routes read the raw body themselves: clients send JSON without a Content-Type header,
or as application/octet-stream with `Inference-Header-Content-Length: N` (the first N bytes are
the JSON header, the rest raw little-endian tensor bytes; BYTES elements carry a 4-byte
little-endian length prefix each).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.dataplane import off_loop, service
from app.errors import ERROR_RESPONSES, ApiError, InvalidInput, NotFound, NotReady, from_library
from app.inputs import to_array
from app.logging import current_request_id
from app.oip_codec import HEADER_LENGTH, NUMERIC, Tensor, decode, element_count
from app.oip_schemas import InferRequest, InferResponse, ModelMetadata
from app.routes import metadata
from app.service import ExplainService
from explainers.rankshap import MAX_DOCUMENTS
from models.base import Model, ModelError, RankerModel, TextModel

router = APIRouter(tags=["models"])

OUTPUT = "output"  # every model has one output tensor
MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: ERROR_RESPONSES[404],
    503: ERROR_RESPONSES[503],
}


class ModelReady(BaseModel):
    name: str
    ready: bool


def _check_version(model: Model, version: str | None) -> None:
    if version is not None and version != model.version:
        raise NotFound(
            f"model {model.name!r} serves version {model.version!r}, not {version!r}",
            code="unknown_version",
        )


def _ready(svc: ExplainService, name: str, version: str | None) -> ModelReady:
    """Readiness without loading anything: 200 once loaded, 503 before, 404 when unknown."""
    try:
        model, _, error = svc.registry.peek(name)
    except ModelError as exc:
        raise from_library(exc) from exc
    if model is None:
        loading = svc.settings.load_models_on_start and (
            svc.settings.load_background_models or not svc.registry.is_background(name)
        )
        state = "failed" if error else "loading" if loading else "unloaded"
        raise NotReady(
            f"model {name!r} is not loaded ({state})" + (f": {error}" if error else ""),
            code="model_not_ready",
            detail={"name": name, "ready": False, "state": state},
            headers={"Retry-After": "5"} if state == "loading" else None,
        )
    _check_version(model, version)
    return ModelReady(name=name, ready=True)


@router.get("/v2/models/{model}/ready", response_model=ModelReady, responses=MODEL_ERRORS)
async def model_ready(request: Request, model: str) -> ModelReady:
    """OIP model readiness: 200 when loaded, 503 while loading (or after a failed load)."""
    return _ready(service(request), model, None)


@router.get(
    "/v2/models/{model}/versions/{version}/ready", response_model=ModelReady, responses=MODEL_ERRORS
)
async def model_version_ready(request: Request, model: str, version: str) -> ModelReady:
    return _ready(service(request), model, version)


@router.get(
    "/v2/models/{model}/versions/{version}", response_model=ModelMetadata, responses=MODEL_ERRORS
)
async def model_version_metadata(request: Request, model: str, version: str) -> ModelMetadata:
    """Model metadata, if `version` is the model's current version (404 unknown_version)."""
    loaded: Model = await off_loop(request, service(request).model, model)
    _check_version(loaded, version)
    return metadata(loaded)


# --- request decoding -----------------------------------------------------------------------


def _text_rows(tensor: Tensor) -> list[Any]:
    """A BYTES tensor of shape [m] or [m, 1] -> its m elements."""
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"{tensor.where}: the model reads text: send datatype BYTES")
    if len(tensor.shape) not in (1, 2) or tensor.shape[1:] not in ((), (1,)):
        raise InvalidInput(f"{tensor.where}.shape must be [n] or [n, 1] for n texts")
    return list(tensor.values)


def _texts(model: TextModel, tensor: Tensor, max_rows: int) -> np.ndarray:
    """An OIP BYTES tensor (strings) -> str [m]."""
    rows = _text_rows(tensor)
    if len(rows) > max_rows:
        raise ApiError("too many rows", code="payload_too_large")
    # an empty text is a valid input of infer (a remote text game's empty coalition asks it)
    return to_array(model, rows, f"{tensor.where}.data", empty_texts=True)


def _rank(model: RankerModel, tensor: Tensor, parameters: dict[str, Any]) -> np.ndarray:
    """Rankers: documents as a BYTES tensor [K], the query in parameters.query -> scores [K, 1]."""
    query = parameters.get("query")
    if not isinstance(query, str) or not query.strip() or len(query) > model.max_chars:
        raise InvalidInput(
            f"{model.name} scores documents for a query: send the documents as a BYTES tensor "
            f"and the query (1 to {model.max_chars} characters) as parameters.query"
        )
    docs = _text_rows(tensor)
    if not 1 <= len(docs) <= MAX_DOCUMENTS:
        raise InvalidInput(f"send 1 to {MAX_DOCUMENTS} documents")
    for i, doc in enumerate(docs):
        if not isinstance(doc, str) or len(doc) > model.max_chars or "\x00" in doc:
            raise InvalidInput(
                f"{tensor.where}.data[{i}]: a string of at most {model.max_chars} characters"
            )
    return model.score(query, docs).astype(np.float32).reshape(-1, 1)


def _numbers(model: Model, tensor: Tensor, max_rows: int) -> np.ndarray:
    """A numeric tensor [batch, *input_shape] (or [batch, n_features]) -> rows in the model's
    input dtype (float32, or float64 for models that read it, e.g. LightGBM)."""
    if tensor.datatype not in NUMERIC:
        raise InvalidInput(
            f"{tensor.where}: unsupported datatype {tensor.datatype!r}; send one of "
            f"{sorted(NUMERIC)}"
        )
    values = tensor.values
    if isinstance(values, list):
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise InvalidInput(f"{tensor.where}.data must be numbers")
        values = np.asarray(values, dtype=np.float64)
    shape = list(tensor.shape)
    row_size = element_count(tensor.shape[1:], "")
    if len(shape) < 1 or (shape[1:] != list(model.input_shape) and row_size != model.n_features):
        raise InvalidInput(
            f"{tensor.where}.shape must be [batch, {', '.join(map(str, model.input_shape))}], "
            f"got {shape}"
        )
    if shape[0] > max_rows:
        raise ApiError("too many rows", code="payload_too_large")
    data = values.astype(np.float64)
    if not np.all(np.isfinite(data)):
        raise InvalidInput(f"{tensor.where}: values must be finite (no NaN or infinity)")
    if np.any(np.abs(data) > np.finfo(np.float32).max):
        raise InvalidInput(f"{tensor.where}: values exceed the float32 range")
    return data.astype(model.input_dtype).reshape(shape[0], *model.input_shape)


def _requested(req: InferRequest) -> list[tuple[str, bool]]:
    """(output name, as binary) for each output to return."""
    params = req.parameters or {}
    default = params.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InvalidInput("parameters.binary_data_output must be true or false")
    if not req.outputs:
        return [(OUTPUT, default)]
    wanted: list[tuple[str, bool]] = []
    for i, out in enumerate(req.outputs):
        if out.name != OUTPUT:
            raise InvalidInput(
                f"outputs[{i}]: unknown output {out.name!r}; the model has [{OUTPUT!r}]",
                code="unknown_output",
            )
        out_params = out.parameters or {}
        if "classification" in out_params:
            raise InvalidInput(f"outputs[{i}]: the classification extension is not supported")
        binary = out_params.get("binary_data", default)
        if not isinstance(binary, bool):
            raise InvalidInput(f"outputs[{i}].parameters.binary_data must be true or false")
        if all(name != out.name for name, _ in wanted):
            wanted.append((out.name, binary))
    return wanted


def _respond(model: Model, req: InferRequest, out: np.ndarray) -> Response:
    """The OIP answer: JSON, or a JSON header followed by the binary outputs."""
    out = np.ascontiguousarray(out, dtype="<f4")
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in _requested(req):
        tensor: dict[str, Any] = {"name": name, "shape": list(out.shape), "datatype": "FP32"}
        if binary:
            blobs.append(out.tobytes())
            tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            if not np.all(np.isfinite(out)):
                raise ApiError(
                    "the model's output holds NaN or infinity, which JSON cannot carry; ask for "
                    "binary_data",
                    code="non_finite_output",
                )
            tensor["data"] = out.reshape(-1).tolist()
        outputs.append(tensor)
    content = InferResponse(
        model_name=model.name,
        model_version=model.version,
        id=req.id or current_request_id() or uuid.uuid4().hex,
        outputs=outputs,  # validated into InferOutput
    ).model_dump(exclude_none=True)
    if not blobs:
        return JSONResponse(content)
    header = json.dumps(content, separators=(",", ":")).encode()
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(header))},
    )


def _infer(
    svc: ExplainService, name: str, version: str | None, body: bytes, header_length: str | None
) -> Response:
    model = svc.model(name)
    _check_version(model, version)
    req, tensors = decode(body, header_length)
    tensor = tensors[0]
    max_rows = svc.settings.max_instances * 100
    try:
        if isinstance(model, RankerModel):
            out = _rank(model, tensor, req.parameters or {})
        elif isinstance(model, TextModel):
            out = model.predict(_texts(model, tensor, max_rows))
        else:
            out = model.predict(_numbers(model, tensor, max_rows))
    except ModelError as exc:  # a failing remote: 502 remote_model_error, as explain answers
        raise from_library(exc) from exc
    return _respond(model, req, out)


def _infer_body() -> dict[str, Any]:
    """The request body in the OpenAPI document (the route reads the raw body itself)."""
    schema = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:  # the nested models have no cycles: inline them
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
                return inline(defs[ref.rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    json_schema = inline(schema)
    binary = {
        "type": "string",
        "format": "binary",
        "description": f"the JSON request ({HEADER_LENGTH} bytes) followed by binary tensor data",
    }
    return {
        "requestBody": {
            "required": True,
            "description": "JSON (a missing Content-Type is accepted), or the binary tensor data "
            f"extension with the {HEADER_LENGTH} header",
            "content": {
                "application/json": {"schema": json_schema},
                "application/octet-stream": {"schema": binary},
            },
        }
    }


INFER_BODY = _infer_body()
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "description": f"JSON, or with binary outputs a JSON header ({HEADER_LENGTH} bytes) "
        "followed by the output bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
}


async def _serve(request: Request, model: str, version: str | None) -> Response:
    body = await request.body()
    result: Response = await off_loop(
        request, _infer, service(request), model, version, body, request.headers.get(HEADER_LENGTH)
    )
    return result


@router.post(
    "/v2/models/{model}/infer",
    response_model=InferResponse,
    responses=INFER_RESPONSES,
    openapi_extra=INFER_BODY,
)
async def infer(request: Request, model: str) -> Response:
    """OIP inference; JSON or binary tensor data in, JSON or binary outputs back."""
    return await _serve(request, model, None)


@router.post(
    "/v2/models/{model}/versions/{version}/infer",
    response_model=InferResponse,
    responses=INFER_RESPONSES,
    openapi_extra=INFER_BODY,
)
async def infer_version(request: Request, model: str, version: str) -> Response:
    """OIP inference on the model's current version (404 unknown_version otherwise)."""
    return await _serve(request, model, version)
