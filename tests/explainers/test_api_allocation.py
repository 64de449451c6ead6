"""Aggregated positive interactions: worked example, ordering against SV, convex games, MC."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from explainers import shapley_values
from explainers.api_allocation import VARIANTS, api_values
from explainers.games import BudgetError, GameRecorder
from tests.explainers.test_interactions import random_table, table_game


def run(game, n: int, variant: str = "chain", **kw) -> np.ndarray:  # type: ignore[no-untyped-def]
    est = kw.pop("estimator", "auto")
    res = api_values(
        GameRecorder(game, n, kw.pop("budget", None)), np.random.default_rng(0), variant, est
    )
    return res.values[:, 0]


def brute_chain(table: np.ndarray) -> np.ndarray:
    """The chain rule straight from its definition, averaging over all n! permutations."""
    n = table.shape[0].bit_length() - 1
    psi = np.zeros(n)
    perms = list(permutations(range(n)))
    for order in perms:
        for r, i in enumerate(order):
            prefix = 0
            total = table[1 << i] - table[0]
            for m in range(r):
                j = order[m]
                inter = (
                    table[prefix | 1 << i | 1 << j]
                    - table[prefix | 1 << i]
                    - table[prefix | 1 << j]
                    + table[prefix]
                )
                total += max(inter, 0.0)
                prefix |= 1 << j
            psi[i] += total
    return psi / len(perms)


@pytest.mark.parametrize("variant", VARIANTS)
def test_max_game_worked_example(variant: str) -> None:
    def max_game(masks: np.ndarray) -> np.ndarray:
        return np.atleast_2d(masks).max(axis=1).astype(float)

    np.testing.assert_allclose(run(max_game, 2, variant), [1.0, 1.0])
    np.testing.assert_allclose(shapley_values(max_game, 2).values, [0.5, 0.5])


def test_chain_equals_its_definition() -> None:
    table = random_table(5, seed=2)
    np.testing.assert_allclose(run(table_game(table), 5), brute_chain(table), atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_api_at_least_shapley(variant: str, seed: int) -> None:
    table = random_table(7, seed)
    sv = shapley_values(table_game(table), 7, estimator="exact").values
    assert np.all(run(table_game(table), 7, variant) >= sv - 1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_convex_game_gives_shapley(variant: str) -> None:
    weights = np.array([1.0, 2.0, 0.5, 3.0, 1.5])

    def convex(masks: np.ndarray) -> np.ndarray:  # supermodular: a square of a positive sum
        return (np.atleast_2d(masks) @ weights) ** 2

    sv = shapley_values(convex, 5, estimator="exact").values
    np.testing.assert_allclose(run(convex, 5, variant), sv, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_dummy_gets_zero(variant: str) -> None:
    table = random_table(5, seed=4)

    def with_dummy(masks: np.ndarray) -> np.ndarray:  # player 5 changes nothing
        return table_game(table)(np.atleast_2d(masks)[:, :5])

    assert run(with_dummy, 6, variant)[5] == pytest.approx(0.0, abs=1e-12)


def test_monte_carlo_converges_within_budget() -> None:
    n = 9
    table = random_table(n, seed=5)
    exact = run(table_game(table), n)
    errors = []
    for budget in [300, 3000, 30000]:
        rec = GameRecorder(table_game(table), n, budget)
        res = api_values(rec, np.random.default_rng(1), "chain", "permutation")
        assert not res.exact and res.n_evaluations <= budget
        errors.append(np.abs(res.values[:, 0] - exact).max())
    assert errors[2] < errors[0]
    with pytest.raises(BudgetError):
        api_values(
            GameRecorder(table_game(table), n, 40), np.random.default_rng(0), "chain", "permutation"
        )
    with pytest.raises(BudgetError):
        api_values(
            GameRecorder(table_game(table), n, 300),
            np.random.default_rng(0),
            "moebius",
            "permutation",
        )
