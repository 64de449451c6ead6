"""Möbius (Harsanyi) transform and Shapley-from-dividends against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from explainers.estimators.mobius import mobius_transform, popcounts, shapley_from_mobius
from tests.explainers.shapley_oracles import brute_force_shapley, popcount, random_table, subsets


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5])
def test_mobius_inverse_property(n: int) -> None:
    """v(S) = sum over T <= S of m(T), for every S."""
    table = random_table(n, seed=10 + n)
    dividends = mobius_transform(table[:, None])[:, 0]
    rebuilt = np.array([sum(dividends[t] for t in subsets(s)) for s in range(1 << n)])
    np.testing.assert_allclose(rebuilt, table, atol=1e-12)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_mobius_matches_definition(n: int) -> None:
    """m(T) = sum_{L <= T} (-1)^{|T|-|L|} v(L), also for 1-d tables and several outputs."""
    table = random_table(n, seed=20 + n, k=3)
    expected = np.array(
        [
            sum((-1) ** (popcount(t) - popcount(sub)) * table[sub] for sub in subsets(t))
            for t in range(1 << n)
        ]
    )
    np.testing.assert_allclose(mobius_transform(table), expected, atol=1e-12)
    np.testing.assert_allclose(mobius_transform(table[:, 0]), expected[:, 0], atol=1e-12)


def test_mobius_does_not_mutate_input_and_rejects_bad_length() -> None:
    table = random_table(3, seed=1)
    copy = table.copy()
    mobius_transform(table)
    np.testing.assert_array_equal(table, copy)
    with pytest.raises(ValueError):
        mobius_transform(np.zeros(6))


def test_popcounts() -> None:
    np.testing.assert_array_equal(popcounts(4), [popcount(s) for s in range(16)])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_shapley_from_mobius_equals_brute_force(n: int, seed: int) -> None:
    table = random_table(n, seed=100 * n + seed, k=2)
    phi = shapley_from_mobius(mobius_transform(table))
    assert phi.shape == (n, 2)
    np.testing.assert_allclose(phi, brute_force_shapley(table), atol=1e-12)
    # efficiency
    np.testing.assert_allclose(phi.sum(axis=0), table[-1] - table[0], atol=1e-12)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_unanimity_games(n: int) -> None:
    """u_T(S) = 1 if T <= S: dividend 1 at T only, phi_i = 1/|T| for i in T, else 0."""
    rng = np.random.default_rng(n)
    for _ in range(5):
        t = int(rng.integers(1, 1 << n))
        table = np.array([1.0 if s & t == t else 0.0 for s in range(1 << n)])
        dividends = mobius_transform(table[:, None])[:, 0]
        expected_div = np.zeros(1 << n)
        expected_div[t] = 1.0
        np.testing.assert_allclose(dividends, expected_div, atol=1e-12)
        phi = shapley_from_mobius(dividends[:, None])[:, 0]
        expected = np.array([1 / popcount(t) if t >> i & 1 else 0.0 for i in range(n)])
        np.testing.assert_allclose(phi, expected, atol=1e-12)


def test_weighted_sum_of_unanimity_games() -> None:
    """By linearity, phi_i = sum over T containing i of c_T / |T| for v = sum c_T u_T."""
    n = 5
    coeffs = {0b00011: 2.0, 0b10101: -3.0, 0b11111: 0.5, 0b01000: 1.5}
    table = np.array([sum(c for t, c in coeffs.items() if s & t == t) for s in range(1 << n)])
    phi = shapley_from_mobius(mobius_transform(table[:, None]))[:, 0]
    expected = [sum(c / popcount(t) for t, c in coeffs.items() if t >> i & 1) for i in range(n)]
    np.testing.assert_allclose(phi, expected, atol=1e-12)


def test_empty_coalition_dividend_is_shared_by_nobody() -> None:
    """A constant game has m(empty) = c and all Shapley values 0."""
    table = np.full((1 << 4, 1), 7.0)
    np.testing.assert_allclose(shapley_from_mobius(mobius_transform(table)), 0.0, atol=1e-12)
