"""Instances from an uploaded file, read a batch at a time (never the whole file at once):
JSON lines (an instance per line), CSV with a header of feature names, or Parquet (a column per
feature). The format is read from the first bytes (Parquet's magic) and the file's name; anything
else is a 400 after reading at most SNIFF_BYTES."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import IO, Any

from app.errors import InvalidInput

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


__all__ = ["FORMATS", "batches", "sniff"]
