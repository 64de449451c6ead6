"""Messages between the server and a model worker: a JSON header, then raw numpy buffers.

Only `send_bytes`/`recv_bytes` of a `multiprocessing.connection.Connection` are used: nothing a
worker sends is ever unpickled (a pickle from an untrusted worker would run code in the server).
A message is one frame holding the JSON header, whose "arrays" list gives each buffer's dtype
and shape, followed by one frame per buffer. Every frame is read with a length bound: the
header's (`MAX_HEADER_BYTES`) and each buffer's from its declared shape, which the reader first
checks against its own limit (and, where it knows it, the shape it expects).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

MAX_HEADER_BYTES = 4 << 20  # a spec, facts (feature names), an error
DTYPES = frozenset({"float32", "float64", "int64", "int32", "uint8", "bool"})


class ProtocolError(Exception):
    """A message that breaks the framing or its bounds (the sender is not to be trusted)."""


def send(conn: Connection, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
    """Send a header and its buffers (C-contiguous copies only where needed)."""
    parts = [np.ascontiguousarray(a) for a in arrays]
    specs = [{"dtype": str(a.dtype), "shape": list(a.shape)} for a in parts]
    conn.send_bytes(json.dumps({**header, "arrays": specs}).encode())
    for part in parts:
        if part.nbytes:
            conn.send_bytes(part.reshape(-1).view(np.uint8).data)


def _shape(spec: Any) -> tuple[str, tuple[int, ...]]:
    if not isinstance(spec, dict):
        raise ProtocolError("array spec is not an object")
    dtype, shape = spec.get("dtype"), spec.get("shape")
    if dtype not in DTYPES:
        raise ProtocolError(f"array dtype {str(dtype)[:40]!r} is not allowed")
    if not isinstance(shape, list) or len(shape) > 8:
        raise ProtocolError("array shape must list at most 8 non-negative integers")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError("array shape must list at most 8 non-negative integers")
    return str(dtype), tuple(shape)


def recv(
    conn: Connection,
    max_array_bytes: int,
    expected: Sequence[tuple[int, ...] | None] | None = None,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """(header, arrays) of the next message. Each array may take at most `max_array_bytes`;
    `expected[i]` (where given and not None) is the shape array i must have. ProtocolError for a
    header over `max_header_bytes`, malformed JSON, a disallowed dtype or a buffer whose length
    differs from its declared shape; EOFError when the other end closed."""
    try:
        raw = conn.recv_bytes(max_header_bytes)
    except OSError as exc:  # multiprocessing: "bad message length" over the bound
        raise ProtocolError(f"header frame refused: {exc}") from None
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("header is not JSON") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not an object")
    specs = header.pop("arrays", [])
    if not isinstance(specs, list) or len(specs) > 4096:
        raise ProtocolError("header arrays must be a list of at most 4096 specs")
    if expected is not None and len(specs) != len(expected):
        raise ProtocolError(f"{len(specs)} arrays where {len(expected)} were expected")
    arrays = []
    for i, spec in enumerate(specs):
        dtype, shape = _shape(spec)
        want = None if expected is None else expected[i]
        if want is not None and shape != tuple(want):
            raise ProtocolError(f"array {i} has shape {list(shape)}; expected {list(want)}")
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if nbytes > max_array_bytes:
            raise ProtocolError(f"array {i} of {nbytes} bytes exceeds {max_array_bytes}")
        if nbytes == 0:
            arrays.append(np.zeros(shape, dtype=dtype))
            continue
        try:
            data = conn.recv_bytes(nbytes)
        except OSError as exc:
            raise ProtocolError(f"array {i} frame refused: {exc}") from None
        if len(data) != nbytes:
            raise ProtocolError(f"array {i} has {len(data)} bytes; its shape needs {nbytes}")
        arrays.append(np.frombuffer(data, dtype=dtype).reshape(shape))
    return header, arrays
