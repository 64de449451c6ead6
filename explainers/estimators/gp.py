"""Gaussian-process Shapley values: a Bayesian regression of the game on a Möbius kernel.

Prior [ours, after Rasmussen & Williams (2006), "Gaussian processes for machine learning", and
the Möbius (Harsanyi) dividends of Grabisch (1997)]: v(S) = sum over non-empty T within S of
a_T, the dividends a_T independent N(0, s^2 w_|T|), w_1 = 1 and w_k = gamma theta^(k-1) from
order 2 on. Then cov(v(S), v(U)) = s^2 sum_k w_k C(|S & U|, k), and, with phi_i = sum over T
containing i of a_T / |T|, cov(phi_i, v(S)) = [i in S] s^2 sum_k w_k C(|S|, k) / |S|: the
posterior mean and variance of every Shapley value are closed-form in the sampled coalitions
(every order of interaction, no feature selection). theta, gamma and a nugget (the part of the
game the prior misses, relative to the kernel's diagonal) are chosen by marginal likelihood on
PILOT_ROWS rows; s^2 is its maximum-likelihood value on all rows, raised to the leave-one-out
estimate where that is larger, over m - n degrees of freedom, times Student's t over the
normal quantile (calibration: docs/benchmarks.md).

Coalitions: exactly KernelSHAP's plan (kernel.Planner: small sizes enumerated, the rest in
complement pairs, same seed, rounds and budget accounting); v(full) is fitted without nugget,
so the posterior mean is efficient. The posterior is well posed at any budget: where
KernelSHAP's regression is square (2n coalitions: n-1 pairs for n-1 free values) and amplifies
noise, this shrinks. error_std: the posterior standard deviation. Own time: one Cholesky
factorisation of the m x m kernel matrix (m coalitions), about 0.1 s at m = 2000 on one core;
beyond MAX_ROWS coalitions it is KernelSHAP on the same plan.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from scipy.linalg import solve_triangular
from scipy.stats import t as student_t

from explainers.estimators import kernel
from explainers.estimators.base import Estimate, Target
from explainers.estimators.kernel import Design, min_coalitions
from explainers.estimators.rounds import Round, drive
from explainers.games import GameRecorder

TAUS = (0.02, 0.2, 1.0, 2.0, 4.0, 8.0, 16.0)  # n times theta: variance ratio of order k+1 ...
GAMMAS = (0.25, 1.0, 4.0)  # ... to order k from 2 on; order 2 has gamma theta times order 1's
NUGGETS = (1e-6, 1e-4, 1e-3, 1e-2)  # unexplained variance, relative to the kernel's diagonal
PILOT_ROWS = 256  # rows of the marginal-likelihood choice of (theta, nugget)
MAX_ROWS = 2560  # at most this many coalitions in the fit (default budgets: 2n + 2048) ...
MAX_PLAYERS = 512  # ... and players (the prior's tables hold sums of C(n, k) in float64)

__all__ = ["MAX_PLAYERS", "MAX_ROWS", "gp", "min_coalitions", "rounds"]


def gp(
    recorder: GameRecorder,
    rng: np.random.Generator,
    sampler: str = "kernel",
    target: Target | None = None,
) -> Estimate:
    """Gaussian-process Shapley values, in rounds (rounds.py)."""
    return drive(rounds(recorder, rng, sampler), recorder, target)


def rounds(recorder: GameRecorder, rng: np.random.Generator, sampler: str) -> Iterator[Round]:
    """KernelSHAP's coalition plan and rounds (kernel.rounds) with the posterior as the fit."""
    return kernel.rounds(recorder, rng, sampler, fit=_fit, name="gp")


def _weights(n: int, theta: float, gamma: float) -> np.ndarray:
    """Prior variance of one dividend of each order k = 0..n: 0, 1, gamma theta^(k-1)."""
    k = np.arange(n + 1, dtype=np.float64)
    w = gamma * theta ** np.maximum(k - 1, 0)
    w[0], w[1] = 0.0, 1.0
    return w


def _binomials(n: int) -> np.ndarray:
    """C(t, k) for t, k = 0..n. [n+1, n+1]"""
    c = np.zeros((n + 1, n + 1))
    c[:, 0] = 1.0
    for t in range(1, n + 1):
        c[t, 1:] = c[t - 1, 1:] + c[t - 1, :-1]
    return c


def _tables(n: int, theta: float, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Per count t = 0..n: the prior covariance of v(S), v(U) with |S & U| = t, and of
    phi_i, v(S) with |S| = t, i in S; and the prior variance of one Shapley value."""
    w, c = _weights(n, theta, gamma), _binomials(n)
    cov = c @ w  # sum_k w_k C(t, k)
    cross = cov / np.maximum(np.arange(n + 1), 1)  # sum_k w_k C(t-1, k-1) / k
    k = np.arange(1, n + 1)
    var = float(np.sum(w[1:] * c[n - 1, k - 1] / k**2))
    return cov, cross, var


def _factor(k: np.ndarray, noise: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of k + diag(noise); None when not positive definite."""
    a = k.copy()
    a[np.diag_indices_from(a)] += noise
    try:
        return np.asarray(np.linalg.cholesky(a))  # steadier than scipy's under load
    except np.linalg.LinAlgError:
        return None


def _noise(m: int, nugget: float) -> np.ndarray:
    """The nugget on every row but the first (the full coalition, fitted exactly)."""
    noise = np.full(m, nugget)
    noise[0] = 0.0
    return noise


def _choose(t: np.ndarray, y: np.ndarray, n: int) -> tuple[float, float, float, np.ndarray]:
    """(theta, gamma, nugget) of the largest marginal likelihood (s^2 profiled out, shared by
    the outputs) on at most max(PILOT_ROWS, 2n) rows (the full coalition and a seeded spread of
    the rest): (theta, nugget) at gamma 1, then (gamma, nugget) at that theta. Also, there, the
    ratio of the leave-one-out estimate of s^2 to the likelihood's (at least 1; per output):
    where the prior is wrong, held-out errors are larger than it expects."""
    m, pilot = len(y), max(PILOT_ROWS, 2 * n)  # at least as many rows as main effects, twice
    if m > pilot:
        pick = np.random.default_rng(m).choice(np.arange(1, m), pilot - 1, replace=False)
        idx = np.concatenate([[0], np.sort(pick)])
        t, y = t[np.ix_(idx, idx)], y[idx]
        m = pilot
    best: tuple[float, tuple[float, float, float], np.ndarray, np.ndarray] | None = None

    def trial(theta: float, gamma: float) -> None:
        nonlocal best
        k = _tables(n, theta, gamma)[0][t]
        k /= max(float(k.diagonal().mean()), 1e-300)
        if not np.isfinite(k).all():
            return
        for nugget in NUGGETS:
            low = _factor(k, _noise(m, nugget))
            if low is None:
                continue
            a0 = solve_triangular(low, y, lower=True, check_finite=False)
            s2 = np.maximum((a0**2).mean(axis=0), 1e-300)
            nll = 0.5 * m * float(np.log(s2).sum()) + y.shape[1] * float(
                np.log(low.diagonal()).sum()
            )
            if best is None or nll < best[0]:
                best = (nll, (theta, gamma, nugget), low, s2)

    for tau in TAUS:
        trial(tau / n, 1.0)
    if best is not None:
        theta = best[1][0]
        for gamma in GAMMAS:
            if gamma != 1.0:
                trial(theta, gamma)
    if best is None:
        return 1.0 / n, 1.0, 1e-2, np.ones(y.shape[1])
    _, (theta, gamma, nugget), low, s2 = best
    inv = solve_triangular(low, np.eye(m), lower=True, check_finite=False)
    alpha = inv.T @ (inv @ y)
    s2_loo = (alpha**2 / np.maximum((inv**2).sum(axis=0), 1e-300)[:, None]).mean(axis=0)
    return theta, gamma, nugget, np.maximum(s2_loo / s2, 1.0)


def posterior(masks: np.ndarray, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the Shapley values. [n, k] each

    `masks` [m, n]: the non-empty coalitions, the full one first; `y` [m, k]: v(S) - v(empty).
    """
    n = masks.shape[1]
    z = masks.astype(np.float64)
    z32 = masks.astype(np.float32)  # counts up to n are exact in float32; its product is faster
    t = (z32 @ z32.T).astype(np.intp)  # players in common
    theta, gamma, nugget, inflate = _choose(t, y, n)
    cov, cross_of_size, prior_var = _tables(n, theta, gamma)
    k = cov[t]
    norm = max(float(k.diagonal().mean()), 1e-300)
    k /= norm
    low = None
    while low is None:
        low = _factor(k, _noise(len(y), nugget))
        nugget *= 10
    a0 = solve_triangular(low, y, lower=True, check_finite=False)  # [m, k]
    alpha = solve_triangular(low.T, a0, lower=False, check_finite=False)
    size = z.sum(axis=1)
    cross = z * (cross_of_size[size.astype(np.intp)] / norm)[:, None]  # cov(v(S), phi)
    phi = cross.T @ alpha
    phi += (total - phi.sum(axis=0)) / n  # rounding only: v(full) is fitted exactly
    v = solve_triangular(low, cross, lower=True, check_finite=False)  # [m, n]
    var = np.maximum(prior_var / norm - (v**2).sum(axis=0), 0.0)
    # [k] the likelihood's scale, held-out calibrated, over m - n degrees of freedom (as a
    # residual variance over m - p: at 2n coalitions the n main effects take half of them),
    # and Student's t 97.5% quantile over the normal's for that many
    dof = max(len(y) - n, 1)
    s2 = (a0**2).mean(axis=0) * inflate * len(y) / dof * (student_t.ppf(0.975, dof) / 1.96) ** 2
    return phi, np.sqrt(var[:, None] * s2[None, :])


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The posterior on every evaluated coalition but the empty one (store row 0; the full
    one is store row 1); KernelSHAP when exact or beyond MAX_ROWS or MAX_PLAYERS."""
    if plan.exact or len(plan.masks) - 1 > MAX_ROWS or plan.masks.shape[1] > MAX_PLAYERS:
        return kernel._blas_limited_fit(plan, y, total)
    with kernel._blas().limit(limits=1, user_api="blas"):
        return posterior(plan.masks[1:], y[1:], total)
