"""Game-agnostic estimators: each takes a game (through its recorder) and returns values with
provenance (exact or estimated, evaluations spent, standard errors).

`registry.py`: the Shapley-value estimators by name, `choose_estimator` and `shapley_values`;
`exact.py` (and `exact.fits`, the one "exact when 2^n fits" rule), `permutation.py`,
`kernel.py` (and the Shapley-kernel size distribution), `rounds.py` (precision targets),
`tree.py`, `loo.py` (leave-one-out, hierarchical and proxy-pruned, for removal games).
No torch at import.
"""

from explainers.estimators.base import Estimate
from explainers.estimators.registry import ESTIMATORS, choose_estimator, shapley_values

__all__ = ["ESTIMATORS", "Estimate", "choose_estimator", "shapley_values"]
