"""Aggregated positive interactions: worked example, ordering against SV, convex games, MC."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from explainers import shapley_values
from explainers.estimators.api import VARIANTS
from explainers.estimators.library import api_values
from explainers.estimators.mobius import mobius_transform
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


def test_supermodular_game_with_third_order_dividends() -> None:
    """v(S) = max(0, |S| - 1), n = 3: convex, dividends 1 on pairs and -1 on the triple.
    chain keeps Shapley (no negative second-order interaction); moebius drops the -1."""

    def game(masks: np.ndarray) -> np.ndarray:
        return np.maximum(np.atleast_2d(masks).sum(axis=1) - 1, 0).astype(float)

    np.testing.assert_allclose(shapley_values(game, 3).values, [2 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(run(game, 3, "chain"), [2 / 3] * 3, atol=1e-12)
    np.testing.assert_allclose(run(game, 3, "moebius"), [1.0] * 3, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_convex_games_with_negative_dividends(seed: int) -> None:
    """Random supermodular games on 5 players with negative third-order dividends:
    v(S) = sum of pair weights w_ij in [0.5, 1.5] over pairs in S - 0.1 per triple in S, so
    I_ij(S) = w_ij - 0.1 |S| >= 0.2. chain equals Shapley; moebius exceeds it by the dropped
    dividends' shares."""
    n = 5
    rng = np.random.default_rng(seed)
    table = np.zeros(1 << n)
    sizes = np.array([bin(s).count("1") for s in range(1 << n)])
    pair_w = rng.uniform(0.5, 1.5, size=(n, n))
    for s in range(1 << n):
        members = [i for i in range(n) if s >> i & 1]
        table[s] = sum(pair_w[i, j] for i in members for j in members if i < j)
    for s in range(1 << n):  # every triple's dividend -0.1
        k = sizes[s]
        table[s] -= 0.1 * k * (k - 1) * (k - 2) / 6
    game = table_game(table)
    dividends = mobius_transform(table[:, None])[:, 0]
    assert dividends[sizes == 3].max() < 0  # third-order dividends, all negative
    inter = [
        table[s | 1 << i | 1 << j] - table[s | 1 << i] - table[s | 1 << j] + table[s]
        for i in range(n)
        for j in range(n)
        for s in range(1 << n)
        if i != j and not s >> i & 1 and not s >> j & 1
    ]
    assert min(inter) >= 0  # supermodular
    sv = shapley_values(game, n, estimator="exact").values
    np.testing.assert_allclose(run(game, n, "chain"), sv, atol=1e-10)
    moebius = run(game, n, "moebius")
    # Dropped: each triple's -0.1 shared by 3, over the C(4, 2) = 6 triples holding a player.
    np.testing.assert_allclose(moebius - sv, [0.1 / 3 * 6] * n, atol=1e-10)
    # Monte-Carlo chain estimates agree with exact chain on the convex game too.
    rec = GameRecorder(game, n, 20_000)
    mc = api_values(rec, np.random.default_rng(seed), "chain", "permutation").values[:, 0]
    np.testing.assert_allclose(mc, sv, atol=0.1)


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
