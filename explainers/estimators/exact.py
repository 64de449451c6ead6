"""Exact Shapley values: all 2^n coalitions, then the Möbius transform.

Shapley (1953), "A value for n-person games"; Harsanyi (1963) dividends.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators.base import Estimate
from explainers.estimators.mobius import mobius_transform, shapley_from_mobius
from explainers.games import GameRecorder, all_masks

MAX_PLAYERS = 20
CHUNK = 1 << 14  # coalitions per game call; the game chunks model rows itself


def min_coalitions(n: int) -> int:
    return 1 << n


def fits(n: int, coalitions: int | None) -> bool:
    """The exact rule: all 2^n coalitions fit `coalitions` (None: no limit) and n is small."""
    return n <= MAX_PLAYERS and (coalitions is None or (1 << n) <= coalitions)


def value_table(recorder: GameRecorder) -> np.ndarray:
    """v(S) for every coalition, in bit order. [2^n, k]"""
    n = recorder.n_players
    total = 1 << n
    parts = [
        recorder.evaluate_distinct(all_masks(n, start, min(start + CHUNK, total)))
        for start in range(0, total, CHUNK)
    ]
    return np.concatenate(parts)


def exact(recorder: GameRecorder, rng: np.random.Generator) -> Estimate:
    """Exact Shapley values of the recorded game."""
    table = value_table(recorder)
    values = shapley_from_mobius(mobius_transform(table))
    return Estimate(
        values=recorder.shape_out(values),
        base_value=recorder.shape_out(table[0]),
        full_value=recorder.shape_out(table[-1]),
        exact=True,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="exact",
    )
