"""The `masker` option of the removal-based explainers (shapley, sufficient-subset): what
"absent" means for a model's features, resolved to reference rows by explainers/games/absence.py
(the one place that builds absence) and described for the answer's echo."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from explainers.explanation import OptionError
from explainers.games.absence import Absence, references
from models.base import Model


class MaskerOptions(BaseModel):
    """What "absent" means: background rows (interventional) or a fixed baseline.

    `interventional` is `background` by its other name (shap's feature_perturbation): tree models
    answer it with interventional TreeSHAP."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["background", "baseline", "interventional"]
    value: float | list[Any] | None = Field(
        None, description="baseline: a number, or one value per input feature (any nesting)"
    )
    ref: str | None = Field(
        None, max_length=64, description="baseline: id of a succeeded learn-baseline job"
    )



def masker_references(
    model: Model, masker: MaskerOptions, background: np.ndarray | None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Reference rows [r, *input_shape] and their description for the echo."""
    if masker.type in ("background", "interventional"):
        source = "request" if background is not None else "model"
        if background is None and model.background is None:
            raise OptionError(f"model {model.name!r} has no default background; send one")
        rows = references(model, np.empty(0), Absence("background"), background, "masker")
        return rows.astype(model.input_dtype), {
            "type": "background",
            "source": source,
            "rows": len(rows),
        }
    if masker.value is not None:
        absence = Absence("learned" if masker.ref is not None else "value", masker.value)
        source = "request"
    elif model.modality == "tabular" and (background is not None or model.background is not None):
        absence = Absence("mean")
        which = "request" if background is not None else "model"
        source = f"feature means of the {which} background"
    else:
        absence, source = Absence("zero"), "zeros"
    value = references(model, np.empty(0), absence, background, "baseline")
    value = value.astype(model.input_dtype)
    return value, {"type": "baseline", "source": source, "value": value.reshape(-1).tolist()}
