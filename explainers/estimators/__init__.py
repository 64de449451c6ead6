"""Game-agnostic Shapley estimators: each takes (recorder, rng) and returns an Estimate."""

from explainers.estimators.base import Estimate

__all__ = ["Estimate"]
