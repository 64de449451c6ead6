"""A strict UBJSON reader and writer for XGBoost's binary model format
(models/adapters/booster_check.py).

Big-endian numbers, strings, objects and arrays, the optimised `$type#count` containers XGBoost
writes for its node arrays (read as numpy arrays). Counts are bounded by the bytes left, nesting
by MAX_DEPTH, duplicate keys and trailing bytes are refused; nothing is allocated beyond what the
file holds.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

MAX_DEPTH = 64
_NUMBERS: dict[bytes, np.dtype[Any]] = {
    b"i": np.dtype(">i1"),
    b"U": np.dtype(">u1"),
    b"I": np.dtype(">i2"),
    b"l": np.dtype(">i4"),
    b"L": np.dtype(">i8"),
    b"d": np.dtype(">f4"),
    b"D": np.dtype(">f8"),
}
_MARKERS = {v.str: k for k, v in _NUMBERS.items()}


class UbjError(ValueError):
    """Not well-formed UBJSON."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise UbjError(f"truncated at byte {self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def marker(self) -> bytes:
        m = self.take(1)
        while m == b"N":  # no-op
            m = self.take(1)
        return m

    def number(self, m: bytes) -> int | float:
        dtype = _NUMBERS.get(m)
        if dtype is None:
            raise UbjError(f"expected a number at byte {self.pos - 1}, found {m!r}")
        value = np.frombuffer(self.take(dtype.itemsize), dtype=dtype)[0]
        return float(value) if dtype.kind == "f" else int(value)

    def count(self) -> int:
        n = self.number(self.marker())
        if not isinstance(n, int) or n < 0 or n > len(self.data) - self.pos:
            raise UbjError(f"a length of {n} at byte {self.pos} is more than the bytes left")
        return n

    def string(self) -> str:
        try:
            return self.take(self.count()).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UbjError(f"a string is not UTF-8: {exc}") from None

    def value(self, m: bytes, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise UbjError(f"nested deeper than {MAX_DEPTH}")
        if m == b"Z":
            return None
        if m in (b"T", b"F"):
            return m == b"T"
        if m in _NUMBERS:
            return self.number(m)
        if m == b"H":  # high-precision number: a decimal string
            text = self.string()
            try:
                return float(text)
            except ValueError:
                raise UbjError(f"high-precision number {text[:40]!r}") from None
        if m == b"C":
            return self.take(1).decode("latin-1")
        if m == b"S":
            return self.string()
        if m == b"[":
            return self.array(depth)
        if m == b"{":
            return self.object(depth)
        raise UbjError(f"unknown marker {m!r} at byte {self.pos - 1}")

    def _header(self) -> tuple[bytes | None, int | None]:
        kind, n = None, None
        if self.data[self.pos : self.pos + 1] == b"$":
            self.pos += 1
            kind = self.take(1)
            if self.take(1) != b"#":
                raise UbjError("a typed container without a count")
            n = self.count()
        elif self.data[self.pos : self.pos + 1] == b"#":
            self.pos += 1
            n = self.count()
        return kind, n

    def array(self, depth: int) -> Any:
        kind, n = self._header()
        if kind is not None and n is not None and kind in _NUMBERS:
            dtype = _NUMBERS[kind]
            raw = self.take(n * dtype.itemsize)
            return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
        out = []
        if n is not None:
            for _ in range(n):
                out.append(self.value(kind or self.marker(), depth + 1))
            return out
        while (m := self.marker()) != b"]":
            out.append(self.value(m, depth + 1))
        return out

    def object(self, depth: int) -> dict[str, Any]:
        kind, n = self._header()
        out: dict[str, Any] = {}

        def put(key: str) -> None:
            if key in out:
                raise UbjError(f"key {key!r} appears twice in one object")
            out[key] = self.value(kind or self.marker(), depth + 1)

        if n is not None:
            for _ in range(n):
                put(self.string())
            return out
        while True:
            if self.data[self.pos : self.pos + 1] == b"}":
                self.pos += 1
                return out
            put(self.string())


def load_ubjson(data: bytes) -> Any:
    """The document of `data` (typed numeric arrays as numpy arrays); UbjError otherwise."""
    reader = _Reader(data)
    value = reader.value(reader.marker(), 0)
    if reader.pos != len(data):
        raise UbjError(f"{len(data) - reader.pos} bytes after the end of the document")
    return value


def _key(out: list[bytes], key: str) -> None:
    raw = key.encode("utf-8")
    out.append(b"L" + struct.pack(">q", len(raw)) + raw)


def _dump(value: Any, out: list[bytes]) -> None:
    if value is None:
        out.append(b"Z")
    elif value is True or value is False:
        out.append(b"T" if value else b"F")
    elif isinstance(value, int):
        out.append(b"L" + struct.pack(">q", value))
    elif isinstance(value, float):
        out.append(b"D" + struct.pack(">d", value))
    elif isinstance(value, str):
        out.append(b"S")
        _key(out, value)
    elif isinstance(value, np.ndarray):
        dtype = value.dtype.newbyteorder(">")
        marker = _MARKERS.get(dtype.str)
        if marker is None:
            raise UbjError(f"cannot write an array of {value.dtype}")
        out.append(b"[$" + marker + b"#L" + struct.pack(">q", value.size))
        out.append(value.astype(dtype).tobytes())
    elif isinstance(value, list):
        out.append(b"[#L" + struct.pack(">q", len(value)))
        for v in value:
            _dump(v, out)
    elif isinstance(value, dict):
        out.append(b"{")
        for k, v in value.items():
            _key(out, k)
            _dump(v, out)
        out.append(b"}")
    else:
        raise UbjError(f"cannot write {type(value).__name__}")


def dump_ubjson(value: Any) -> bytes:
    """UBJSON bytes of a document `load_ubjson` read (numeric arrays typed as they were)."""
    out: list[bytes] = []
    _dump(value, out)
    return b"".join(out)
