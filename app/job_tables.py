"""An audit's stored results as one table (CSV or Parquet): a row per instance (and output,
when the audit explains several).

Columns: index, output_index, output_name, base_value, output_value, exact, estimator,
warnings (codes joined by ';'), error; then per feature `value.<name>` (the attribution) and
`input.<name>` (the instance's value). Text audits, whose players differ per instance, carry
`players` and `values` as JSON lists instead.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from app.jobs.results import AuditResult, flat

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


def rows(results: list[AuditResult]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one dict per row) from results as GET /v2/jobs/{id}/results gives them."""
    table = flat(results)  # several targets: a row per instance and output
    ok = [r for r in table if r.explanation is not None]
    names = tuple(ok[0].feature_names or ()) if ok else ()
    columns = list(COMMON)
    if names:
        columns += [f"value.{n}" for n in names] + [f"input.{n}" for n in names]
    elif ok:
        columns += ["players", "values"]
    out = []
    for r in table:
        row: dict[str, Any] = dict.fromkeys(columns)
        row["index"] = r.index
        e = r.explanation
        if e is None:
            code = "error" if r.code is None else r.code
            row["error"] = f"{code}: {'' if r.error is None else r.error}"
            out.append(row)
            continue
        row.update(
            output_index=e.output_index,
            output_name=e.output_name,
            base_value=e.base_value,
            output_value=e.instance_output_value,
            exact=e.exact,
            estimator=e.estimator,
            warnings=";".join(e.warnings),
        )
        if names and r.feature_names == names:
            row.update({f"value.{n}": v for n, v in zip(names, e.values, strict=False)})
            data = e.feature_row(names)  # a row or a {feature: value} object
            if data is not None and all(_number(x) for x in data):
                row.update({f"input.{n}": float(x) for n, x in zip(names, data, strict=True)})
        elif not names:
            row["players"] = json.dumps(list(e.players))
            row["values"] = json.dumps(list(e.values))
        out.append(row)
    return columns, out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def to_csv(results: list[AuditResult]) -> bytes:
    columns, table = rows(results)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue().encode()


def to_parquet(results: list[AuditResult]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns, table = rows(results)
    types = {"index": pa.int64(), "output_index": pa.int64(), "exact": pa.bool_()}
    floats = {"base_value", "output_value"} | {c for c in columns if c.startswith("value.")}
    floats |= {c for c in columns if c.startswith("input.")}
    fields = [
        pa.field(c, types.get(c, pa.float64() if c in floats else pa.string())) for c in columns
    ]
    arrays = {c: [row[c] for row in table] for c in columns}
    buf = io.BytesIO()
    pq.write_table(pa.table(arrays, schema=pa.schema(fields)), buf)
    return buf.getvalue()
