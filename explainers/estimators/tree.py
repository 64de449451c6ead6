"""Exact TreeSHAP by the boosters' own libraries (XGBoost `pred_contribs`/`pred_interactions`,
LightGBM `pred_contrib`): path-dependent, in the trees' raw margin.

Lundberg, Erion et al., "From local explanations to global understanding with explainable AI for
trees", Nature Machine Intelligence 2020. Path-dependent TreeSHAP takes "absent" from the trees'
own training cover, not from background rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from explainers.estimators.base import Estimate
from explainers.explanation import OptionError

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
