"""Generic reasons to trust an answer less, attached to every explanation of every explainer.

- `noisy_estimate`: a sampled answer whose standard errors are large against its attributions:
  the largest error_std exceeds NOISE_RATIO times the largest |value|, so values of that size
  cannot be told apart (their 2-standard-error bands overlap) and rankings are noise.
- `flat_game`: neither v(all) - v(none) nor any value exceeds what is negligible on the
  explainer's own value scale: the values carry no signal. An explainer declares its scale in
  `details["value_scale"]` ({"unit", "negligible"}: an absolute amount in that unit, e.g.
  AttriBoT's log-likelihoods, FLAT_NATS nats; RankSHAP's NDCG, FLAT_RATIO); otherwise FLAT_RATIO
  of the output's scale (1 for a classifier's probabilities, else the larger of |v(all)|,
  |v(none)|). Values count as well as v(all) - v(none): leave-one-out scores (AttriBoT) have
  v(all) = v(none) by construction, and Shapley values may cancel in their sum.
- `baseline_out_of_data`: a gradient path's baseline far outside the model's data (tabular: on
  at least BASELINE_SHARE of the features outside the data's range widened by BASELINE_MARGIN
  of it, and more than BASELINE_Z robust standard deviations from its median; images: outside
  the pixel range of the data): the attributions explain f(x) - f(baseline) against an input
  the model never saw (a zero baseline on raw-unit features).
- `input_out_of_range`: a tabular feature outside the range of the model's own data (training
  split, else its background): the model extrapolates there.
- `uncalibrated_error` (from the estimators, issue 28): error_std is a floor or not calibrated
  at this budget: a fit that reproduces every drawn coalition (kernel's interpolation floor),
  permutation players whose few drawn contributions all agree, gp below 32 and msr below 8
  coalitions per player (held-out coverage under 0.9 there, docs/benchmarks.md).
Explainer-specific caveats (e.g. UNI's `baseline_not_reached`) come with the explanations.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from explainers.explanation import Caveat, ExplainResult, Explanation
from models.base import Model
from models.modality import Modality

NOISE_RATIO = 0.2
FLAT_RATIO = 1e-3
FLAT_NATS = 1e-2  # a log-likelihood change of 0.01 nats: the response's probability x 1.01
BASELINE_SHARE = 0.25
BASELINE_MARGIN = 0.1
BASELINE_Z = 4.0


def noisy(e: Explanation) -> Caveat | None:
    if e.exact or e.error_std is None or e.values.size == 0:
        return None
    largest = float(np.max(np.abs(e.values)))
    worst = float(np.max(e.error_std))
    if worst <= NOISE_RATIO * largest:
        return None
    return Caveat(
        "noisy_estimate",
        f"the largest standard error ({worst:.3g}) exceeds {NOISE_RATIO:g} x the largest "
        f"|value| ({largest:.3g}): differences between values of that size are noise; raise "
        "the budget or use fewer background rows",
    )


def value_scale(unit: str, negligible: float) -> dict[str, Any]:
    """An explainer's declaration of its values' scale, for `details["value_scale"]`."""
    return {"unit": unit, "negligible": float(negligible)}


def negligible(e: Explanation, model: Model) -> tuple[float, str]:
    """The change that carries no signal on this explanation's value scale, and the unit."""
    declared = (e.details or {}).get("value_scale")
    if isinstance(declared, dict) and "negligible" in declared:
        return float(declared["negligible"]), str(declared.get("unit", ""))
    scale = max(abs(e.instance_output_value), abs(e.base_value))
    if model.task == "classification" and scale <= 1:
        scale = 1.0  # probabilities: negligible in absolute terms
    return FLAT_RATIO * scale, ""


def flat(e: Explanation, model: Model) -> Caveat | None:
    change = abs(e.instance_output_value - e.base_value)
    largest = float(np.max(np.abs(e.values))) if e.values.size else 0.0
    threshold, unit = negligible(e, model)
    if max(change, largest) > threshold:
        return None
    units = f" {unit}" if unit else ""
    return Caveat(
        "flat_game",
        f"the output moves by {change:.3g}{units} between all players absent and all present "
        f"and no value exceeds {largest:.3g}{units} (negligible: {threshold:.3g}{units}): the "
        "values carry no signal for this instance and output",
    )


def baseline_out_of_data(
    model: Model,
    baseline: np.ndarray,
    background: np.ndarray | None = None,
    instead: str = 'send "baseline": "mean" (the background rows\' mean) or "expected" '
    "(background rows: expected gradients)",
) -> Caveat | None:
    """`baseline_out_of_data` when a gradient baseline [*shape] is far outside the model's data
    (the request's background, else the model's training split, else its background)."""
    data = background
    if data is None:
        data = model.reference if model.reference is not None else model.background
    if data is None or len(data) < 2 or model.modality not in (Modality.TABULAR, Modality.IMAGE):
        return None
    rows = np.asarray(data, dtype=np.float64).reshape(len(data), -1)
    b = np.asarray(baseline, dtype=np.float64).reshape(-1)
    if b.size != rows.shape[1]:
        return None
    if model.modality == Modality.IMAGE:  # pixels share one scale: the data's pixel range
        low, high = float(rows.min()), float(rows.max())
        margin = BASELINE_MARGIN * max(high - low, 1e-12)
        share = float(((b < low - margin) | (b > high + margin)).mean())
        if share < BASELINE_SHARE:
            return None
        return Caveat(
            "baseline_out_of_data",
            f"the baseline is outside the data's pixel range [{low:g}, {high:g}] on "
            f"{share:.0%} of the pixels: the attributions explain f(x) - f(baseline) "
            f"from an image the model never saw; {instead}",
        )
    low, high = rows.min(axis=0), rows.max(axis=0)
    span = high - low
    median = np.median(rows, axis=0)
    mad = 1.4826 * np.median(np.abs(rows - median), axis=0)
    spread = np.where(mad > 0, mad, rows.std(axis=0))
    z = np.abs(b - median) / np.maximum(spread, 1e-12)
    outside = (b < low - BASELINE_MARGIN * span) | (b > high + BASELINE_MARGIN * span)
    far = np.flatnonzero(outside & (z > BASELINE_Z))
    if far.size < max(1, BASELINE_SHARE * b.size):
        return None
    i = int(far[np.argmax(z[far])])
    names = [model.feature_names[j] for j in far[:5]]
    return Caveat(
        "baseline_out_of_data",
        f"the baseline is far outside the model's data on {far.size} of {b.size} features "
        f"({', '.join(names)}{', ...' if far.size > 5 else ''}; e.g. {model.feature_names[i]} = "
        f"{b[i]:g}, data range [{low[i]:g}, {high[i]:g}], {z[i]:.0f} robust standard "
        "deviations from its median): the attributions explain f(x) - f(baseline) from an "
        f"input the model never saw; {instead}",
    )


def training_range(model: Model) -> tuple[np.ndarray, np.ndarray] | None:
    data = model.reference if model.reference is not None else model.background
    if model.modality != Modality.TABULAR or data is None or len(data) < 2:
        return None
    rows = np.asarray(data, dtype=np.float64).reshape(len(data), -1)
    return rows.min(axis=0), rows.max(axis=0)


def out_of_range(row: np.ndarray, model: Model) -> Caveat | None:
    bounds = training_range(model)
    if bounds is None:
        return None
    low, high = bounds
    x = np.asarray(row, dtype=np.float64).reshape(-1)
    span = np.maximum(high - low, 1e-12)
    outside = np.flatnonzero((x < low - 1e-9 * span) | (x > high + 1e-9 * span))
    if outside.size == 0:
        return None
    names = [model.feature_names[i] for i in outside[:5]]
    i = int(outside[0])
    return Caveat(
        "input_out_of_range",
        f"{outside.size} feature(s) outside the range of the model's data ({', '.join(names)}"
        f"{', ...' if outside.size > 5 else ''}; e.g. {names[0]} = {x[i]:g}, data range "
        f"[{low[i]:g}, {high[i]:g}]): the model extrapolates there",
    )


def with_caveats(
    model: Model,
    inputs: np.ndarray,
    result: ExplainResult,
    outside_declared: dict[int, str] | None = None,
) -> ExplainResult:
    """The result with the generic caveats added to each explanation's own.

    `outside_declared`: instances explained although outside the model's declared input_range
    (parameters.allow_out_of_range), by index, with what is wrong.
    """
    rows = inputs if len(inputs) == len(result.explanations) else None
    explanations = []
    for i, e in enumerate(result.explanations):
        found = [noisy(e), flat(e, model)]
        if outside_declared and i in outside_declared:
            found.append(Caveat("input_out_of_range", outside_declared[i]))
        elif rows is not None and rows.dtype.kind == "f":
            found.append(out_of_range(rows[i], model))
        extra = tuple(c for c in found if c is not None and c not in e.warnings)
        explanations.append(replace(e, warnings=e.warnings + extra) if extra else e)
    return replace(result, explanations=tuple(explanations))
