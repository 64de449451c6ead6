"""Exact TreeSHAP by the boosters' own libraries (XGBoost `pred_contribs`/`pred_interactions`,
LightGBM `pred_contrib`): path-dependent, in the trees' raw margin.

Lundberg, Erion et al., "From local explanations to global understanding with explainable AI for
trees", Nature Machine Intelligence 2020. Path-dependent TreeSHAP takes "absent" from the trees'
own training cover, not from background rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from explainers.estimators.base import Estimate
from explainers.explanation import OptionError
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


@dataclass(frozen=True)
class TreeInteractions:
    """Pairwise Shapley interaction index (SII) of one row and one output."""

    first_order: np.ndarray  # [n]: the Shapley values (SII of singletons)
    pairs: dict[tuple[int, int], float]  # SII of each pair i < j
    base_value: float
    full_value: float


def tree_sii(tree: TreeEnsemble, inputs: np.ndarray, output: int) -> list[TreeInteractions]:
    """SII up to order 2 from the library's SHAP interaction values.

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
        iu, ju = np.triu_indices(n, k=1)
        out.append(
            TreeInteractions(
                first_order=row[:n, :n].sum(axis=1) + row[:n, n],
                pairs={
                    (int(i), int(j)): float(2 * row[i, j]) for i, j in zip(iu, ju, strict=True)
                },
                base_value=float(row[n, n]),
                full_value=float(full),
            )
        )
    return out
