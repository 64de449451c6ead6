"""Interaction indices: identities, Möbius ground truth, shapiq's exact computer, budgets."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import shapiq

from explainers import shapley_values
from explainers.estimators.base import Estimate
from explainers.estimators.interactions import INDICES
from explainers.estimators.library import interaction_values
from explainers.estimators.mobius import mobius_transform
from explainers.games import BudgetError
from explainers.shapley.runs import pick

EFFICIENT = ["k-SII", "STII", "FSII"]


def table_game(table: np.ndarray):  # type: ignore[no-untyped-def]
    n = table.shape[0].bit_length() - 1
    weights = 1 << np.arange(n)

    def game(masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(masks)
        return table[(masks.astype(np.int64) * weights).sum(axis=1)]

    return game


def random_table(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=1 << n)


def k_additive_table(n: int, k: int, seed: int) -> tuple[np.ndarray, dict[tuple[int, ...], float]]:
    """v(S) = sum over T <= S, |T| <= k of m(T), with random m: every index equals m."""
    rng = np.random.default_rng(seed)
    dividends = {
        t: float(rng.normal()) for size in range(1, k + 1) for t in combinations(range(n), size)
    }
    base = float(rng.normal())
    table = np.full(1 << n, base)
    for s in range(1 << n):
        members = {i for i in range(n) if s >> i & 1}
        table[s] += sum(v for t, v in dividends.items() if set(t) <= members)
    return table, dividends


@pytest.mark.parametrize("index", EFFICIENT)
@pytest.mark.parametrize("order", [1, 2, 3])
def test_efficient_indices_sum_to_total(index: str, order: int) -> None:
    table = random_table(7, seed=order)
    res = interaction_values(table_game(table), 7, index=index, max_order=order)
    assert res.exact
    assert sum(res.interactions.values()) == pytest.approx(table[-1] - table[0], abs=1e-10)
    assert res.efficiency_gap < 1e-10


@pytest.mark.parametrize("index", INDICES)
def test_order_one_is_shapley(index: str) -> None:
    table = random_table(6, seed=3)
    if index == "FBII":  # order 1 of the Banzhaf family is the Banzhaf value
        expected = np.array(
            [
                np.mean([table[s | 1 << i] - table[s] for s in range(64) if not s >> i & 1])
                for i in range(6)
            ]
        )
    else:
        expected = shapley_values(table_game(table), 6, estimator="exact").values
    res = interaction_values(table_game(table), 6, index=index, max_order=1)
    np.testing.assert_allclose(res.values, expected, atol=1e-12)


@pytest.mark.parametrize("index", ["k-SII", "STII", "FSII"])
def test_k_additive_game_gives_moebius(index: str) -> None:
    table, dividends = k_additive_table(6, 2, seed=1)
    res = interaction_values(table_game(table), 6, index=index, max_order=2)
    for key, value in dividends.items():
        assert res.interactions[key] == pytest.approx(value, abs=1e-10)


def test_sii_pair_equals_moebius_without_higher_terms() -> None:
    table, dividends = k_additive_table(5, 2, seed=4)
    res = interaction_values(table_game(table), 5, index="SII", max_order=2)
    for key in combinations(range(5), 2):
        assert res.interactions[key] == pytest.approx(dividends[key], abs=1e-10)
    dividends_all = mobius_transform(table[:, None])[:, 0]
    assert res.base_value == pytest.approx(dividends_all[0])


@pytest.mark.parametrize("index", INDICES)
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_shapiq_exact_computer(index: str, seed: int) -> None:
    n = 8
    table = random_table(n, seed)
    game = table_game(table)
    computer = shapiq.ExactComputer(game, n_players=n)
    for order in [1, 2, 3] if index != "SV" else [1]:
        ours = interaction_values(game, n, index=index, max_order=order)
        ref = computer(index=index, order=order)
        worst = max(abs(v - ref[key]) for key, v in ours.interactions.items())
        assert worst < 1e-8, (index, order, worst)
        assert abs(ours.base_value - ref.baseline_value) < 1e-8


@pytest.mark.parametrize(
    ("index", "estimator"),
    [
        ("k-SII", "kernel"),
        ("k-SII", "svarm"),
        ("SII", "kernel"),
        ("STII", "svarm"),
        ("FSII", "kernel"),
        ("FBII", "kernel"),
    ],
)
def test_sampled_estimates_respect_budget_and_converge(index: str, estimator: str) -> None:
    n = 10
    table = random_table(n, seed=7)
    calls = {"rows": 0}

    def game(masks: np.ndarray) -> np.ndarray:
        calls["rows"] += np.atleast_2d(masks).shape[0]
        return table_game(table)(masks)

    exact = interaction_values(table_game(table), n, index=index, max_order=2).interactions
    errors = []
    for budget in [300, 1000]:
        calls["rows"] = 0
        res = interaction_values(
            game, n, index=index, max_order=2, estimator=estimator, budget=budget, seed=0
        )
        assert not res.exact
        assert res.n_evaluations == calls["rows"] <= budget
        sq = [(res.interactions[k] - v) ** 2 for k, v in exact.items()]
        errors.append(np.sqrt(np.mean(sq)))
    assert errors[1] < errors[0]


def test_budget_errors() -> None:
    game = table_game(random_table(6, 0))
    with pytest.raises(BudgetError):
        interaction_values(game, 6, index="k-SII", estimator="exact", budget=63)
    with pytest.raises(BudgetError):
        interaction_values(game, 6, index="k-SII", estimator="kernel", budget=5)


@pytest.mark.parametrize("index", ["SII", "k-SII"])
def test_permutation_uses_its_budget_on_the_memoised_game(index: str) -> None:
    n = 10
    game = table_game(random_table(n, seed=8))
    res = interaction_values(game, n, index=index, estimator="permutation", budget=800, seed=0)
    # Without the larger nominal budget about a quarter is used; repeats among short prefixes
    # keep small games from using all of it.
    assert 0.5 * 800 <= res.n_evaluations <= 800
    assert len(res.interactions) == n + n * (n - 1) // 2  # unsampled terms are present, as 0


def test_sampled_default_is_gp_else_shapiq() -> None:
    """auto's sampled estimator: gp for every index; on text games (gp_auto False) shapiq's,
    permutation sampling for STII and KernelSHAP-IQ for the others."""
    n = 12
    game = table_game(random_table(n, seed=9))
    for index in ("SII", "k-SII", "STII", "FSII", "FBII"):
        res = interaction_values(game, n, index=index, budget=500)
        assert res.estimator == "gp" and res.n_evaluations <= 500
    res = interaction_values(game, n, index="STII", budget=500, gp_auto=False)
    assert res.estimator.startswith("permutation") and res.n_evaluations <= 500
    res = interaction_values(game, n, index="FSII", budget=500, gp_auto=False)
    assert res.estimator == "kernel (shapiq RegressionFSII)"


def test_interactions_and_shapley_values_share_one_result_type() -> None:
    table = random_table(5, seed=2)
    sv = shapley_values(table_game(table), 5, estimator="exact")
    res = interaction_values(table_game(table), 5, index="k-SII", max_order=2)
    assert type(sv) is type(res) is Estimate
    assert (sv.index, sv.max_order, sv.interactions, sv.output) == ("SV", 1, None, None)
    assert (res.index, res.max_order, res.output) == ("k-SII", 2, 0)
    assert res.interactions is not None
    np.testing.assert_allclose(res.values, [res.interactions[(i,)] for i in range(5)])
    np.testing.assert_allclose(res.base_value, table[0])
    np.testing.assert_allclose(res.full_value, table[-1])


def test_the_response_field_writes_player_tuples_as_strings() -> None:
    """Only the explanation's `interactions` field (the HTTP body) keys terms by "i,j"."""
    table = random_table(4, seed=5)
    res = interaction_values(table_game(table), 4, index="STII", max_order=2)
    explanation = pick(res, None, None)  # type: ignore[arg-type]  # one output: no model needed
    assert explanation.interactions is not None and res.interactions is not None
    assert explanation.interactions["index"] == "STII"
    assert explanation.interactions["max_order"] == 2
    assert explanation.interactions["values"] == {
        ",".join(map(str, key)): v for key, v in res.interactions.items()
    }
    assert list(explanation.interactions["values"])[:5] == ["0", "1", "2", "3", "0,1"]
    np.testing.assert_allclose(explanation.values, res.values)
    assert explanation.base_value == pytest.approx(float(table[0]))
    assert explanation.approximation_error < 1e-10
