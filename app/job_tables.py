"""An audit's stored results as one table (CSV or Parquet): a row per instance (and output,
when the audit explains several), streamed a page of stored results at a time.

Columns: index, output_index, output_name, base_value, output_value, exact, estimator,
warnings (codes joined by ';'), error; then per feature `value.<name>` (the attribution) and
`input.<name>` (the instance's value). Text audits, whose players differ per instance, carry
`players` and `values` as JSON lists instead. The columns follow the first row with values
(a first pass reads up to it; a job whose rows all failed has the common columns only).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from app.jobs.results import AuditResult, AuditRow, flat

COMMON = [
    "index",
    "output_index",
    "output_name",
    "base_value",
    "output_value",
    "exact",
    "estimator",
    "warnings",
    "error",
]

Pages = Callable[[], Iterable[list[str]]]  # opens a pass over the stored results' pages


def _parsed(page: list[str]) -> list[AuditRow]:
    return flat([AuditResult.parse(json.loads(line)) for line in page])


def _columns_of(ok: AuditRow | None) -> tuple[tuple[str, ...], list[str]]:
    """(feature names, columns) of a table whose first row with values is `ok`."""
    if ok is None:
        return (), list(COMMON)
    names = tuple(ok.feature_names or ())
    if names:
        return names, [*COMMON, *(f"value.{n}" for n in names), *(f"input.{n}" for n in names)]
    return (), [*COMMON, "players", "values"]


def columns(pages: Pages) -> tuple[tuple[str, ...], list[str]]:
    """(feature names, columns), from the first row with values (a pass up to it)."""
    for page in pages():
        ok = next((r for r in _parsed(page) if r.explanation is not None), None)
        if ok is not None:
            return _columns_of(ok)
    return _columns_of(None)


def rows(results: list[AuditResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one dict per row) of results held in memory (the streams read pages)."""
    table = flat(results)
    names, cols = _columns_of(next((r for r in table if r.explanation is not None), None))
    return cols, [row(r, names, cols) for r in table]


def row(r: AuditRow, names: tuple[str, ...], cols: list[str]) -> dict[str, Any]:
    """One table row of a result (None where a column does not apply)."""
    out: dict[str, Any] = dict.fromkeys(cols)
    out["index"] = r.index
    e = r.explanation
    if e is None:
        code = "error" if r.code is None else r.code
        out["error"] = f"{code}: {'' if r.error is None else r.error}"
        return out
    out.update(
        output_index=e.output_index,
        output_name=e.output_name,
        base_value=e.base_value,
        output_value=e.instance_output_value,
        exact=e.exact,
        estimator=e.estimator,
        warnings=";".join(e.warnings),
    )
    if names and r.feature_names == names:
        out.update({f"value.{n}": v for n, v in zip(names, e.values, strict=False)})
        data = e.feature_row(names)  # a row or a {feature: value} object
        if data is not None and all(_number(x) for x in data):
            out.update({f"input.{n}": float(x) for n, x in zip(names, data, strict=True)})
    elif not names and "players" in cols:
        out["players"] = json.dumps(list(e.players))
        out["values"] = json.dumps(list(e.values))
    return out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _tables(pages: Pages) -> Iterator[tuple[list[str], list[dict[str, Any]]]]:
    names, cols = columns(pages)
    for page in pages():
        yield cols, [row(r, names, cols) for r in _parsed(page)]


def csv_stream(pages: Pages) -> Iterator[bytes]:
    """The table as CSV, a page at a time (the header first)."""
    header = True
    for cols, table in _tables(pages):
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        if header:
            writer.writeheader()
            header = False
        writer.writerows(table)
        yield buf.getvalue().encode()
    if header:  # no page at all: the header alone
        yield (",".join(columns(pages)[1]) + "\n").encode()


class _Drain(io.RawIOBase):
    """A write-only sink whose bytes are taken as they come; tell() counts every byte written
    (the Parquet writer places its footer's offsets by it)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.parts.append(data)
        self.written += len(data)
        return len(data)

    def tell(self) -> int:
        return self.written

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def parquet_stream(pages: Pages) -> Iterator[bytes]:
    """The table as Parquet, a row group per page, its bytes yielded as they are written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names, cols = columns(pages)
    types = {"index": pa.int64(), "output_index": pa.int64(), "exact": pa.bool_()}
    floats = {"base_value", "output_value"} | {c for c in cols if c[:6] in ("value.", "input.")}
    schema = pa.schema(
        [pa.field(c, types.get(c, pa.float64() if c in floats else pa.string())) for c in cols]
    )
    sink = _Drain()
    with pq.ParquetWriter(sink, schema) as writer:
        for page in pages():
            table = [row(r, names, cols) for r in _parsed(page)]
            writer.write_table(pa.Table.from_pylist(table, schema=schema))
            yield sink.take()
    yield sink.take()
