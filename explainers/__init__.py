"""The science: games, maskers and Shapley estimators, usable as a plain library.

One result type: `Estimate` (values, interactions, provenance) for Shapley values and
interaction indices alike (`InteractionResult` and `ShapleyResult` are its older names).

Names load on first use (PEP 562), so `import explainers.games` or `explainers.estimators`
does not import torch (explainers.shapley.explainer imports models.base).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explainers.estimators.base import Estimate
    from explainers.estimators.library import interaction_values, shapley_values
    from explainers.games import BudgetError, ExplainerError, GameRecorder

    InteractionResult = Estimate
    ShapleyResult = Estimate

_WHERE = {
    "BudgetError": "explainers.games",
    "Estimate": "explainers.estimators.base",
    "ExplainerError": "explainers.games",
    "GameRecorder": "explainers.games",
    "InteractionResult": "explainers.estimators.base:Estimate",
    "ShapleyResult": "explainers.estimators.base:Estimate",
    "interaction_values": "explainers.estimators.library",
    "shapley_values": "explainers.estimators.library",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'explainers' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr or name)


__all__ = [
    "BudgetError",
    "Estimate",
    "ExplainerError",
    "GameRecorder",
    "InteractionResult",
    "ShapleyResult",
    "interaction_values",
    "shapley_values",
]
