"""estimators/loo.py on a closed-form removal game (no language model needed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from explainers.estimators import loo


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


W = [0.5, 2.0, -1.0, 3.0, 0.25, 1.5]
SINGLES = [frozenset({j}) for j in range(len(W))]


def test_leave_one_out_is_the_drop_of_each_unit() -> None:
    game = AdditiveGame(W)
    scores, full = loo.leave_one_out(game, SINGLES)
    assert full == sum(W) + 1.0
    want = np.array(W) + np.array([1.0, 1.0, 0, 0, 0, 0])  # the pair bonus goes with 0 and 1
    np.testing.assert_allclose(scores, want, atol=1e-12)
    assert game.calls == 1  # one batch


def test_top_keeps_ties_at_the_cutoff() -> None:
    assert loo.top(np.array([1.0, 3.0, 3.0, 0.0]), 1) == {1, 2}
    assert loo.top(np.array([1.0, 2.0]), 5) == {0, 1}


def test_hierarchy_keeping_every_group_is_plain_loo() -> None:
    game = AdditiveGame(W)
    groups = [frozenset({0, 1, 2}), frozenset({3, 4, 5})]
    group_of = [0, 0, 0, 1, 1, 1]
    values, step, full = loo.hierarchical_loo(game, groups, SINGLES, group_of, keep=2)
    np.testing.assert_allclose(values, loo.leave_one_out(game, SINGLES)[0], atol=1e-12)
    assert step.kept == {0, 1} and step.base == frozenset() and full == sum(W) + 1.0


def test_hierarchy_drops_the_weaker_group_and_scores_in_its_absence() -> None:
    game = AdditiveGame(W)
    groups = [frozenset({0, 1, 2}), frozenset({3, 4, 5})]
    values, step, full = loo.hierarchical_loo(game, groups, SINGLES, [0, 0, 0, 1, 1, 1], keep=1)
    assert step.kept == {1} and step.base == groups[0] and step.candidates == [3, 4, 5]
    np.testing.assert_allclose(values, [0, 0, 0, 3.0, 0.25, 1.5], atol=1e-12)
    assert full == 3.0 + 0.25 + 1.5


def test_proxy_pruning_keeps_the_best_and_removes_the_rest() -> None:
    proxy = AdditiveGame(W)
    step = loo.by_proxy(proxy, SINGLES, [1, 2, 3, 4], keep=2)
    assert step.candidates == [1, 3] and step.base == frozenset({2, 4})
    np.testing.assert_allclose(step.scores, [3.0, -1.0, 3.0, 0.25], atol=1e-12)
