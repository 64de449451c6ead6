"""gp-orders (explainers/estimators/gp_orders.py): the order prior's closed forms against sums
over every dividend, the likelihood's gradient, and the estimator's contract (seeded,
budget-exact, efficient, exact on full enumeration, calibrated, below KernelSHAP's error)."""

from __future__ import annotations

from itertools import chain, combinations

import numpy as np
import pytest

from explainers import shapley_values
from explainers.estimators import gp, gp_orders
from explainers.estimators.gp_orders import OrderPrior, intersections
from explainers.games import GameRecorder
from tests.explainers.test_regression_estimator import Counting, tanh_game


def _run(game: object, n: int, budget: int, seed: int) -> gp_orders.Estimate:
    return gp_orders.gp_orders(GameRecorder(game, n, budget), np.random.default_rng(seed))


@pytest.mark.parametrize(("n", "orders"), [(6, 3), (8, 5)])
def test_closed_forms_match_the_dividend_sums(n: int, orders: int) -> None:
    """cov(v(S), v(U)), cov(phi_i, v(S)) and var(phi_i) against every dividend T, with
    var(a_T) = (c_|T| [|T| <= K] + theta^(|T| - 1)) prod_T q."""
    rng = np.random.default_rng(n)
    q = rng.uniform(0.1, 4.0, size=n)
    c = rng.uniform(0.1, 3.0, size=orders)
    prior = OrderPrior(q, c, theta=0.6)
    subsets = list(chain.from_iterable(combinations(range(n), k) for k in range(1, n + 1)))
    var = {
        t: ((c[len(t) - 1] if len(t) <= orders else 0.0) + 0.6 ** (len(t) - 1))
        * float(np.prod(q[list(t)]))
        for t in subsets
    }
    z = (rng.random((11, n)) < 0.6).astype(np.float64)
    z[0] = 1.0
    members = [set(np.flatnonzero(row)) for row in z]
    cov = np.array(
        [[sum(w for t, w in var.items() if set(t) <= a & b) for b in members] for a in members]
    )
    cross = np.array(
        [
            [sum(w / len(t) for t, w in var.items() if i in t and set(t) <= a) for i in range(n)]
            for a in members
        ]
    )
    phi_var = np.array([sum(w / len(t) ** 2 for t, w in var.items() if i in t) for i in range(n)])
    np.testing.assert_allclose(prior.cov(z), cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prior.cross(z), cross, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prior.variance(), phi_var, rtol=1e-10)
    e = intersections(z, z, q, orders)
    np.testing.assert_allclose(e[0], (z * q) @ z.T, rtol=1e-12)


def test_likelihood_gradient_matches_differences() -> None:
    rng = np.random.default_rng(1)
    n, m, kk = 7, 30, 3
    z = (rng.random((m, n)) < 0.5).astype(np.float64)
    z[0] = 1.0
    q = rng.uniform(0.3, 2.0, n)
    y = rng.normal(size=(m, 2))
    terms = intersections(z, z, q, kk)
    scale = np.array([1.0, 0.5, 0.2])
    noise = gp._noise(m, 1.0)
    x = np.array([0.1, -1.0, -2.0, np.log(0.3), np.log(1e-2)])
    f, g = gp_orders._nll(x, terms, scale, z, q, y, noise)
    for j in range(len(x)):
        dx = np.zeros_like(x)
        dx[j] = 1e-6
        up = gp_orders._nll(x + dx, terms, scale, z, q, y, noise)[0]
        down = gp_orders._nll(x - dx, terms, scale, z, q, y, noise)[0]
        assert g[j] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-6)
    assert np.isfinite(f)


def test_seeded_budget_exact_efficient_and_exact_on_enumeration() -> None:
    n = 10
    game = Counting(tanh_game(n, 2))
    a = _run(game, n, 60, 5)  # Counting: one model row per coalition
    assert game.coalitions <= 60 and a.n_coalitions <= 60 and a.estimator == "gp-orders"
    b, c = _run(tanh_game(n, 2), n, 60 * 30, 5), _run(tanh_game(n, 2), n, 60 * 30, 6)
    np.testing.assert_array_equal(a.values, b.values)
    assert not np.allclose(a.values, c.values)
    np.testing.assert_allclose(a.values.sum(axis=0), a.full_value - a.base_value, atol=1e-8)
    small = tanh_game(5, 0)
    exact = shapley_values(small, 5, estimator="exact").values
    np.testing.assert_allclose(_run(small, 5, 32 * 30, 0).values, exact, atol=1e-10)


def test_calibrated_and_better_than_kernel() -> None:
    """Two games, 5 seeds, 3n and 8n: most values within 2 error_std, RMSE below KernelSHAP."""
    n = 12
    inside, rmse_o, rmse_k = [], [], []
    for g in (4, 5):
        game = tanh_game(n, g, outputs=1)
        truth = shapley_values(game, n, estimator="exact").values
        for mult in (3, 8):
            for seed in range(5):
                est = _run(game, n, mult * n * 30, seed)
                k = shapley_values(game, n, estimator="kernel", budget=mult * n * 30, seed=seed)
                assert est.error_std is not None
                inside.append(np.abs(est.values - truth) <= 2 * est.error_std)
                rmse_o.append(np.sqrt(np.mean((est.values - truth) ** 2)))
                rmse_k.append(np.sqrt(np.mean((k.values - truth) ** 2)))
    assert 0.85 <= np.mean(inside) <= 1.0
    assert np.mean(rmse_o) < np.mean(rmse_k)
