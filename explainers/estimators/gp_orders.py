"""Gaussian-process Shapley values with learned interaction-order weights (gp.py's sibling).

Prior [after Duvenaud, Nickisch & Rasmussen (2011), "Additive Gaussian processes", their
order weights on elementary symmetric polynomials, on the Möbius (Harsanyi) dividends of
Grabisch (1997)]: v(S) = sum over non-empty T within S of a_T, the dividends independent
normal with variance s^2 w_{|T|} prod_{j in T} q_j, w_k = c_k [k <= ORDERS] + theta^(k - 1):
free weights for orders 1..ORDERS on top of a geometric law over every order (the kernel stays
full-rank and no subtraction cancels). With e_k the elementary symmetric polynomials of q,
cov(v(S), v(U)) = s^2 [sum_k c_k e_k(S & U) + (prod_{S & U}(1 + theta q) - 1) / theta],
cov(phi_i, v(S)) = s^2 q_i [sum_k (c_k / k) e_{k-1}(S - i) + int_0^1 prod_{S - i}(1 + x theta q)
dx] for i in S (phi_i = sum over T containing i of a_T / |T|), and
var(phi_i) = s^2 q_i [sum_k (c_k / k^2) e_{k-1}(N - i) + the double integral] (gp.Prior with
gamma 1 for the geometric part). e_k on every intersection from the power sums (Newton's
identities, one matrix product per order). q is gp.py's relevance power law; c, theta and
the nugget maximise the marginal likelihood on PILOT_ROWS rows (L-BFGS-B with its gradient,
from gp's own choice and a few restarts). The posterior mean is efficient (v(full) fitted
without nugget); error_std and the misfit check against KernelSHAP and the regression
adjustment are gp.py's.

Own time: gp's choice, a few dozen factorisations of the pilot rows, ORDERS matrix products
and one Cholesky factorisation of the m x m kernel matrix: 0.05-2 s, about 10x gp's.
bench/gp_orders_bench.py (RMSE over the best of shap / shapiq KernelSHAP, 2n..64n): about gp's
(tanh16 0.29/0.85/0.65/0.67/0.51/0.37, gp 0.29/1.03/0.69/0.68/0.50/0.42; digits2 32n-64n
0.55/0.49 against 0.65/0.63; digits1 8n-32n worse, 0.81-0.88 against 0.74-0.81).
"""

from __future__ import annotations

import numpy as np

from explainers.estimators import gp, kernel
from explainers.estimators.base import Estimate
from explainers.estimators.kernel import Design

ORDERS = 5  # interaction orders with a free weight (the rest: the geometric law)
SHARE_BOUNDS = (1e-8, 1e4)  # c_k times e_k(N) / e_1(N): order k's share of var v(N)
TAU_BOUNDS = (0.01, 32.0)  # n times theta
NUGGET_BOUNDS = (1e-7, 1e-1)  # relative to the mean diagonal of the initial kernel
RESTARTS = ((), (1.0,), (1.0, 0.5, 0.25, 0.125, 0.0625))  # initial shares (after gp's)
BLOCK = 512  # rows per block of the intersection polynomials
CHECK = True  # gp.py's misfit check from CHECK_FROM * n coalitions
PILOT_ROWS = 256  # rows (at least 2n) of the order weights' likelihood (512: 2x own time, no gain)

__all__ = ["ORDERS", "Estimate", "OrderPrior", "gp_orders", "intersections", "rounds"]


def _row_elementary(z: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """e_0..e_k of q over each row's coalition (gp_interactions._elementary, truncated)."""
    e = np.zeros((z.shape[0], k + 1))
    e[:, 0] = 1.0
    for i in range(z.shape[1]):
        e[:, 1:] += (z[:, i : i + 1] * q[i]) * e[:, :-1]
    return e


def _without(e: np.ndarray, q: np.ndarray) -> np.ndarray:
    """e_0..e_{k-1} over each row's coalition less player i, for i in it. [k, m, n]"""
    out = np.empty((e.shape[1] - 1, e.shape[0], len(q)))
    out[0] = 1.0
    for j in range(1, len(out)):  # (1 + q_i x) f = e: f_j = e_j - q_i f_{j-1}
        out[j] = e[:, j : j + 1] - q * out[j - 1]
    return out


def intersections(z1: np.ndarray, z2: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """e_1..e_k of q over every intersection of a row of z1 with one of z2 (Newton's
    identities from the power sums). [k, m1, m2]"""
    p = [(z1 * q**r) @ z2.T for r in range(1, k + 1)]
    e = [np.ones_like(p[0])]
    for j in range(1, k + 1):
        acc = np.zeros_like(p[0])
        for i in range(1, j + 1):
            acc += (-1) ** (i - 1) * e[j - i] * p[i - 1]
        e.append(acc / j)
    return np.stack(e[1:])


class OrderPrior:
    """Order weights c (orders 1..len(c)) on top of gp.Prior's geometric law (gamma 1)."""

    def __init__(self, q: np.ndarray, c: np.ndarray, theta: float) -> None:
        self.q, self.c, self.theta = q, c, theta
        self.geometric = gp.Prior(q, theta, 1.0)

    def cov(self, z: np.ndarray) -> np.ndarray:
        """cov(v(S), v(U)) for the rows of z. [m, m]"""
        k = self.geometric.cov(z)
        for lo in range(0, len(z), BLOCK):
            e = intersections(z[lo : lo + BLOCK], z, self.q, len(self.c))
            k[lo : lo + BLOCK] += np.tensordot(self.c, e, axes=1)
        return k

    def cross(self, z: np.ndarray) -> np.ndarray:
        """cov(phi_i, v(S)) for the rows of z. [m, n]"""
        f = _without(_row_elementary(z, self.q, len(self.c)), self.q)  # [K, m, n]
        w = self.c / np.arange(1, len(self.c) + 1)
        return np.asarray(self.geometric.cross(z) + z * self.q * np.tensordot(w, f, axes=1))

    def variance(self) -> np.ndarray:
        """Prior variance of each Shapley value. [n]"""
        full = np.ones((1, len(self.q)))
        f = _without(_row_elementary(full, self.q, len(self.c)), self.q)[:, 0]  # [K, n]
        w = self.c / np.arange(1, len(self.c) + 1) ** 2
        return np.asarray(self.geometric.variance() + self.q * (w @ f))


def _nll(
    x: np.ndarray,
    terms: np.ndarray,
    scale: np.ndarray,
    z: np.ndarray,
    q: np.ndarray,
    y: np.ndarray,
    noise: np.ndarray,
) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood (s^2 profiled per output) and its gradient in
    x = (log shares, log theta, log nugget). `terms` [K, m, m], `scale` [K]: c_k / share_k."""
    from scipy.linalg import cho_solve

    kk = len(scale)
    c, theta, nugget = np.exp(x[:kk]) * scale, float(np.exp(x[kk])), float(np.exp(x[kk + 1]))
    log1p = np.log1p(theta * q)
    a = (z * log1p) @ z.T
    ea = np.exp(a)
    geo = (ea - 1.0) / theta
    k = geo + np.tensordot(c, terms, axes=1)
    low = gp._factor(k, nugget * noise)
    if low is None:
        return 1e30, np.zeros_like(x)
    m, outs = y.shape
    alpha = cho_solve((low, True), y, check_finite=False)
    s2 = np.maximum((y * alpha).sum(axis=0) / m, 1e-300)
    nll = 0.5 * m * float(np.log(s2).sum()) + outs * float(np.log(low.diagonal()).sum())
    inv = cho_solve((low, True), np.eye(m), check_finite=False)
    w = outs * inv - (alpha / s2) @ alpha.T  # d nll = tr(w dK) / 2
    grad = np.empty_like(x)
    grad[:kk] = 0.5 * c * np.tensordot(terms, w, axes=([1, 2], [0, 1]))
    dgeo = ea * ((z * (q / (1.0 + theta * q))) @ z.T) - geo  # d geo / d log theta
    grad[kk] = 0.5 * float((w * dgeo).sum())
    grad[kk + 1] = 0.5 * nugget * float((w.diagonal() * noise).sum())
    return nll, grad


def _choose(z: np.ndarray, y: np.ndarray) -> tuple[OrderPrior, float, np.ndarray]:
    """The order prior and (absolute) nugget of the largest marginal likelihood on PILOT_ROWS
    rows, from gp's choice (its q, theta, gamma as order weights) and RESTARTS; also gp's
    leave-one-out inflation of s^2 there (per output)."""
    from scipy.optimize import minimize

    start, nugget0, inflate = gp._choose(z, y)
    (m, n), pilot = z.shape, max(PILOT_ROWS, 2 * z.shape[1])
    if m > pilot:  # a seeded spread of the rows, the full coalition first (as gp's)
        pick = np.random.default_rng(m).choice(np.arange(1, m), pilot - 1, replace=False)
        idx = np.concatenate([[0], np.sort(pick)])
        z, y, m = z[idx], y[idx], pilot
    q, theta0, gamma = start.q, start.theta, start.gamma
    kk = min(ORDERS, n)
    full = _row_elementary(np.ones((1, n)), q, kk)[0, 1:]  # e_k(N)
    scale = full[0] / full  # c_k per unit share
    terms = intersections(z, z, q, kk)
    noise = gp._noise(m, 1.0)
    diag = float(np.mean(gp.Prior(q, theta0, 1.0).cov(z).diagonal())) / gamma
    bounds = (
        [tuple(np.log(SHARE_BOUNDS))] * kk
        + [tuple(np.log(np.array(TAU_BOUNDS) / n))]
        + [tuple(np.log(np.array(NUGGET_BOUNDS) * diag))]
    )
    # gp's prior over gamma: order 1 weight 1 / gamma, order k >= 2 theta^(k-1)
    first = max(1.0 / gamma - 1.0, SHARE_BOUNDS[0])
    starts = [(first,)] + [tuple(s) for s in RESTARTS]
    best: tuple[float, np.ndarray] | None = None
    for shares in starts:
        s = np.full(kk, 1e-4)
        s[: min(len(shares), kk)] = shares[:kk]
        x0 = np.concatenate([np.log(s), [np.log(theta0), np.log(nugget0 * diag)]])
        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(
            _nll,
            x0,
            args=(terms, scale, z, q, y, noise),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"maxiter": 60},
        )
        if best is None or res.fun < best[0]:
            best = (float(res.fun), np.asarray(res.x))
    assert best is not None
    x = best[1]
    prior = OrderPrior(q, np.exp(x[:kk]) * scale, float(np.exp(x[kk])))
    return prior, float(np.exp(x[kk + 1])), inflate


def _posterior(
    masks: np.ndarray, y: np.ndarray, total: np.ndarray, half: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
    """gp._posterior on the order prior: mean, sd, cross, Cholesky factor, nugget, alpha."""
    n = masks.shape[1]
    z = masks.astype(np.float64)
    prior, nugget, inflate = _choose(z, y)
    k = prior.cov(z)
    cross = prior.cross(z)
    low, used, a0, alpha = gp._solved(k, y, nugget)
    phi = cross.T @ alpha
    phi += (total - phi.sum(axis=0)) / n  # rounding only: v(full) is exact
    v = gp._solve_triangular(low, cross, lower=True, check_finite=False)
    var = np.maximum(prior.variance() - (v**2).sum(axis=0), 1e-300)
    m = len(y)
    dof = max(m - n, 1)
    s2 = (a0**2).mean(axis=0) * inflate * m / dof * (gp._t975(dof) / 1.96) ** 2
    if half is not None and min((half == 0).sum(), (half == 1).sum()) >= n:
        phis = [
            gp._mean(k[np.ix_(rows, rows)], cross[rows], y[rows], total, used, whiten=False)[0]
            for rows in (np.flatnonzero(half != 1), np.flatnonzero(half != 0))
        ]
        spread = ((phis[0] - phis[1]) ** 2).mean(axis=0) / 4
        s2 = np.maximum(s2, spread / var.mean())
    return phi, np.sqrt(var[:, None] * s2[None, :]), cross, low, used, alpha


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """gp._fit with the order prior: the posterior on every evaluated coalition but the
    empty one, checked from gp.CHECK_FROM * n coalitions against the lower-error of
    KernelSHAP and the regression adjustment; KernelSHAP when exact or too large."""
    n = plan.masks.shape[1]
    if plan.exact or len(plan.masks) - 1 > gp.MAX_ROWS or n > gp.MAX_PLAYERS:
        return kernel._blas_limited_fit(plan, y, total)
    half = np.full(len(plan.masks), -1)
    pairs = plan.draws.reshape(-1, 2)
    half[pairs] = (np.arange(len(pairs)) % 2)[:, None]
    with gp._blas().limit(limits=1, user_api="blas"):
        phi, std, cross, low, nugget, alpha = _posterior(plan.masks[1:], y[1:], total, half[1:])
        if not CHECK or len(plan.masks) < gp.CHECK_FROM * n:
            return phi, std
        phi_k, std_k = kernel._fit(plan, y, total)
        assert std_k is not None  # sampled, not exact
        refs = [(phi_k, std_k)]
        adjusted = gp._adjust(plan, y, cross, low, nugget, alpha)
        if adjusted is not None:
            refs.append(adjusted)
    err = np.stack([(e**2).mean(axis=0) for _, e in refs])  # [refs, k]
    pick = np.argmin(err, axis=0)
    cols = np.arange(phi.shape[1])
    phi_r = np.stack([p for p, _ in refs])[pick, :, cols].T
    std_r = np.stack([e for _, e in refs])[pick, :, cols].T
    misfit = ((phi - phi_r) ** 2).mean(axis=0) > gp.BEST_MISFIT * (std_r**2).mean(axis=0)
    phi[:, misfit], std[:, misfit] = phi_r[:, misfit], std_r[:, misfit]
    return phi, std


# Gaussian-process Shapley values with learned order weights, in rounds (rounds.py).
gp_orders = kernel.OnPlan(_fit, "gp-orders")
rounds = gp_orders.rounds
