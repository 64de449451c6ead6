"""Shared by the peer client scripts (run by .peers/clients/bin/python): read the cases file."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np


def load() -> tuple[str, dict[str, Any]]:
    """argv: URL CASES_JSON -> (url, spec)."""
    url, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        return url, json.load(f)


def array(case: dict[str, Any]) -> np.ndarray:
    """A case's input tensor: numbers in its datatype, or BYTES as an object array of bytes."""
    if case["datatype"] == "BYTES":
        flat = np.array([s.encode() for s in case["data"]], dtype=np.object_)
        return flat.reshape(case["shape"])
    dtypes = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}
    return np.asarray(case["data"], dtype=dtypes[case["datatype"]]).reshape(case["shape"])


def emit(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
