"""The Open Inference Protocol's request bodies: JSON, or a JSON header followed by raw tensor
bytes (the binary tensor data extension: `Inference-Header-Content-Length: N` gives the header's
length; numeric tensors are little-endian; BYTES elements carry a 4-byte little-endian length
prefix each). Decoding errors are 400s."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import InvalidInput
from app.oip_schemas import InferRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
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


@dataclass(frozen=True)
class Tensor:
    """A decoded input tensor: flat values, numbers as an array or BYTES as strings."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray | list[Any]
    where: str  # for error messages: "inputs[0]"


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


MAX_INT_DIGITS = 309  # past float64's range (1.8e308): no tensor datatype holds such a number


def _json_int(digits: str) -> int:
    """A JSON integer; one of more than MAX_INT_DIGITS digits is a 400 (Python refuses to
    read 4,300 and more, and floats overflow long before)."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidInput(
            f"a JSON integer of {len(digits.lstrip('-'))} digits: beyond every tensor datatype",
            code="invalid_json",
        )
    return int(digits)


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
        obj = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"the request is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise InvalidInput("the request's JSON is nested too deeply", code="invalid_json") from None
    return InferRequest.model_validate(obj)  # pydantic's ValidationError renders as a 422


def element_count(shape: tuple[int, ...], where: str) -> int:
    if any(d < 0 for d in shape):
        raise InvalidInput(f"{where}.shape must not be negative, got {list(shape)}")
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _from_bytes(chunk: bytes, datatype: str, shape: tuple[int, ...], where: str) -> Any:
    """Binary tensor data -> flat values (little-endian; BYTES: length-prefixed UTF-8)."""
    count = element_count(shape, where)
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
            if len(values) != element_count(shape, where):
                raise InvalidInput(
                    f"{where}.data has {len(values)} values; shape {list(shape)} needs "
                    f"{element_count(shape, where)}"
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
