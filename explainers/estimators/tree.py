"""Exact TreeSHAP: path-dependent by the boosters' own libraries (XGBoost
`pred_contribs`/`pred_interactions`, LightGBM `pred_contrib`) in the trees' raw margin, and
interventional against background rows by shap's TreeExplainer, in the margin.

Lundberg, Erion et al., "From local explanations to global understanding with explainable AI for
trees", Nature Machine Intelligence 2020. Path-dependent TreeSHAP takes "absent" from the trees'
own training cover; interventional TreeSHAP (their Algorithm 3) from each background row, the
game v(S) = mean over background rows b of f(x_S, b_rest), exactly, in O(trees x leaves x rows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from explainers.estimators.base import Estimate
from explainers.explanation import OptionError

# |sum of values + base - output| above this (relative to the output's scale) is not exact:
# XGBoost sums float32 leaves (about 1e-6 here), shap float64 ones.
ADDITIVITY_TOL = 1e-4

if TYPE_CHECKING:
    from models.base import TreeEnsemble


def tree_shapley(tree: TreeEnsemble, inputs: np.ndarray) -> list[Estimate]:
    """Shapley values of each row's margin: one Estimate per row, values [n, k]."""
    contribs = tree.contributions(inputs)  # [m, k, n + 1]
    margins = tree.margin(inputs)  # [m, k]
    return [
        Estimate(
            values=row[:, :-1].T.copy(),
            base_value=row[:, -1].copy(),
            full_value=full,
            exact=True,
            n_evaluations=1,  # one traversal of the trees per row, no coalition is evaluated
            n_coalitions=0,
            estimator="tree",
        )
        for row, full in zip(contribs, margins, strict=True)
    ]


def tree_sii(tree: TreeEnsemble, inputs: np.ndarray, output: int) -> list[Estimate]:
    """SII up to order 2 of one output from the library's SHAP interaction values: one Estimate
    per row, values [n] (the Shapley values), interactions of every player and pair.

    Those split each pair's interaction evenly between [i, j] and [j, i] (Lundberg et al. 2020),
    so SII(i, j) = 2 Phi[i, j]; the row sums of Phi are the Shapley values.
    """
    phi = tree.interactions(inputs)  # [m, k, n + 1, n + 1] or None
    if phi is None:
        raise OptionError(
            f"{tree.library} computes no interaction values; use estimator auto, exact or kernel"
        )
    margins = tree.margin(inputs)
    out = []
    for row, full in zip(phi[:, output], margins[:, output], strict=True):
        n = row.shape[0] - 1
        first = row[:n, :n].sum(axis=1) + row[:n, n]
        terms: dict[tuple[int, ...], float] = {(i,): float(first[i]) for i in range(n)}
        iu, ju = np.triu_indices(n, k=1)
        terms.update(
            ((int(i), int(j)), float(2 * row[i, j])) for i, j in zip(iu, ju, strict=True)
        )
        out.append(
            Estimate(
                values=first,
                base_value=np.asarray(float(row[n, n])),
                full_value=np.asarray(float(full)),
                exact=True,
                n_evaluations=1,
                n_coalitions=0,
                estimator="tree",
                index="SII",
                max_order=2,
                interactions=terms,
                output=output,
            )
        )
    return out


class InterventionalUnavailable(OptionError):
    """shap's interventional TreeSHAP cannot give this answer exactly (said, then fallen back)."""


def tree_interventional(
    tree: TreeEnsemble, inputs: np.ndarray, background: np.ndarray, space: str
) -> list[Estimate]:
    """Interventional Shapley values of each row's margin (space "margin"; "prediction" for an
    identity link, where the two are one) against the background rows [r, n]: one Estimate per
    row, values [n, k]. base_value is the booster's own mean output over the background and
    full_value its output for the row, so efficiency is checked against the model itself."""
    prediction = space == "prediction"
    reason = tree.why_not_interventional(prediction)
    if reason is not None:
        raise InterventionalUnavailable(reason)
    output = tree.predict if prediction else tree.margin
    values = tree.interventional_values(inputs, background, prediction)  # [m, k, n]
    base = np.asarray(output(background), dtype=np.float64).mean(axis=0)  # [k]
    full = np.asarray(output(inputs), dtype=np.float64)  # [m, k]
    gap = np.abs(values.sum(axis=2) + base - full).max()
    if gap > ADDITIVITY_TOL * (1.0 + np.abs(full).max()):
        raise InterventionalUnavailable(
            f"shap's interventional TreeSHAP misses this {tree.library} model's output by "
            f"{gap:.3g} (a split it does not read exactly)"
        )
    return [
        Estimate(
            values=row.T.copy(),
            base_value=base.copy(),
            full_value=f,
            exact=True,
            n_evaluations=len(background) + 1,  # the row against each background row, once
            n_coalitions=0,
            estimator="tree",
        )
        for row, f in zip(values, full, strict=True)
    ]
