"""Gaussian-process Shapley values: a Bayesian regression of the game on a Möbius kernel.

Prior [ours, after Rasmussen & Williams (2006), "Gaussian processes for machine learning", and
the Möbius (Harsanyi) dividends of Grabisch (1997)]: v(S) = sum over non-empty T within S of
a_T, the dividends a_T independent N(0, s^2 theta^|T|). Then cov(v(S), v(U)) =
s^2 ((1 + theta)^|S & U| - 1), and, with phi_i = sum over T containing i of a_T / |T|,
cov(phi_i, v(S)) = [i in S] s^2 ((1 + theta)^|S| - 1) / |S|: the posterior mean and variance of
every Shapley value are closed-form in the sampled coalitions (every order of interaction, no
feature selection). theta (interaction strength per order) and a nugget (the part of the game
the prior misses, relative to the kernel's diagonal) are chosen by marginal likelihood on a
subset of the rows; s^2 is its maximum-likelihood value on all rows.

Coalitions: exactly KernelSHAP's plan (kernel.Planner: small sizes enumerated, the rest in
complement pairs, same seed, rounds and budget accounting); v(full) is fitted without nugget,
so the posterior mean is efficient. The posterior is well posed at any budget: where
KernelSHAP's regression is square (2n coalitions: n-1 pairs for n-1 free values) and amplifies
noise, this shrinks. error_std: the posterior standard deviation. Beyond MAX_ROWS coalitions
(the fit is cubic in them) it is KernelSHAP on the same plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import comb

import numpy as np
from scipy.linalg import solve_triangular
from scipy.stats import t as student_t

from explainers.estimators import kernel
from explainers.estimators.base import Estimate, Target
from explainers.estimators.kernel import Design, min_coalitions
from explainers.estimators.rounds import Round, drive
from explainers.games import GameRecorder

THETAS = (0.01, 0.03, 0.1, 0.2, 0.4, 1.0)  # prior variance ratio of order k+1 to order k
NUGGETS = (1e-6, 1e-4, 1e-3, 1e-2)  # unexplained variance, relative to the kernel's diagonal
PILOT_ROWS = 256  # rows of the marginal-likelihood choice of (theta, nugget)
MAX_ROWS = 2560  # at most this many coalitions in the fit (default budgets: 2n + 2048)

__all__ = ["MAX_ROWS", "gp", "min_coalitions", "rounds"]


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


def _kernel(t: np.ndarray, theta: float) -> np.ndarray:
    """(1 + theta)^t - 1: the prior covariance at t players in common (s^2 = 1)."""
    return np.asarray(np.expm1(np.log1p(theta) * t))


def _factor(k: np.ndarray, noise: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of k + diag(noise); None when not positive definite."""
    try:
        return np.asarray(np.linalg.cholesky(k + np.diag(noise)))
    except np.linalg.LinAlgError:
        return None


def _noise(m: int, nugget: float) -> np.ndarray:
    """The nugget on every row but the first (the full coalition, fitted exactly)."""
    noise = np.full(m, nugget)
    noise[0] = 0.0
    return noise


def _choose(t: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(theta, nugget) of the largest marginal likelihood (s^2 profiled out, shared by the
    outputs) on at most PILOT_ROWS rows (the full coalition and a seeded spread of the rest),
    and there the ratio of the leave-one-out estimate of s^2 to the likelihood's (at least 1;
    per output): where the prior is wrong, held-out errors are larger than it expects."""
    m = len(y)
    if m > PILOT_ROWS:
        pick = np.random.default_rng(m).choice(np.arange(1, m), PILOT_ROWS - 1, replace=False)
        idx = np.concatenate([[0], np.sort(pick)])
        t, y = t[np.ix_(idx, idx)], y[idx]
        m = PILOT_ROWS
    best: tuple[float, float, float, np.ndarray, np.ndarray] | None = None
    for theta in THETAS:
        k = _kernel(t, theta)
        k /= max(float(k.diagonal().mean()), 1e-300)
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
                best = (nll, theta, nugget, low, s2)
    if best is None:
        return 0.1, 1e-2, np.ones(y.shape[1])
    _, theta, nugget, low, s2 = best
    inv = solve_triangular(low, np.eye(m), lower=True, check_finite=False)
    alpha = inv.T @ (inv @ y)
    s2_loo = (alpha**2 / np.maximum((inv**2).sum(axis=0), 1e-300)[:, None]).mean(axis=0)
    return theta, nugget, np.maximum(s2_loo / s2, 1.0)


def _prior_variance(n: int, theta: float) -> float:
    """Prior variance of one Shapley value: sum over k of C(n-1, k-1) theta^k / k^2."""
    return float(sum(comb(n - 1, k - 1) * theta**k / k**2 for k in range(1, n + 1)))


def posterior(masks: np.ndarray, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the Shapley values. [n, k] each

    `masks` [m, n]: the non-empty coalitions, the full one first; `y` [m, k]: v(S) - v(empty).
    """
    n = masks.shape[1]
    z = masks.astype(np.float64)
    t = z @ z.T
    theta, nugget, inflate = _choose(t, y)
    k = _kernel(t, theta)
    norm = max(float(k.diagonal().mean()), 1e-300)
    k /= norm
    low = None
    while low is None:
        low = _factor(k, _noise(len(y), nugget))
        nugget *= 10
    a0 = solve_triangular(low, y, lower=True, check_finite=False)  # [m, k]
    alpha = solve_triangular(low.T, a0, lower=False, check_finite=False)
    size = z.sum(axis=1)
    cross = z * (_kernel(size, theta) / np.maximum(size, 1) / norm)[:, None]  # cov(v(S), phi)
    phi = cross.T @ alpha
    phi += (total - phi.sum(axis=0)) / n  # rounding only: v(full) is fitted exactly
    v = solve_triangular(low, cross, lower=True, check_finite=False)  # [m, n]
    var = np.maximum(_prior_variance(n, theta) / norm - (v**2).sum(axis=0), 0.0)
    # [k] the likelihood's scale, held-out calibrated, over m - n degrees of freedom (as a
    # residual variance over m - p: at 2n coalitions the n main effects take half of them),
    # and Student's t 97.5% quantile over the normal's for that many
    dof = max(len(y) - n, 1)
    s2 = (a0**2).mean(axis=0) * inflate * len(y) / dof * (student_t.ppf(0.975, dof) / 1.96) ** 2
    return phi, np.sqrt(var[:, None] * s2[None, :])


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The posterior on every evaluated coalition but the empty one (store row 0; the full
    one is store row 1); KernelSHAP when exact or beyond MAX_ROWS."""
    if plan.exact or len(plan.masks) - 1 > MAX_ROWS:
        return kernel._blas_limited_fit(plan, y, total)
    with kernel._blas().limit(limits=1, user_api="blas"):
        return posterior(plan.masks[1:], y[1:], total)
