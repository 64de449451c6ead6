"""Game-agnostic estimators: each takes a game (through its recorder) and returns one result
type, `Estimate` (`base.py`): values, interaction terms where an index has them, and provenance
(exact or estimated, evaluations spent, standard errors).

`registry.py`: the one estimator table (index x estimator -> a runner taking a recorder,
minimum coalitions, sampled, text policy), `choose` (resolved once per request, a `Choice`)
and the entries `shapley_values`, `interaction_values`, `api_values`;
`exact.py` (and `exact.fits`, the one "exact when 2^n fits" rule), `permutation.py`,
`kernel.py` (and the Shapley-kernel size distribution), `rounds.py` (precision targets),
`mobius.py` (subset transforms), `budget.py` (default budgets, rows per call),
`interactions.py` (interaction indices), `api.py` and `api_chain.py` (API, exact and sampled),
`tree.py`, `loo.py` (leave-one-out, hierarchical and proxy-pruned, for removal games),
`surrogate.py` (ContextCite's sampled Lasso surrogate).
No torch at import.
"""

from __future__ import annotations

from explainers.estimators.base import Estimate
from explainers.estimators.library import shapley_values
from explainers.estimators.registry import ESTIMATORS, choose_estimator

__all__ = ["ESTIMATORS", "Estimate", "choose_estimator", "shapley_values"]
