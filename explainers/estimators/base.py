"""What every Shapley estimator returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """Shapley values of one game with provenance.

    values [n] or [n, k]; base_value = v(empty) and full_value = v(all), [] or [k].
    """

    values: np.ndarray
    base_value: np.ndarray
    full_value: np.ndarray
    exact: bool
    n_evaluations: int  # model rows spent
    n_coalitions: int
    estimator: str
    error_std: np.ndarray | None = None  # standard error per value, same shape as values
    partial: bool = False  # stopped early at the deadline: an anytime estimate on fewer samples

    @property
    def efficiency_gap(self) -> np.ndarray:
        """|sum(values) + v(empty) - v(all)| per output."""
        return np.abs(self.values.sum(axis=0) + self.base_value - self.full_value)
