"""What every estimator returns: one `Estimate` for Shapley values, interaction indices, API,
leave-one-out style scores and sampled surrogates alike (values, interactions, provenance)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from explainers.explanation import Caveat

# Which output a precision target watches: an index, a rule from v(all) [k] to an index, or None
# for every output.
OutputRule = int | Callable[[np.ndarray], int] | None


@dataclass(frozen=True)
class Target:
    """Sample until the standard error of every watched value is at most `se`."""

    se: float
    output: OutputRule = None

    def worst(self, est: Estimate) -> float:
        """Largest error_std over the watched output(s); 0 when exact, inf when unknown."""
        if est.exact:
            return 0.0
        if est.error_std is None:
            return float("inf")
        error = est.error_std if est.error_std.ndim == 2 else est.error_std[:, None]
        out = self.output
        if callable(out):
            out = out(np.atleast_1d(est.full_value))
        return float(np.max(error if out is None else error[:, out]))


@dataclass(frozen=True)
class Precision:
    """How a precision target ended: `reached` is false when the budget (or the deadline) came
    first; `max_error_std` is over the watched output(s)."""

    target_se: float
    reached: bool
    max_error_std: float
    rounds: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "target_se": self.target_se,
            "reached": self.reached,
            "max_error_std": self.max_error_std,
            "rounds": self.rounds,
        }


@dataclass(frozen=True)
class Estimate:
    """Attributions of one game with provenance.

    values [n] or [n, k]; base_value = v(empty) and full_value = v(all), [] or [k].
    Interaction indices (Grabisch & Roubens 1999 and successors, estimators/interactions.py)
    explain one output (`output`): values [n] are the first-order terms, `interactions` maps
    each player tuple of order 1..max_order to its term, and base_value is v(empty) (FBII: its
    empty-set term). A surrogate's base_value is its intercept.
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
    precision: Precision | None = None  # with a target_se: whether it was reached
    index: str = "SV"  # what the values are: SV, SII, k-SII, STII, FSII, FBII, API, LOO, ...
    max_order: int = 1  # highest order in `interactions`
    interactions: Mapping[tuple[int, ...], float] | None = None  # player tuple -> term
    output: int | None = None  # the one output explained, when values are [n] of one output
    warnings: tuple[Caveat, ...] = ()  # the estimator's own caveats (e.g. partition_truncated)

    @property
    def efficiency_gap(self) -> np.ndarray:
        """|sum of every term + base_value - v(all)| per output (interactions when present)."""
        if self.interactions is not None:
            total = np.asarray(sum(self.interactions.values()), dtype=np.float64)
            return np.abs(total + self.base_value - self.full_value)
        return np.abs(self.values.sum(axis=0) + self.base_value - self.full_value)


def uncalibrated_below(
    estimator: str, coalitions: int, players: int, per_player: int, evidence: str
) -> Caveat | None:
    """An uncalibrated_error warning for an answer under `per_player` coalitions per player,
    where held-out games put fewer than 90% of values within 2 error_std (`evidence` says what
    was measured there; issue 28), else None."""
    if coalitions >= per_player * players:
        return None
    return Caveat(
        "uncalibrated_error",
        f"{estimator}'s error_std at {coalitions} coalitions for {players} players (under "
        f"{per_player} per player) is not calibrated: on held-out {evidence} "
        "(docs/benchmarks.md); raise the budget",
    )
