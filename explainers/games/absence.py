"""What "absent" means for an array model's features: the one place reference rows are built.

Shapley's maskers, the static baselines of integrated gradients, the removal of the evaluation
metrics and COCOA's baselines all call `references`, so one (model, x, absence) gives one set of
rows everywhere. Blur: Sturmfels et al. (2020), "Visualizing the Impact of Feature Attribution
Baselines"; interventional background rows: Janzing et al. (2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from explainers.explanation import OptionError
from models.modality import Modality

if TYPE_CHECKING:
    from models.base import Model

Kind = Literal["background", "zero", "mean", "value", "blur", "learned"]
KINDS: tuple[Kind, ...] = ("background", "zero", "mean", "value", "blur", "learned")


@dataclass(frozen=True)
class Absence:
    """An absent feature takes: background rows (interventional average), zero, the mean of
    the background rows, a value (a number or one per feature), a blur of the input (images),
    or a learned baseline (a value from a learn-baseline job)."""

    kind: Kind
    value: Any = None  # value / learned: a number or one value per input feature (any nesting)
    sigma: float | None = None  # blur: in pixels; default min(H, W) / 4


def is_image(model: Model) -> bool:
    """Inputs with two spatial axes: image models and image encoders."""
    shape = tuple(model.input_shape)
    if model.modality == Modality.ENCODER:
        return len(shape) >= 2
    return model.modality == Modality.IMAGE


def blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of an image [..., H, W] over its last two axes, edges repeated. float64"""
    from scipy.ndimage import gaussian_filter

    sigmas = (0.0,) * (x.ndim - 2) + (sigma, sigma)
    return np.asarray(gaussian_filter(x.astype(np.float64), sigmas, mode="nearest"))


BLUR_SIGMA_224 = 5.0  # Gaussian blur baseline at ImageNet's 224 px (kernel 21, sigma 5)


def scaled_sigma(shape: tuple[int, ...]) -> float:
    """The masker's default blur: sigma 5 px at 224 px (the kernel 21, sigma 5 blur baseline of
    the image attribution evaluations in METHODS.md), scaled with the longer side, at least 1 px:
    1.43 at 64, 11.4 at 512. Where shap's image masker blurs with a box the user sizes
    ("blur(128,128)" in its ImageNet examples), this removes the detail within a default patch
    (a 16th of the side) and keeps the coarse colour, as Sturmfels et al. (2020)'s blur does."""
    return max(1.0, BLUR_SIGMA_224 * max(shape[-2], shape[-1]) / 224)


def background_rows(model: Model, background: np.ndarray | None) -> np.ndarray | None:
    """The request's background rows when sent, else the model's (None: neither)."""
    return background if background is not None else model.background


def value_row(model: Model, value: Any, field: str = "value") -> np.ndarray:
    """A number or one finite value per input feature, as one row [1, *shape]. float64"""
    row = np.asarray(value, dtype=np.float64).reshape(-1)
    if row.size not in (1, model.n_features) or not np.all(np.isfinite(row)):
        raise OptionError(f"{field} needs 1 or {model.n_features} finite numbers, got {row.size}")
    return np.broadcast_to(row, (model.n_features,)).reshape(1, *model.input_shape).copy()


def references(
    model: Model,
    x: np.ndarray,
    absence: Absence,
    background: np.ndarray | None = None,
    field: str = "absence",
) -> np.ndarray:
    """Reference rows [r, *input_shape] (float64) that absent features of input x take.

    `background`: the request's rows (else the model's) for the kinds background and mean.
    `field` names the option in error messages.
    """
    shape = tuple(model.input_shape)
    kind = absence.kind
    if kind == "zero":
        return np.zeros((1, *shape))
    if kind in ("value", "learned"):
        if absence.value is None:
            raise OptionError(f"{field} {kind!r} needs a value")
        return value_row(model, absence.value, f"{field} {kind!r}")
    if kind == "blur":
        if not is_image(model):
            raise OptionError(f"{field} 'blur' applies to image models")
        sigma = absence.sigma or min(shape[-2:]) / 4
        return blur(np.asarray(x).reshape(shape), sigma)[None]
    if kind not in ("background", "mean"):
        raise OptionError(f"unknown {field} {kind!r}; use one of {list(KINDS)}")
    bg = background_rows(model, background)
    if bg is None:
        raise OptionError(f"{field} {kind!r} needs background rows; send a background")
    rows = np.asarray(bg, dtype=np.float64).reshape(-1, *shape)
    return rows.mean(axis=0, keepdims=True) if kind == "mean" else rows


__all__ = [
    "KINDS",
    "Absence",
    "Kind",
    "blur",
    "is_image",
    "references",
    "scaled_sigma",
    "value_row",
]
