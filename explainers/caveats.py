"""Generic reasons to trust an answer less, attached to every explanation of every explainer.

- `noisy_estimate`: a sampled answer whose standard errors are large against its attributions:
  the largest error_std exceeds NOISE_RATIO times the largest |value|, so values of that size
  cannot be told apart (their 2-standard-error bands overlap) and rankings are noise.
- `flat_game`: v(all) and v(none) differ by at most FLAT_RATIO of the output's scale (1 for a
  classifier's probabilities, else the larger of |v(all)|, |v(none)|): the values carry no signal.
- `input_out_of_range`: a tabular feature outside the range of the model's own data (training
  split, else its background): the model extrapolates there.
Explainer-specific caveats (e.g. UNI's `baseline_not_reached`) come with the explanations.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from explainers.explanation import Caveat, ExplainResult, Explanation
from models.base import Model

NOISE_RATIO = 0.2
FLAT_RATIO = 1e-3


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


def flat(e: Explanation, model: Model) -> Caveat | None:
    change = abs(e.instance_output_value - e.base_value)
    scale = max(abs(e.instance_output_value), abs(e.base_value))
    if model.task == "classification" and scale <= 1:
        scale = 1.0  # probabilities: negligible in absolute terms
    if change > FLAT_RATIO * scale:
        return None
    return Caveat(
        "flat_game",
        f"the output moves by {change:.3g} between all players absent and all present: the "
        "values carry no signal for this instance and output",
    )


def training_range(model: Model) -> tuple[np.ndarray, np.ndarray] | None:
    data = model.reference if model.reference is not None else model.background
    if model.modality != "tabular" or data is None or len(data) < 2:
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
