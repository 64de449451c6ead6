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
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.errors import ERROR_RESPONSES, ApiError, InvalidInput, NotFound, NotReady, from_library
from app.inputs import to_array
from app.logging import current_request_id
from app.routes import metadata, off_loop, service
from app.schemas import InferRequest, InferResponse, ModelMetadata
from app.service import ExplainService
from explainers.rankshap import MAX_DOCUMENTS
from models.base import Model, ModelError, RankerModel, TextModel

router = APIRouter(tags=["models"])

HEADER_LENGTH = "Inference-Header-Content-Length"
OUTPUT = "output"  # every model has one output tensor
NUMERIC: dict[str, np.dtype[Any]] = {  # OIP datatype -> little-endian numpy dtype
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: ERROR_RESPONSES[404],
    503: ERROR_RESPONSES[503],
}


class ModelReady(BaseModel):
    name: str
    ready: bool


@dataclass(frozen=True)
class Tensor:
    """A decoded input tensor: flat values, numbers as an array or BYTES as strings."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray | list[Any]
    where: str  # for error messages: "inputs[0]"


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


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary tail) by the Inference-Header-Content-Length header."""
    if header_length is None:
        return body, b""
    if not header_length.strip().isdigit():
        raise InvalidInput(f"{HEADER_LENGTH} must be a byte count", code="invalid_body")
    n = int(header_length)
    if n > len(body):
        raise InvalidInput(
            f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes", code="invalid_body"
        )
    return body[:n], body[n:]


def _parse(header: bytes, binary_hint: bool) -> InferRequest:
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = "" if binary_hint else f"; binary tensor data needs the {HEADER_LENGTH} header"
        raise InvalidInput(
            f"the JSON request is not UTF-8 (invalid byte at offset {exc.start}){hint}",
            code="invalid_body",
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"the request is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None
    return InferRequest.model_validate(obj)  # pydantic's ValidationError renders as a 422


def _count(shape: tuple[int, ...], where: str) -> int:
    if any(d < 0 for d in shape):
        raise InvalidInput(f"{where}.shape must not be negative, got {list(shape)}")
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _from_bytes(chunk: bytes, datatype: str, shape: tuple[int, ...], where: str) -> Any:
    """Binary tensor data -> flat values (little-endian; BYTES: length-prefixed UTF-8)."""
    count = _count(shape, where)
    if datatype == "BYTES":
        items: list[str] = []
        pos = 0
        while pos < len(chunk):
            if pos + 4 > len(chunk):
                raise InvalidInput(f"{where}: truncated BYTES length prefix at byte {pos}")
            size = int.from_bytes(chunk[pos : pos + 4], "little")
            pos += 4
            if pos + size > len(chunk):
                raise InvalidInput(f"{where}: a BYTES element of {size} bytes overruns the data")
            try:
                items.append(chunk[pos : pos + size].decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidInput(f"{where}: element {len(items)} is not UTF-8 text") from None
            pos += size
        if len(items) != count:
            raise InvalidInput(f"{where}: {len(items)} BYTES elements; shape {list(shape)}")
        return items
    dtype = NUMERIC.get(datatype)
    if dtype is None:
        raise InvalidInput(f"{where}: unsupported datatype {datatype!r}")
    if len(chunk) != count * dtype.itemsize:
        raise InvalidInput(
            f"{where}: {len(chunk)} bytes of binary data; shape {list(shape)} of {datatype} "
            f"needs {count * dtype.itemsize}"
        )
    return np.frombuffer(chunk, dtype=dtype)


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major flat list of nested JSON data (the protocol allows either)."""
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def decode(body: bytes, header_length: str | None) -> tuple[InferRequest, list[Tensor]]:
    """The raw request body -> the request and its input tensors, or a 4xx."""
    header, binary = _split(body, header_length)
    req = _parse(header, header_length is not None)
    tensors: list[Tensor] = []
    offset = 0
    for i, tensor in enumerate(req.inputs):
        where = f"inputs[{i}]"
        datatype = tensor.datatype.upper()
        shape = tuple(tensor.shape)
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is None:
            if tensor.data is None:
                raise InvalidInput(f"{where}: send data, or parameters.binary_data_size")
            values: Any = _flatten(tensor.data)
            if len(values) != _count(shape, where):
                raise InvalidInput(
                    f"{where}.data has {len(values)} values; shape {list(shape)} needs "
                    f"{_count(shape, where)}"
                )
        else:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidInput(f"{where}.parameters.binary_data_size must be a byte count")
            if tensor.data is not None:
                raise InvalidInput(f"{where}: send data or binary_data_size, not both")
            if header_length is None:
                raise InvalidInput(f"{where}: binary_data_size needs the {HEADER_LENGTH} header")
            if offset + size > len(binary):
                raise InvalidInput(
                    f"{where}: binary_data_size is {size} but {len(binary) - offset} bytes of "
                    "binary data follow the JSON header",
                    code="invalid_body",
                )
            values = _from_bytes(binary[offset : offset + size], datatype, shape, where)
            offset += size
        tensors.append(Tensor(tensor.name, datatype, shape, values, where))
    if offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset} bytes after the JSON header belong to no input "
            "(binary_data_size too small, or missing)",
            code="invalid_body",
        )
    return req, tensors


# --- inference --------------------------------------------------------------------------------


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
    return to_array(model, rows, f"{tensor.where}.data")


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
    if len(shape) < 1 or (
        shape[1:] != list(model.input_shape) and _count(tensor.shape[1:], "") != model.n_features
    ):
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
    if isinstance(model, RankerModel):
        out = _rank(model, tensor, req.parameters or {})
    elif isinstance(model, TextModel):
        out = model.predict(_texts(model, tensor, max_rows))
    else:
        out = model.predict(_numbers(model, tensor, max_rows))
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
