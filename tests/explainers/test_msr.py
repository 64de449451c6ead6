"""Tree MSR (Witter, Liu & Musco 2025) against exact enumeration: the surrogate's Shapley values
are exact, the estimate is efficient and unbiased, its error_std covers the error, and the
budget holds."""

from __future__ import annotations

from itertools import product
from math import comb, factorial

import numpy as np
import pytest

from explainers.estimators import msr
from explainers.estimators.library import shapley_values
from explainers.games import BudgetError, GameRecorder

N = 10
_rng = np.random.default_rng(11)
W2 = _rng.normal(size=(N, N)) * 0.4
W1 = _rng.normal(size=N)


def game(masks: np.ndarray) -> np.ndarray:
    """A smooth game with pairwise interactions, two outputs. [m, 2]"""
    x = masks.astype(np.float64)
    a = np.tanh(x @ W1 * 0.5 + np.einsum("mi,ij,mj->m", x, W2, x) * 0.1)
    b = (x[:, 0] * x[:, 3]) + 0.5 * x[:, 5] - 0.25 * x.sum(axis=1) ** 2 / N
    return np.stack([a, b], axis=1)


EXACT = shapley_values(game, N, estimator="exact", budget=None, seed=0).values  # [n, 2]


def enumerate_shapley(v: object, n: int) -> np.ndarray:
    """Shapley values of v (masks -> [m, k]) by the permutation-free subset formula."""
    masks = np.array(list(product([False, True], repeat=n)))
    values = v(masks)  # type: ignore[operator]
    index = {m.tobytes(): k for k, m in enumerate(masks)}
    phi = np.zeros((n, values.shape[1]))
    for m, val in zip(masks, values, strict=True):
        s = int(m.sum())
        for i in np.flatnonzero(~m):
            with_i = m.copy()
            with_i[i] = True
            w = factorial(s) * factorial(n - s - 1) / factorial(n)
            phi[i] += w * (values[index[with_i.tobytes()]] - val)
    return phi


def test_the_surrogates_shapley_values_are_exact() -> None:
    """Interventional TreeSHAP at all-ones against all-zeros is the Shapley value of the game
    S -> f(1_S): checked by enumeration on a fitted surrogate."""
    n = 6
    rng = np.random.default_rng(0)
    masks = rng.random((60, n)) < 0.5
    y = game(np.pad(masks, ((0, 0), (0, N - n))))
    ends = game(np.array([np.zeros(N, bool), np.pad(np.ones(n, bool), (0, N - n))]))
    models = msr._fit(masks, y, ends, seed=0)
    got = msr._surrogate_shapley(models, n)
    want = enumerate_shapley(lambda m: msr._predict(models, m), n)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_monte_carlo_weights_are_unbiased_exactly() -> None:
    """The expectation of the residual terms under the sampling distribution D (sizes from
    size_weights, uniform given the size), plus the exact empty/full terms, is the Shapley value
    of the residual: summed over every proper coalition with its probability, for r = v."""
    n = 7
    masks = np.array([m for m in product([False, True], repeat=n) if 0 < sum(m) < n])
    sizes = masks.sum(axis=1)
    prob = msr.size_weights(n)[sizes - 1] / np.array([comb(n, int(s)) for s in sizes])
    assert abs(prob.sum() - 1) < 1e-12

    def v(m: np.ndarray) -> np.ndarray:
        return game(np.pad(m, ((0, 0), (0, N - n))))

    ends = v(np.array([np.zeros(n, bool), np.ones(n, bool)]))
    expected = np.einsum("m,mik->ik", prob, msr._terms(masks, v(masks), n))
    expected += (ends[1] - ends[0])[None, :] / n
    np.testing.assert_allclose(expected, enumerate_shapley(v, n), atol=1e-10)


def test_efficient_and_within_budget() -> None:
    budget = 8 * N
    rec = GameRecorder(game, N, budget)
    est = msr.msr(rec, np.random.default_rng(3))
    assert rec.n_coalitions <= budget
    assert est.values.shape == (N, 2) and est.error_std is not None
    np.testing.assert_allclose(est.values.sum(axis=0) + est.base_value, est.full_value, atol=1e-6)


def test_unbiased_over_seeds() -> None:
    """The mean over 40 seeds approaches the exact values within 4 standard errors of the mean
    for every player and output (a biased estimator would drift by its bias)."""
    runs = np.stack(
        [msr.msr(GameRecorder(game, N, 4 * N), np.random.default_rng(s)).values for s in range(40)]
    )
    mean, se = runs.mean(axis=0), runs.std(axis=0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(mean - EXACT) <= 4 * se + 1e-9), np.max(np.abs(mean - EXACT) / se)


@pytest.mark.parametrize("per_player", [4, 16])
def test_error_std_covers_the_error(per_player: int) -> None:
    """Share of values within 2 error_std of the exact ones, over 16 seeds: at least 0.85, and
    no value off by more than 0.01 with an error_std under 1e-6."""
    inside, total = 0, 0
    for seed in range(16):
        est = msr.msr(GameRecorder(game, N, per_player * N), np.random.default_rng(seed))
        assert est.error_std is not None
        err = np.abs(est.values - EXACT)
        inside += int((err <= 2 * est.error_std).sum())
        total += err.size
        assert not np.any((err > 0.01) & (est.error_std < 1e-6))
    assert inside / total >= 0.85, inside / total


def test_more_coalitions_means_smaller_error() -> None:
    def rmse(budget: int) -> float:
        errs = [
            np.sqrt(np.mean((msr.msr(GameRecorder(game, N, budget), np.random.default_rng(s))
                             .values - EXACT) ** 2))
            for s in range(8)
        ]  # fmt: skip
        return float(np.mean(errs))

    assert rmse(64 * N) < 0.5 * rmse(4 * N)


def test_too_small_a_budget_is_refused() -> None:
    with pytest.raises(BudgetError):
        msr.msr(GameRecorder(game, N, 4), np.random.default_rng(0))
