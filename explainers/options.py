"""The base of every explainer's options: one strictness and one echo rule (DESIGN.md 4.4).

Strict: unknown keys fail (`extra="forbid"`) and values are not coerced: `"3"` for a number,
`1` for a bool or `"true"` for a bool is a 422, for every explainer alike. Ints are accepted
where a float is asked for (pydantic's strict mode allows that one widening).

Echo: a response echoes every option after defaults, JSON-ready, less the options that do not
apply to the request at hand (an image-only option on a tabular model, say); `echo` is the one
place that makes that dictionary. An echo is lean: an array of more than MAX_ECHO_NUMBERS
numbers (a baseline image, say) is echoed as its digest and shape (`compact`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

MAX_ECHO_NUMBERS = 64  # meta.parameters never echoes a longer array of numbers


def digest(values: Any) -> str:
    """16 hex characters of the SHA-256 of the numbers as little-endian float64, row-major: the
    same for the same numbers, whatever nesting or dtype they came in."""
    data = np.ascontiguousarray(np.asarray(values, dtype="<f8")).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def array_echo(values: Any) -> Any:
    """A number array as JSON: its values up to MAX_ECHO_NUMBERS numbers, else
    {"digest": digest(values), "shape": [...]}."""
    a = np.asarray(values, dtype=np.float64)
    if a.size <= MAX_ECHO_NUMBERS:
        return a.tolist()
    return {"digest": digest(a), "shape": list(a.shape)}


def _numbers(value: list[Any]) -> np.ndarray | None:
    """The list as a regular array of numbers (no bools), else None."""
    try:
        a = np.asarray(value)
    except ValueError:  # ragged
        return None
    return a if a.dtype.kind in "iuf" and a.size > 0 else None


def compact(value: Any) -> Any:
    """The JSON-ready `value` with every list of more than MAX_ECHO_NUMBERS numbers (at any
    depth, nested lists included) replaced by its digest and shape (`array_echo`)."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        numbers = _numbers(list(value)) if len(value) else None
        if numbers is not None and numbers.size > MAX_ECHO_NUMBERS:
            return array_echo(numbers)
        return [compact(v) for v in value]
    return value


class ExplainerOptions(BaseModel):
    """Options of one explainer: strict pydantic fields with their defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def echo(self, drop: Iterable[str] = ()) -> dict[str, Any]:
        """The options as applied (defaults filled in), without those named in `drop`; arrays
        of more than MAX_ECHO_NUMBERS numbers as their digest and shape."""
        dumped: dict[str, Any] = compact(self.model_dump(mode="json", exclude=set(drop)))
        return dumped
