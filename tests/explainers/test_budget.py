"""Budget accounting: what the estimators report is what the model really received."""

from __future__ import annotations

import time

import numpy as np
import pytest

from explainers import BudgetError, ExplainerError, shapley_values
from explainers.estimators import exact, kernel, permutation
from explainers.games.masked import MaskedModelGame
from tests.explainers.shapley_oracles import TableGame, brute_force_shapley, random_table, table_of

ESTIMATORS = [
    ("exact", "kernel"),
    ("permutation", "kernel"),
    ("kernel", "kernel"),
    ("kernel", "leverage"),
    ("auto", "kernel"),
    ("gp", "kernel"),
]
IDS = ["exact", "permutation", "kernel", "kernel-leverage", "auto", "gp"]


class CountingPredict:
    """A small nonlinear model [rows, d] -> [rows, 2] that counts the rows it receives."""

    def __init__(self, d: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.normal(size=(d, 2))
        self.rows = 0
        self.calls = 0

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.rows += batch.shape[0]
        z = batch.astype(np.float64) @ self.w
        return np.stack([np.tanh(z[:, 0]) * z[:, 1], np.sin(z[:, 1])], axis=1)


def background_game(d: int, rows: int, seed: int = 0, max_rows: int = 1 << 16):
    rng = np.random.default_rng(seed)
    predict = CountingPredict(d, seed)
    game = MaskedModelGame(
        predict, rng.normal(size=d), rng.normal(size=(rows, d)), max_rows=max_rows
    )
    return game, predict


def minimum(estimator: str, n: int) -> int:
    """Fewest coalitions each estimator accepts (documented in the estimator modules)."""
    if n == 1:
        return 2
    if estimator == "exact":
        return 1 << n
    if estimator == "permutation":
        return 2 * n
    return 2 * n  # kernel, gp and auto: n - 1 complement pairs plus empty and full


PLAIN_BUDGETS = [
    (1, [2, 3, 50]),
    (2, [4, 5, 7]),
    (3, [8, 9, 11, 100]),
    (5, [11, 12, 17, 31, 32, 33, 63]),
    (8, [17, 33, 99, 101, 255, 256, 257, 1001]),
    (11, [23, 301, 777, 2047, 2048, 2049]),
]
# Budgets below an estimator's minimum are covered by test_budget_below_minimum_raises...
PLAIN_CASES = [
    pytest.param(estimator, sampler, n, budget, id=f"{name}-n{n}-b{budget}")
    for (estimator, sampler), name in zip(ESTIMATORS, IDS, strict=True)
    for n, budgets in PLAIN_BUDGETS
    for budget in budgets
    if budget >= minimum(estimator, n)
]


@pytest.mark.parametrize(("estimator", "sampler", "n", "budget"), PLAIN_CASES)
def test_plain_game_evaluations_are_counted(estimator: str, sampler: str, n: int, budget: int):
    game = TableGame(random_table(n, seed=n))
    est = shapley_values(game, n, estimator=estimator, budget=budget, seed=1, sampler=sampler)
    assert est.n_evaluations == game.rows_seen == est.n_coalitions
    assert est.n_evaluations <= budget
    if estimator == "exact" or est.exact:
        assert est.n_coalitions == 1 << n
    np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)


BACKGROUND_BUDGETS = [
    (3, 7, 8 * 7),
    (4, 20, 9 * 20 + 19),  # odd, not a multiple of the rows per coalition
    (6, 20, 1001),
    (6, 20, 64 * 20),
    (6, 5, 64 * 5 - 1),
    (8, 20, 123 * 20 + 7),
    (9, 3, 2000),
]
BACKGROUND_CASES = [
    pytest.param(estimator, sampler, n, rows, budget, id=f"{name}-n{n}-r{rows}-b{budget}")
    for (estimator, sampler), name in zip(ESTIMATORS, IDS, strict=True)
    for n, rows, budget in BACKGROUND_BUDGETS
    if budget // rows >= minimum(estimator, n)
]


@pytest.mark.parametrize(("estimator", "sampler", "n", "rows", "budget"), BACKGROUND_CASES)
def test_background_game_rows_are_counted(
    estimator: str, sampler: str, n: int, rows: int, budget: int
):
    """Rows the predict function really receives == n_evaluations <= budget."""
    # a small max_rows forces the game to chunk its model calls
    game, predict = background_game(n, rows, seed=n, max_rows=97)
    est = shapley_values(game, n, estimator=estimator, budget=budget, seed=2, sampler=sampler)
    assert predict.rows == est.n_evaluations == est.n_coalitions * rows
    assert est.n_evaluations <= budget
    assert est.values.shape == (n, 2)
    np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)


@pytest.mark.parametrize(("estimator", "sampler"), ESTIMATORS, ids=IDS)
@pytest.mark.parametrize(("n", "rows"), [(1, 1), (2, 1), (3, 1), (6, 1), (6, 10), (9, 4)])
def test_budget_below_minimum_raises_before_any_call(
    n: int, rows: int, estimator: str, sampler: str
):
    budget = minimum(estimator, n) * rows - 1
    game, predict = background_game(n, rows)
    with pytest.raises(BudgetError):
        shapley_values(game, n, estimator=estimator, budget=budget, sampler=sampler)
    assert predict.rows == 0 and predict.calls == 0
    # ... and the minimum itself is accepted.
    est = shapley_values(game, n, estimator=estimator, budget=budget + 1, sampler=sampler)
    assert predict.rows == est.n_evaluations <= budget + 1


def test_budget_error_is_an_explainer_error() -> None:
    assert issubclass(BudgetError, ExplainerError)


def test_documented_minimums() -> None:
    for n in range(2, 12):
        assert exact.min_coalitions(n) == minimum("exact", n)
        assert permutation.min_coalitions(n) == minimum("permutation", n)
        assert kernel.min_coalitions(n) == minimum("kernel", n)


@pytest.mark.parametrize(("n", "rows"), [(4, 1), (6, 3), (8, 20)])
def test_auto_picks_exact_when_it_fits(n: int, rows: int) -> None:
    game, predict = background_game(n, rows)
    est = shapley_values(game, n, budget=(1 << n) * rows)
    assert est.estimator == "exact" and est.exact
    assert predict.rows == est.n_evaluations == (1 << n) * rows
    truth = brute_force_shapley(table_of(game, n))
    np.testing.assert_allclose(est.values, truth, atol=1e-9)

    game, predict = background_game(n, rows)
    est = shapley_values(game, n, budget=(1 << n) * rows - 1)
    assert est.estimator == "kernel" and not est.exact
    assert predict.rows == est.n_evaluations <= (1 << n) * rows - 1


def test_auto_default_budget() -> None:
    """Without a budget: exact while 2^n <= 2n + 2048 (n <= 11), else KernelSHAP at 2n + 2048."""
    game = TableGame(random_table(11, seed=0))
    est = shapley_values(game, 11)
    assert est.estimator == "exact" and game.rows_seen == 1 << 11
    game = TableGame(random_table(12, seed=0))
    est = shapley_values(game, 12)
    assert est.estimator == "kernel" and not est.exact
    assert game.rows_seen == est.n_evaluations <= 2 * 12 + 2048
    game, predict = background_game(12, 3)
    est = shapley_values(game, 12)
    assert est.estimator == "kernel"
    assert predict.rows == est.n_evaluations <= (2 * 12 + 2048) * 3


def test_exact_refuses_more_than_twenty_players() -> None:
    calls = []

    def game(masks: np.ndarray) -> np.ndarray:
        calls.append(masks.shape[0])
        return masks.sum(axis=1).astype(float)

    with pytest.raises(ExplainerError) as info:
        shapley_values(game, 21, estimator="exact")
    assert type(info.value) is not ExplainerError  # a specific subclass
    with pytest.raises(ExplainerError):
        shapley_values(game, 21, estimator="exact", budget=1 << 22)
    assert calls == []
    # auto with n > 20 does not try exact, whatever the budget
    est = shapley_values(game, 21, budget=100)
    assert est.estimator == "kernel" and sum(calls) == est.n_evaluations <= 100
    np.testing.assert_allclose(est.values, np.ones(21), atol=1e-9)  # additive game


def test_unknown_options_raise_explainer_errors() -> None:
    game = TableGame(random_table(3, seed=0))
    with pytest.raises(ExplainerError):
        shapley_values(game, 3, estimator="nope")
    with pytest.raises(ExplainerError):
        shapley_values(game, 0)
    assert game.rows_seen == 0


@pytest.mark.parametrize("sampler", ["kernel", "leverage"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_kernel_is_exact_only_when_it_says_so(n: int, sampler: str) -> None:
    """Across every budget from the minimum to 2^n, exact=True must mean exact values.

    Regression: for n=2 at budget 3 the design had no room for a complementary pair, so nothing
    was enumerated or sampled, the regression saw no rows, and the estimate came back as
    [0, v(N) - v(empty)] flagged exact=True (kernel.min_coalitions(2) was 3; now 4).
    """
    table = random_table(n, seed=42)
    truth = brute_force_shapley(table)
    for budget in range(kernel.min_coalitions(n), (1 << n) + 1):
        est = shapley_values(
            TableGame(table), n, estimator="kernel", budget=budget, sampler=sampler
        )
        assert est.exact == (budget >= 1 << n), budget
        if est.exact:
            np.testing.assert_allclose(est.values, truth, atol=1e-9, err_msg=f"budget {budget}")
        np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)


def test_permutation_overhead_at_a_budget_covering_every_coalition() -> None:
    """Once every coalition is paid for, drawing more (free) permutations must stay cheap.

    Regression: _plan drew them one per loop iteration up to MAX_PERMUTATIONS (65536), about
    3-5 s of pure estimator overhead for n = 3..11 with a free game; bulk draws take 0.2-0.8 s.
    """
    game = TableGame(random_table(3, seed=0))
    start = time.perf_counter()
    est = shapley_values(game, 3, estimator="permutation", budget=8)
    elapsed = time.perf_counter() - start
    assert game.rows_seen == est.n_evaluations == 8
    assert elapsed < 1.0, f"{elapsed:.2f} s"  # 2.8 s before the fix, 0.25 s after
    np.testing.assert_allclose(est.values, brute_force_shapley(game.table), atol=0.01)
