"""The `masker` option of the removal-based explainers (shapley, sufficient-subset): what
"absent" means for a model's features, resolved to reference rows by explainers/games/absence.py
(the one place that builds absence) and described for the answer's echo.

Kinds: background rows (interventional), a fixed baseline (zeros, the tabular feature means, a
sent value or a learned baseline), or blur (a Gaussian blur of each instance: its references
depend on the instance, Sturmfels et al. 2020). The echo is lean: a baseline of more than 64
numbers is echoed as its digest and shape (explainers/options.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from explainers.explanation import OptionError
from explainers.games.absence import Absence, is_image, references, scaled_sigma
from explainers.options import array_echo
from models.base import Model
from models.modality import Modality

BLUR_ABOVE = 32  # images with a side longer than this default to the blur masker


class MaskerOptions(BaseModel):
    """What "absent" means: background rows (interventional), a fixed baseline or a blur.

    `interventional` is `background` by its other name (shap's feature_perturbation): tree models
    answer it with interventional TreeSHAP."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["background", "baseline", "interventional", "blur"]
    value: float | list[Any] | None = Field(
        None, description="baseline: a number, or one value per input feature (any nesting)"
    )
    ref: str | None = Field(
        None, max_length=64, description="baseline: id of a succeeded learn-baseline job"
    )
    sigma: float | None = Field(
        None,
        gt=0,
        le=256,
        allow_inf_nan=False,
        description="blur: Gaussian sigma in pixels; default 5 px at 224 px scaled with the "
        "longer side (1.43 at 64 px), at least 1",
    )

    @model_validator(mode="after")
    def _fits_type(self) -> MaskerOptions:
        if self.sigma is not None and self.type != "blur":
            raise ValueError("sigma applies to the blur masker only")
        if self.type == "blur" and (self.value is not None or self.ref is not None):
            raise ValueError("the blur masker takes sigma, not value or ref")
        return self


def default_masker(model: Model, background: np.ndarray | None) -> MaskerOptions:
    """Rows the request sent always win (never a silent baseline beside them); else the model's
    background for tabular models; blur for images with a side over 32 px (shap's image
    maskers blur); a zero baseline for smaller images."""
    image = model.modality == Modality.IMAGE
    if background is not None or (not image and model.background is not None):
        return MaskerOptions(type="background")
    if image and max(model.input_shape[-2:]) > BLUR_ABOVE:
        return MaskerOptions(type="blur")
    return MaskerOptions(type="baseline")


@dataclass(frozen=True)
class Masking:
    """A resolved masker: fixed reference rows [r, *input_shape] (background, baseline), or a
    blur whose one row depends on the instance; `echo` describes it for meta.parameters."""

    kind: str  # background | baseline | blur
    echo: dict[str, Any]
    rows: np.ndarray | None = None  # fixed rows, in the model's input dtype
    sigma: float | None = None  # blur

    @property
    def cost(self) -> int:
        """Model rows per coalition."""
        return 1 if self.rows is None else int(self.rows.shape[0])

    def references(self, model: Model, x: np.ndarray) -> np.ndarray:
        """The reference rows for instance x. [r, *input_shape]"""
        if self.rows is not None:
            return self.rows
        rows = references(model, x, Absence("blur", sigma=self.sigma), field="masker")
        return rows.astype(model.input_dtype)


def resolve(model: Model, masker: MaskerOptions, background: np.ndarray | None) -> Masking:
    """The masker's reference rows (or blur) and its lean description for the echo."""
    if masker.type in ("background", "interventional"):
        source = "request" if background is not None else "model"
        if background is None and model.background is None:
            raise OptionError(f"model {model.name!r} has no default background; send one")
        rows = references(model, np.empty(0), Absence("background"), background, "masker")
        echo = {"type": "background", "source": source, "rows": len(rows)}
        return Masking("background", echo, rows.astype(model.input_dtype))
    if masker.type == "blur":
        if not is_image(model):
            raise OptionError("masker 'blur' applies to image models")
        sigma = masker.sigma or scaled_sigma(tuple(model.input_shape))
        echo = {"type": "blur", "sigma": round(sigma, 6), "source": "Gaussian blur of the instance"}
        return Masking("blur", echo, sigma=sigma)
    if masker.value is not None:
        absence = Absence("learned" if masker.ref is not None else "value", masker.value)
        source = "request"
    elif model.modality == Modality.TABULAR and (
        background is not None or model.background is not None
    ):
        absence = Absence("mean")
        which = "request" if background is not None else "model"
        source = f"feature means of the {which} background"
    else:
        absence, source = Absence("zero"), "zeros"
    value = references(model, np.empty(0), absence, background, "baseline")
    value = value.astype(model.input_dtype)
    echo = {"type": "baseline", "source": source, "value": array_echo(value.reshape(-1))}
    return Masking("baseline", echo, value)


def masker_references(
    model: Model, masker: MaskerOptions, background: np.ndarray | None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Fixed reference rows [r, *input_shape] and their description for the echo (a blur,
    whose references differ per instance, needs `resolve`)."""
    masking = resolve(model, masker, background)
    if masking.rows is None:
        raise OptionError(
            "masker 'blur' differs per instance and this explainer takes fixed reference rows: "
            "use a baseline or background masker"
        )
    return masking.rows, masking.echo
