"""Game-agnostic estimators: each takes a game (through its recorder) and returns one result
type, `Estimate` (`base.py`): values, interaction terms where an index has them, and provenance
(exact or estimated, evaluations spent, standard errors).

`registry.py`: the Shapley-value estimators by name, `choose_estimator` and `shapley_values`;
`exact.py` (and `exact.fits`, the one "exact when 2^n fits" rule), `permutation.py`,
`kernel.py` (and the Shapley-kernel size distribution), `rounds.py` (precision targets),
`mobius.py` (subset transforms), `budget.py` (default budgets, rows per call),
`tree.py`, `loo.py` (leave-one-out, hierarchical and proxy-pruned, for removal games),
`surrogate.py` (ContextCite's sampled Lasso surrogate), `api_chain.py` (sampled API).
No torch at import.
"""

from __future__ import annotations

from explainers.estimators.base import Estimate
from explainers.estimators.registry import ESTIMATORS, choose_estimator, shapley_values

__all__ = ["ESTIMATORS", "Estimate", "choose_estimator", "shapley_values"]
