"""The base of every explainer's options: one strictness and one echo rule (DESIGN.md 4.4).

Strict: unknown keys fail (`extra="forbid"`) and values are not coerced: `"3"` for a number,
`1` for a bool or `"true"` for a bool is a 422, for every explainer alike. Ints are accepted
where a float is asked for (pydantic's strict mode allows that one widening).

Echo: a response echoes every option after defaults, JSON-ready, less the options that do not
apply to the request at hand (an image-only option on a tabular model, say); `echo` is the one
place that makes that dictionary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict


class ExplainerOptions(BaseModel):
    """Options of one explainer: strict pydantic fields with their defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def echo(self, drop: Iterable[str] = ()) -> dict[str, Any]:
        """The options as applied (defaults filled in), without those named in `drop`."""
        return self.model_dump(mode="json", exclude=set(drop))
