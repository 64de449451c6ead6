"""Instances from an uploaded file, read a batch at a time (never the whole file at once):
JSON lines (an instance per line), CSV with a header of feature names, or Parquet (a column per
feature). The format is read from the first bytes (Parquet's magic) and the file's name; anything
else is a 400 after reading at most SNIFF_BYTES. `form` reads the multipart request itself and
sniffs the file part as its bytes arrive: a 2 GB file in no format read here is refused after
its first SNIFF_BYTES, not after the whole body has been received."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import IO, Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from app.errors import InvalidInput, Unprocessable

SNIFF_BYTES = 4096
PARQUET_MAGIC = b"PAR1"
FORMATS = ("jsonl", "csv", "parquet")


def sniff(file: IO[bytes], filename: str) -> str:
    """The upload's format: parquet by its magic bytes, csv or jsonl by name or first bytes."""
    head = file.read(SNIFF_BYTES)
    file.seek(0)
    name = filename.lower()
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if b"\x00" in head:
        raise InvalidInput(
            f"{filename or 'the file'} is neither CSV, JSON lines nor Parquet (binary data)",
            code="unsupported_upload",
        )
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".ndjson", ".json")) or head.lstrip()[:1] in (b"{", b"[", b'"'):
        return "jsonl"
    if name.endswith(".parquet"):
        raise InvalidInput(f"{filename} is not a Parquet file", code="unsupported_upload")
    raise InvalidInput(
        f"{filename or 'the file'}: instances come as .csv (a header of feature names), .jsonl "
        "(an instance per line) or .parquet",
        code="unsupported_upload",
    )


def batches(file: IO[bytes], filename: str, size: int) -> Iterator[list[Any]]:
    """Instances of the upload in lists of `size` (the last shorter)."""
    form = sniff(file, filename)
    rows = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}[form](file, size)
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _text(file: IO[bytes]) -> io.TextIOWrapper:
    return io.TextIOWrapper(file, encoding="utf-8-sig", newline="")


def _jsonl(file: IO[bytes], size: int) -> Iterator[Any]:
    for n, line in enumerate(_text(file), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"line {n} is not JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"line {n} is not UTF-8: {exc.reason}") from None


def _csv(file: IO[bytes], size: int) -> Iterator[dict[str, float]]:
    try:
        reader = csv.reader(_text(file))
        header = next(reader, None)
        if not header:
            raise InvalidInput("the CSV file needs a header row and at least one data row")
        seen = 0
        for n, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                yield dict(zip(header, map(float, row), strict=True))
            except ValueError as exc:
                raise InvalidInput(
                    f"CSV line {n}: values must be numbers with one per column: {exc}"
                ) from None
            seen += 1
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"the CSV file cannot be read: {exc}") from None
    if not seen:
        raise InvalidInput("the CSV file needs a header row and at least one data row")


def _parquet(file: IO[bytes], size: int) -> Iterator[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
        for batch in parquet.iter_batches(batch_size=size):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"the Parquet file cannot be read: {exc}") from None


FORM_FIELD_BYTES = 1024 * 1024  # the job field (xai's FORM_FIELD_LIMIT)


class _Sniffing(MultiPartParser):
    """Starlette's multipart parser, with the file part's first SNIFF_BYTES sniffed as soon as
    they have arrived (its per-part callbacks, extended): `sniff`'s 400 is raised from inside
    the parse, and the rest of the body is never read."""

    def __init__(self, request: Request) -> None:
        super().__init__(
            request.headers, request.stream(), max_files=1, max_fields=8,
            max_part_size=FORM_FIELD_BYTES,
        )  # fmt: skip
        self._head = bytearray()
        self._sniffed = False

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current_part.file is not None and not self._sniffed:
            self._head += data[start:end]
            if len(self._head) >= SNIFF_BYTES:
                self._sniff()
        super().on_part_data(data, start, end)

    def on_part_end(self) -> None:
        if self._current_part.file is not None and not self._sniffed:
            self._sniff()  # a file shorter than SNIFF_BYTES
        super().on_part_end()

    def _sniff(self) -> None:
        self._sniffed = True
        name = self._current_part.file.filename if self._current_part.file else ""
        sniff(io.BytesIO(bytes(self._head[:SNIFF_BYTES])), name or "")


async def form(request: Request) -> tuple[str, UploadFile]:
    """The upload's `job` field and `file` part (spooled to disk past 1 MiB), read from the
    request's stream; 400 for a body that is not multipart form data or a file in no format
    read here (as soon as its first bytes say so), 422 for a missing part."""
    kind = request.headers.get("content-type", "")
    if not kind.lower().startswith("multipart/form-data"):
        raise InvalidInput(
            "an upload is multipart/form-data: a `job` field (JSON) and a `file` part",
            code="unsupported_upload",
        )
    try:
        parsed = await _Sniffing(request).parse()
    except MultiPartException as exc:
        raise InvalidInput(f"the multipart body cannot be read: {exc.message}") from None
    job, file = parsed.get("job"), parsed.get("file")
    if not isinstance(job, str):
        raise Unprocessable("the form needs a `job` field: the job as JSON, without inputs")
    if not isinstance(file, UploadFile):
        raise Unprocessable("the form needs a `file` part: the instances (.jsonl, .csv, .parquet)")
    return job, file


# The request body of POST /v2/jobs/upload, for the OpenAPI document (the route reads it itself)
FORM_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["job", "file"],
                    "properties": {
                        "job": {"type": "string", "description": "the job as JSON, without inputs"},
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "instances: .jsonl (an instance per line), .csv (a "
                            "header of feature names) or .parquet (a column per feature); read "
                            "a chunk at a time, up to MAX_UPLOAD_BYTES; a file in none of these "
                            f"is refused after its first {SNIFF_BYTES} bytes",
                        },
                    },
                }
            }
        },
    }
}


__all__ = ["FORMATS", "FORM_SCHEMA", "batches", "form", "sniff"]
