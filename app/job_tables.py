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

from xai.results import feature_row, flat_results

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


def rows(results: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one dict per instance) from results as GET /v2/jobs/{id}/results gives them."""
    results = flat_results(results)  # several targets: a row per instance and output
    ok = [r for r in results if "explanation" in r]
    names = list(ok[0].get("feature_names") or []) if ok else []
    columns = list(COMMON)
    if names:
        columns += [f"value.{n}" for n in names] + [f"input.{n}" for n in names]
    elif ok:
        columns += ["players", "values"]
    out = []
    for r in results:
        row: dict[str, Any] = dict.fromkeys(columns)
        row["index"] = r.get("index")
        if "explanation" not in r:
            row["error"] = f"{r.get('code', 'error')}: {r.get('error', '')}"
            out.append(row)
            continue
        e = r["explanation"]
        row.update(
            output_index=e.get("output_index"),
            output_name=e.get("output_name"),
            base_value=e.get("base_value"),
            output_value=e.get("instance_output_value"),
            exact=e.get("exact"),
            estimator=e.get("estimator"),
            warnings=";".join(w["code"] for w in e.get("warnings") or []),
        )
        if names and r.get("feature_names") == names:
            row.update({f"value.{n}": v for n, v in zip(names, e["values"], strict=False)})
            data = feature_row(e.get("data"), names)  # a row or a {feature: value} object
            if data is not None and all(_number(x) for x in data):
                row.update({f"input.{n}": float(x) for n, x in zip(names, data, strict=True)})
        elif not names:
            row["players"] = json.dumps([p["text"] for p in e.get("players") or []])
            row["values"] = json.dumps(e["values"])
        out.append(row)
    return columns, out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def to_csv(results: list[dict[str, Any]]) -> bytes:
    columns, table = rows(results)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue().encode()


def to_parquet(results: list[dict[str, Any]]) -> bytes:
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
