"""Shapley axioms for every estimator: efficiency, symmetry, dummy, linearity, linear models."""

from __future__ import annotations

import numpy as np
import pytest

from explainers import shapley_values
from explainers.games.masked import MaskedModelGame
from tests.explainers.shapley_oracles import (
    TableGame,
    brute_force_shapley,
    float32_exact,
    masks_to_index,
    random_table,
)

N = 7  # 2^7 = 128 coalitions; sampled estimators get fewer than that
SAMPLED_BUDGET = 80

# (estimator, sampler); the sampler only matters for kernel
ESTIMATORS = [
    ("exact", "kernel"),
    ("permutation", "kernel"),
    ("kernel", "kernel"),
    ("kernel", "leverage"),
]
IDS = ["exact", "permutation", "kernel", "kernel-leverage"]
# gp is not linear in the game (its prior is fitted to the game's values): efficiency, symmetry
# and the null player hold; linearity and the linear-model/multi-output identities do not.
WITH_GP = [*ESTIMATORS, ("gp", "kernel")]
GP_IDS = [*IDS, "gp"]


def run(game, n: int, estimator: str, sampler: str, seed: int = 0, budget: int | None = None):
    if budget is None and estimator != "exact":
        budget = SAMPLED_BUDGET * getattr(game, "rows_per_coalition", 1)
    return shapley_values(game, n, estimator=estimator, budget=budget, seed=seed, sampler=sampler)


@pytest.mark.parametrize(("estimator", "sampler"), WITH_GP, ids=GP_IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_efficiency(estimator: str, sampler: str, seed: int) -> None:
    table = random_table(N, seed=seed)
    est = run(TableGame(table), N, estimator, sampler, seed=seed)
    assert est.estimator == estimator
    assert est.exact == (estimator == "exact")
    np.testing.assert_allclose(est.base_value, table[0], atol=0)
    np.testing.assert_allclose(est.full_value, table[-1], atol=0)
    np.testing.assert_allclose(est.values.sum(), table[-1] - table[0], atol=1e-9)
    np.testing.assert_allclose(est.efficiency_gap, 0.0, atol=1e-9)


def symmetric_table(n: int, seed: int) -> np.ndarray:
    """Players 0 and 1 are interchangeable in v(S) = sum_j tanh(a_j . z_S + b_j) (a tiny network).

    Weights of player 0 and 1 are equal in every unit, so swapping them changes no value.
    """
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, 4))
    a[1] = a[0]
    b = rng.normal(size=4)
    idx = np.arange(1 << n)
    z = ((idx[:, None] >> np.arange(n)) & 1).astype(np.float64)
    return np.tanh(z @ a + b).sum(axis=1)


@pytest.mark.parametrize(("estimator", "sampler"), WITH_GP, ids=GP_IDS)
def test_symmetry(estimator: str, sampler: str) -> None:
    table = symmetric_table(N, seed=5)
    truth = brute_force_shapley(table)
    assert abs(truth[0] - truth[1]) < 1e-12
    if estimator == "exact":
        est = run(TableGame(table), N, estimator, sampler)
        assert est.values[0] == est.values[1]
        return
    # Sampled: the two estimates agree within their combined standard error, on every seed.
    gaps = []
    for seed in range(5):
        est = run(TableGame(table), N, estimator, sampler, seed=seed, budget=120)
        se = np.hypot(est.error_std[0], est.error_std[1])
        gap = abs(est.values[0] - est.values[1])
        assert gap <= 4 * se + 1e-9, (seed, gap, se)
        gaps.append(gap)
    # ... and on average they are close on the scale of the values.
    assert np.mean(gaps) < 0.25 * np.abs(truth).mean(), (gaps, truth)


def dummy_table(n: int, dummy: int, seed: int) -> np.ndarray:
    """A random game in which player `dummy` changes nothing."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=1 << n)
    idx = np.arange(1 << n)
    return base[idx & ~(1 << dummy)]


@pytest.mark.parametrize(("estimator", "sampler"), WITH_GP, ids=GP_IDS)
@pytest.mark.parametrize("dummy", [0, 3, N - 1])  # N-1 is the coefficient kernel eliminates
def test_dummy(estimator: str, sampler: str, dummy: int) -> None:
    table = dummy_table(N, dummy, seed=dummy)
    truth = brute_force_shapley(table)
    assert truth[dummy] == 0.0
    if estimator in ("exact", "permutation"):
        # Every marginal contribution of the dummy is exactly 0.
        for seed in range(3):
            est = run(TableGame(table), N, estimator, sampler, seed=seed)
            assert est.values[dummy] == 0.0
            if estimator == "permutation":
                assert est.error_std[dummy] == 0.0
        return
    # KernelSHAP's regression only approximately zeroes a dummy at a sampled budget.
    for seed in range(5):
        est = run(TableGame(table), N, estimator, sampler, seed=seed, budget=120)
        assert abs(est.values[dummy]) <= 4 * est.error_std[dummy] + 1e-9, seed
        assert abs(est.values[dummy]) < 0.5, seed
    # ... and exactly at the full budget.
    est = run(TableGame(table), N, estimator, sampler, budget=1 << N)
    assert est.exact
    np.testing.assert_allclose(est.values[dummy], 0.0, atol=1e-12)


@pytest.mark.parametrize(("estimator", "sampler"), ESTIMATORS, ids=IDS)
@pytest.mark.parametrize("seed", [0, 3])
def test_linearity(estimator: str, sampler: str, seed: int) -> None:
    """phi(a f + g) = a phi(f) + phi(g): sampled designs do not depend on the game's values."""
    f, g = random_table(N, seed=seed), random_table(N, seed=seed + 100)
    est_f = run(TableGame(f), N, estimator, sampler, seed=seed)
    est_g = run(TableGame(g), N, estimator, sampler, seed=seed)
    est_sum = run(TableGame(2.5 * f + g), N, estimator, sampler, seed=seed)
    assert est_f.n_coalitions == est_g.n_coalitions == est_sum.n_coalitions
    np.testing.assert_allclose(est_sum.values, 2.5 * est_f.values + est_g.values, atol=1e-9)
    if estimator == "exact":
        np.testing.assert_allclose(est_f.values, brute_force_shapley(f), atol=1e-12)


def linear_setup(seed: int, d: int = 8, rows: int = 20):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    c = 0.7
    x = float32_exact(rng, (d,))
    background = float32_exact(rng, (rows, d))

    def predict(batch: np.ndarray) -> np.ndarray:
        return batch.astype(np.float64) @ w + c

    return w, c, x, background, predict


@pytest.mark.parametrize(("estimator", "sampler"), ESTIMATORS, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_linear_model_with_background(estimator: str, sampler: str, seed: int) -> None:
    """f = w.x + c under the interventional game: phi_i = w_i (x_i - mean_B x_i), any estimator.

    The game is additive, so every permutation marginal and the kernel regression are exact.
    """
    w, c, x, background, predict = linear_setup(seed)
    d = x.shape[0]
    game = MaskedModelGame(predict, x, background)
    assert game.n_players == d and game.rows_per_coalition == len(background)
    budget = None if estimator == "exact" else 100 * len(background)  # 100 of 256 coalitions
    est = run(game, d, estimator, sampler, seed=seed, budget=budget)
    expected = w * (x - background.mean(axis=0))
    values = est.values.reshape(d)  # the masked-model game always returns [m, k]
    np.testing.assert_allclose(values, expected, atol=1e-9)
    np.testing.assert_allclose(
        est.base_value.reshape(()), background.mean(axis=0) @ w + c, atol=1e-9
    )
    np.testing.assert_allclose(est.full_value.reshape(()), x @ w + c, atol=1e-9)
    assert est.exact == (estimator == "exact")
    if est.error_std is not None:
        np.testing.assert_allclose(est.error_std, 0.0, atol=1e-9)


class MultiOutputGame:
    """Three outputs of different character: additive, pairwise and a random table."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.normal(size=n)
        self.pair = rng.normal(size=(n, n))
        self.table = rng.normal(size=1 << n)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        z = masks.astype(np.float64)
        return np.stack(
            [
                z @ self.w,
                np.einsum("mi,ij,mj->m", z, self.pair, z),
                self.table[masks_to_index(masks)],
            ],
            axis=1,
        )


@pytest.mark.parametrize(("estimator", "sampler"), ESTIMATORS, ids=IDS)
def test_multi_output_equals_per_output_runs(estimator: str, sampler: str) -> None:
    game = MultiOutputGame(N, seed=11)
    est = run(game, N, estimator, sampler, seed=4)
    assert est.values.shape == (N, 3)
    assert est.base_value.shape == est.full_value.shape == (3,)
    if est.error_std is not None:
        assert est.error_std.shape == (N, 3)
    for k in range(3):
        single = run(lambda m, k=k: game(m)[:, k], N, estimator, sampler, seed=4)
        assert single.values.shape == (N,)
        np.testing.assert_allclose(est.values[:, k], single.values, atol=1e-10)
        np.testing.assert_allclose(est.base_value[k], single.base_value, atol=0)
        np.testing.assert_allclose(est.full_value[k], single.full_value, atol=0)
        if single.error_std is not None:
            np.testing.assert_allclose(est.error_std[:, k], single.error_std, atol=1e-10)
    if estimator == "exact":
        np.testing.assert_allclose(est.values, brute_force_shapley(game(all_masks(N))), atol=1e-10)


def all_masks(n: int) -> np.ndarray:
    idx = np.arange(1 << n)
    return ((idx[:, None] >> np.arange(n)) & 1).astype(bool)
