"""Instances for a request from what users hold: lists, numpy arrays (rows [m, n], images
[m, h, w] or [m, c, h, w], texts) and pandas DataFrames (columns are feature names, checked
against the model's and put in its order); and the request's JSON, made here so that numpy
scalars are numbers and anything JSON cannot hold is an XaiError, not a TypeError."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from xai.errors import XaiError


def needs_model(value: Any) -> bool:
    """Whether converting `value` needs the model's metadata (feature names, input shape)."""
    return _is_frame(value) or isinstance(value, np.ndarray)


def _is_frame(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("pandas") and type(value).__name__ in ("DataFrame", "Series")


def instances(value: Any, model: dict[str, Any] | None, field: str = "inputs") -> list[Any]:
    """`value` as a JSON list of instances for `model` (GET /v2/models/{m}; needed for arrays
    and DataFrames)."""
    if _is_frame(value):
        if model is None:
            raise XaiError(f"{field}: a DataFrame needs the model's feature names")
        return _frame_rows(value, model, field)
    if isinstance(value, np.ndarray):
        if model is None:
            raise XaiError(f"{field}: an array needs the model's input shape")
        return _array_rows(value, model, field)
    if isinstance(value, list | tuple):
        return list(value)
    raise XaiError(
        f"{field}: expected a list of instances, a numpy array or a pandas DataFrame, got "
        f"{type(value).__name__}"
    )


def _frame_rows(frame: Any, model: dict[str, Any], field: str) -> list[Any]:
    if type(frame).__name__ == "Series":  # one row, its index the feature names
        frame = frame.to_frame().T
    names = list(model.get("feature_names") or [])
    if not names or model.get("modality") not in (None, "tabular"):
        raise XaiError(f"{field}: a DataFrame is for tabular models; {model.get('name')} is not")
    columns = [str(c) for c in frame.columns]
    missing = [n for n in names if n not in columns]
    unknown = [c for c in columns if c not in names]
    if missing or unknown:
        raise XaiError(
            f"{field}: the DataFrame's columns must be {model.get('name')}'s features; "
            f"missing {missing[:10]}, unknown {unknown[:10]}"
        )
    if len(set(columns)) < len(columns):
        raise XaiError(f"{field}: the DataFrame repeats a column name")
    ordered = frame.set_axis(columns, axis=1)[names]
    try:
        rows = ordered.to_numpy(dtype=np.float64)
    except (TypeError, ValueError):
        bad = [n for n in names if ordered[n].dtype.kind not in "biuf"]
        raise XaiError(
            f"{field}: columns {bad[:10]} are not numbers (send categorical features as "
            "their category codes)"
        ) from None
    return _finite(rows, field).tolist()


def _array_rows(arr: np.ndarray, model: dict[str, Any], field: str) -> list[Any]:
    if arr.dtype.kind in "UO" and arr.ndim == 1:  # texts (or rows as objects)
        return arr.tolist()
    if arr.dtype.kind not in "biuf":
        raise XaiError(f"{field}: expected an array of numbers, got dtype {arr.dtype}")
    shape = _input_shape(model)
    if shape is not None and list(arr.shape[1:]) != shape:
        raise XaiError(
            f"{field}: an array of shape {list(arr.shape)}; {model.get('name')} takes "
            f"[m, {', '.join(map(str, shape))}] (one instance: x[None])"
        )
    return _finite(arr.astype(np.float64), field).tolist()


def _input_shape(model: dict[str, Any]) -> list[int] | None:
    """The instance shape from the metadata's first input ([-1, *shape]); None for texts."""
    inputs = model.get("inputs") or []
    if not inputs or inputs[0].get("datatype") == "BYTES":
        return None
    return [int(d) for d in inputs[0]["shape"][1:]]


def _finite(arr: np.ndarray, field: str) -> np.ndarray:
    if not np.all(np.isfinite(arr)):
        raise XaiError(f"{field}: values must be finite (NaN or infinity at {_first_bad(arr)})")
    return arr


def _first_bad(arr: np.ndarray) -> list[int]:
    return [int(i) for i in np.argwhere(~np.isfinite(arr))[0]]


def target(value: Any) -> Any:
    """An output index or name, a list or tuple of them, "all", or None; numpy ints as ints."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise XaiError("target: an output index or name, a list of them, or 'all'; not a bool")
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, Sequence | np.ndarray):
        return [target(v) for v in value]
    raise XaiError(
        f"target: an output index or name, a list of them, or 'all'; got {type(value).__name__}"
    )


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if _is_frame(value):
        raise TypeError("a DataFrame here: pass it as inputs, background or audit rows")
    raise TypeError(f"{type(value).__name__} is not JSON")


def encode(body: Any) -> bytes:
    """The request body as JSON bytes; an XaiError for what JSON cannot hold."""
    try:
        return json.dumps(body, default=_default, allow_nan=False).encode()
    except ValueError as exc:  # NaN or infinity
        where = _non_finite(body)
        raise XaiError(f"the request holds NaN or infinity{where}: JSON has neither") from exc
    except (TypeError, RecursionError) as exc:
        raise XaiError(f"the request cannot be sent as JSON: {exc}") from None


def _non_finite(body: Any, path: str = "") -> str:
    """' at <path>' of the first non-finite number, or ''."""
    if isinstance(body, float | np.floating) and not math.isfinite(float(body)):
        return f" at {path or 'the top'}"
    items: Any = ()
    if isinstance(body, dict):
        items = body.items()
    elif isinstance(body, list | tuple):
        items = enumerate(body)
    for key, value in items:
        found = _non_finite(value, f"{path}[{key!r}]" if path else str(key))
        if found:
            return found
    return ""
