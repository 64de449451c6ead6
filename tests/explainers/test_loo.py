"""estimators/loo.py on a closed-form removal game (no language model needed), through the
recorder: every score is an Estimate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from explainers.estimators import loo
from explainers.estimators.base import Estimate
from explainers.games import BudgetError, Game, GameRecorder


class AdditiveGame:
    """v(removed) = sum of the weights of the atoms present, plus one pair bonus."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.w = np.asarray(weights, dtype=np.float64)
        self.calls = 0

    def value(self, removed: frozenset[int]) -> float:
        present = [i for i in range(len(self.w)) if i not in removed]
        return float(self.w[present].sum()) + (1.0 if {0, 1} <= set(present) else 0.0)

    def evaluate(
        self, base: frozenset[int], removals: Sequence[frozenset[int]], skip_unchanged: bool = True
    ) -> tuple[float, np.ndarray]:
        self.calls += 1
        return self.value(base), np.array([self.value(base | r) for r in removals])

    def removal(self, units: tuple[frozenset[int], ...], base: frozenset[int]) -> Game:
        """The coalition game over `units` with `base` removed (loo.Removal)."""

        def game(masks: np.ndarray) -> np.ndarray:
            removals = [frozenset().union(*(units[j] for j in np.flatnonzero(~r))) for r in masks]
            return self.evaluate(base, removals)[1]

        return game


W = [0.5, 2.0, -1.0, 3.0, 0.25, 1.5]
SINGLES = [frozenset({j}) for j in range(len(W))]


def test_leave_one_out_is_the_drop_of_each_unit() -> None:
    game = AdditiveGame(W)
    est = loo.scores(game.removal, SINGLES)
    assert isinstance(est, Estimate) and (est.index, est.estimator, est.exact) == (
        "LOO",
        "loo",
        True,
    )
    assert est.full_value == est.base_value == sum(W) + 1.0
    want = np.array(W) + np.array([1.0, 1.0, 0, 0, 0, 0])  # the pair bonus goes with 0 and 1
    np.testing.assert_allclose(est.values, want, atol=1e-12)
    assert game.calls == 1  # one batch
    assert est.n_coalitions == loo.min_coalitions(len(W)) == est.n_evaluations


def test_leave_one_out_counts_every_coalition_against_the_budget() -> None:
    game = AdditiveGame(W)
    recorder = GameRecorder(game.removal(tuple(SINGLES), frozenset()), len(W), budget=len(W))
    with pytest.raises(BudgetError):
        loo.leave_one_out(recorder)
    assert game.calls == 0


def test_top_keeps_ties_at_the_cutoff() -> None:
    assert loo.top(np.array([1.0, 3.0, 3.0, 0.0]), 1) == {1, 2}
    assert loo.top(np.array([1.0, 2.0]), 5) == {0, 1}


def test_hierarchy_keeping_every_group_is_plain_loo() -> None:
    game = AdditiveGame(W)
    groups = [frozenset({0, 1, 2}), frozenset({3, 4, 5})]
    group_of = [0, 0, 0, 1, 1, 1]
    est, step = loo.hierarchical_loo(game.removal, groups, SINGLES, group_of, keep=2)
    np.testing.assert_allclose(est.values, loo.scores(game.removal, SINGLES).values, atol=1e-12)
    assert step.kept == {0, 1} and step.base == frozenset() and est.full_value == sum(W) + 1.0
    assert est.n_coalitions == (2 + 1) + (6 + 1)


def test_hierarchy_drops_the_weaker_group_and_scores_in_its_absence() -> None:
    game = AdditiveGame(W)
    groups = [frozenset({0, 1, 2}), frozenset({3, 4, 5})]
    est, step = loo.hierarchical_loo(game.removal, groups, SINGLES, [0, 0, 0, 1, 1, 1], keep=1)
    assert step.kept == {1} and step.base == groups[0] and step.candidates == [3, 4, 5]
    np.testing.assert_allclose(est.values, [0, 0, 0, 3.0, 0.25, 1.5], atol=1e-12)
    assert est.full_value == 3.0 + 0.25 + 1.5


def test_proxy_pruning_keeps_the_best_and_removes_the_rest() -> None:
    proxy = AdditiveGame(W)
    step = loo.by_proxy(proxy.removal, SINGLES, [1, 2, 3, 4], keep=2)
    assert step.candidates == [1, 3] and step.base == frozenset({2, 4})
    np.testing.assert_allclose(step.scores, [3.0, -1.0, 3.0, 0.25], atol=1e-12)
