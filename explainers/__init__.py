"""The science: games, maskers and Shapley estimators, usable as a plain library."""

from explainers.estimators.base import Estimate
from explainers.games import BudgetError, ExplainerError, GameRecorder
from explainers.interactions import InteractionResult, interaction_values
from explainers.shapley import shapley_values

ShapleyResult = Estimate

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
