"""Gaussian-process Shapley values: a Bayesian regression of the game on a Möbius kernel.

The prior and its choice: gp_prior.py [ours, after Rasmussen & Williams (2006) and Grabisch
(1997)]. s^2 is the likelihood's on all rows, raised to the leave-one-out estimate where larger,
over m - n degrees of freedom, times Student's t over the normal quantile, and raised again
where two fits on complementary halves of the drawn pairs differ by more than it allows (the
prior's own variance can be wrong; calibration: docs/benchmarks.md).
What neither sees is the prior's misfit, a bias (on sentiment-minilm words the likelihood takes
the largest nugget and smooths over word interactions). Two consistent estimators on the same
rows see it: KernelSHAP, and the regression adjustment of Witter et al. (2025), "Regression-
adjusted Monte Carlo estimators for Shapley values and probabilistic values", with the
posterior mean as surrogate, cross-fitted over FOLDS folds of the drawn pairs (`_adjust`; its
error is the residual regression's jackknife). From CHECK_FROM * n coalitions, an output whose
posterior mean differs from the one of the two with the smaller jackknife error by more than
MISFIT times that error's variance (means over players) answers that one's values and error
(measured with the rule's alternatives at commit a1c3eee, bench/gp_variants_bench.py there:
adjusting every output is worse below 64n; on sentiment words the adjustment takes gp from
1.07-1.09x the best peer to 0.58-0.67x at 32n-64n).

Coalitions: exactly KernelSHAP's plan (kernel.Planner: small sizes enumerated, the rest in
complement pairs, same seed, rounds and budget accounting); v(full) is fitted without nugget,
so the posterior mean is efficient. The posterior is well posed at any budget: where
KernelSHAP's regression is square (2n coalitions: n-1 pairs for n-1 free values) and amplifies
noise, this shrinks. Own time: a Cholesky factorisation of the m x m kernel matrix (m
coalitions, its upper triangle), two of half its size and, from CHECK_FROM * n, the triangular
inverse of the first (the diagonal blocks of P that every fold of the adjustment needs), and
the prior's choice on at most 256 rows (336 grid points screened by successive halving,
gp_prior.SCREEN): 0.04-0.05 s at m = 512, 0.07-0.08 s at 1024 and 0.27 s at 2048, CPU seconds
of one thread on a shared core (bench/gp_speed_bench.py; issue 30: 2.1-3.0x less than the full
grid at 512-1024, 1.3x at 2048, where the m x m factorisation, the inverse and the folds'
products are what is left); beyond MAX_ROWS coalitions or MAX_PLAYERS players it is KernelSHAP
on the same plan.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators import kernel
from explainers.estimators.base import uncalibrated_below
from explainers.estimators.gp_prior import (
    Prior,
    _blas,
    _choose,
    _kernel,
    _solve_triangular,
    _solved,
    _t975,
)
from explainers.estimators.kernel import Design, min_coalitions
from explainers.explanation import Caveat

MAX_ROWS = 2560  # at most this many coalitions in the fit (default budgets: 2n + 2048) ...
MAX_PLAYERS = 512  # ... and players
CHECK_FROM = 4  # from this many coalitions per player, the check against a reference ...
MISFIT = 1.0  # ... answers it where the mean squared gap exceeds this times its variance
FOLDS = 8  # cross-fitting folds of the drawn pairs in the regression adjustment ...
REFERENCE_FLOOR = 1e-6  # a reference's error_std is at least this times max |v(S) - v(empty)|
MIN_FOLD_PAIRS = 8  # ... fewer when a fold would hold fewer distinct pairs than this

CALIBRATED_FROM = 32  # coalitions per player; fewer: the error bar is not calibrated (issue 28)

__all__ = ["MAX_PLAYERS", "MAX_ROWS", "Prior", "gp", "min_coalitions", "posterior", "rounds"]


def halves(plan: Design) -> np.ndarray:
    """0 or 1 for the store rows of drawn pairs (draws alternate: i.i.d. halves), -1 for the
    others (in both halves). [store rows]"""
    half = np.full(len(plan.masks), -1)
    pairs = plan.draws.reshape(-1, 2)
    half[pairs] = (np.arange(len(pairs)) % 2)[:, None]
    return half


def held_out(
    plan: Design, low: np.ndarray, alpha: np.ndarray, overwrite: bool = False
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray] | None:
    """Block leave-out over folds of the distinct drawn pairs, every fold from one
    factorisation [ours, after Rasmussen & Williams (2006), sec. 5.4.2]: with
    P = (K + noise)^-1 = L^-T L^-1 (`low`: L, the Cholesky factor of the fit on store rows 1
    on, its upper triangle zero) and a fold's rows B, r_B = P_BB^-1 alpha_B is y_B - m_B(B) and
    the fit without B has alpha_B' = alpha - P[:, B] r_B (`times_p`). Only P's diagonal
    blocks are formed, P_BB = (L^-1)[:, B]^T (L^-1)[:, B]: one triangular inverse (m^3 / 3)
    and a product per fold, not P itself (2 m^3 / 3). Returns L^-1 (in low's memory where
    `overwrite`), each fold's rows (fit rows) and r on every fold's rows [m, k]; None with
    fewer than 2 folds of MIN_FOLD_PAIRS pairs."""
    from scipy.linalg import cho_factor, cho_solve
    from scipy.linalg.lapack import dtrtri

    firsts = np.unique(plan.draws.reshape(-1, 2)[:, 0])  # one store row per distinct pair
    folds = min(FOLDS, len(firsts) // MIN_FOLD_PAIRS)
    if folds < 2:
        return None
    fold = np.arange(len(firsts)) % folds  # store order: the order of first draw
    inv, info = dtrtri(low, lower=1, overwrite_c=int(overwrite))  # L^-1, lower triangular
    if info != 0:
        return None
    rows, held_r = [], np.zeros_like(alpha)
    for f in range(folds):
        held = np.sort(np.concatenate([firsts[fold == f], firsts[fold == f] + 1]) - 1)
        cols = inv[held[0] :, held]  # rows above the fold's first are zero
        factor = cho_factor(cols.T @ cols, lower=True, overwrite_a=True, check_finite=False)
        held_r[held] = cho_solve(factor, alpha[held], check_finite=False)
        rows.append(held)
    return np.asarray(inv), rows, held_r


def times_p(inv: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P x = L^-T (L^-1 x) from `held_out`'s L^-1: two triangular products. [m, k]"""
    from scipy.linalg.blas import dtrmm

    return np.asarray(dtrmm(1.0, inv, dtrmm(1.0, inv, x, lower=1), lower=1, trans_a=1))


def _mean(
    k: np.ndarray,
    cross: np.ndarray,
    y: np.ndarray,
    total: np.ndarray,
    nugget: float,
    whiten: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Posterior mean of the Shapley values, with what the variance needs: the whitened
    values and cross-covariances (no rows unless `whiten`). [n, k], [m, k], [m, n]

    `k` [m, m] and `cross` [m, n]: the prior's covariances, on one common scale.
    """
    low, _, a0, alpha = _solved(k, y, nugget)
    phi = cross.T @ alpha
    phi += (total - phi.sum(axis=0)) / cross.shape[1]  # rounding only: v(full) is exact
    if not whiten:
        return phi, a0, np.zeros((0, cross.shape[1]))
    return phi, a0, _solve_triangular(low, cross, lower=True, check_finite=False)


def posterior(
    masks: np.ndarray, y: np.ndarray, total: np.ndarray, half: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the Shapley values. [n, k] each

    `masks` [m, n]: the non-empty coalitions, the full one first; `y` [m, k]: v(S) - v(empty);
    `half` [m]: 0 or 1 for the rows of drawn pairs, -1 for the others (both halves).
    """
    return _posterior(masks, y, total, half)[:2]


def _posterior(
    masks: np.ndarray, y: np.ndarray, total: np.ndarray, half: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
    """`posterior`, with what the regression adjustment reuses: the cross-covariances, the
    Cholesky factor of the kernel matrix plus nugget (one common scale), that nugget and
    alpha = its inverse times y. [n, k], [n, k], [m, n], [m, m], -, [m, k]"""
    n = masks.shape[1]
    z = masks.astype(np.float64)
    prior, nugget, inflate = _choose(z, y)
    k, norm = _kernel(prior, z)  # the upper triangle
    cross = prior.cross(z) / norm  # cov(v(S), phi_i) [m, n]
    spread = None
    if half is not None and min((half == 0).sum(), (half == 1).sum()) >= n:
        # Two fits on complementary halves of the pairs differ by about twice the variance of
        # each, that is, four times the full fit's (variance ~ 1 / pairs): where they differ
        # more, the prior's own variance is too small. (Before k is factorised in place.)
        phis = [
            _mean(k[np.ix_(rows, rows)], cross[rows], y[rows], total, nugget, whiten=False)[0]
            for rows in (np.flatnonzero(half != 1), np.flatnonzero(half != 0))
        ]
        spread = ((phis[0] - phis[1]) ** 2).mean(axis=0) / 4  # [k]
    low, used, a0, alpha = _solved(k, y, nugget, rebuild=lambda: _kernel(prior, z)[0])
    phi = cross.T @ alpha
    phi += (total - phi.sum(axis=0)) / n  # rounding only: v(full) is exact
    v = _solve_triangular(low, cross, lower=True, check_finite=False)
    var = np.maximum(prior.variance() / norm - (v**2).sum(axis=0), 1e-300)  # [n]
    # [k] the likelihood's scale, held-out calibrated, over m - n degrees of freedom (as a
    # residual variance over m - p: at 2n coalitions the n main effects take half of them),
    # and Student's t 97.5% quantile over the normal's for that many
    m = len(y)
    dof = max(m - n, 1)
    s2 = (a0**2).mean(axis=0) * inflate * m / dof * (_t975(dof) / 1.96) ** 2
    if spread is not None:
        s2 = np.maximum(s2, spread / var.mean())
    return phi, np.sqrt(var[:, None] * s2[None, :]), cross, low, used, alpha


def _adjust(
    plan: Design,
    y: np.ndarray,
    cross: np.ndarray,
    low: np.ndarray,
    nugget: float,
    alpha: np.ndarray,
    overwrite: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Regression-adjusted Monte Carlo with the posterior mean as surrogate (Witter et al.
    2025, "Regression-adjusted Monte Carlo estimators for Shapley values and probabilistic
    values"), cross-fitted: for each fold B of the distinct drawn pairs (`held_out`), the
    posterior mean m_B fitted without B (enumerated rows always in), whose Shapley values are
    closed-form (cross^T alpha_B); B's pairs take the residual v - m_B, the other rows the
    residual of the mean surrogate (the nugget's share: v(full) is fitted exactly, so the
    residual's total is 0); KernelSHAP's constrained regression of the residual on the plan,
    with its delete-a-group jackknife error, is added to the mean of phi(m_B).
    `cross`, `low`, `nugget`, `alpha`: the posterior's, on its rows (store rows 1 on);
    `overwrite`: low's memory may take its inverse. None with too few pairs."""
    folds = held_out(plan, low, alpha, overwrite)
    if folds is None:
        return None
    inv, rows, held_r = folds
    rest = np.ones(len(alpha), dtype=bool)  # rows kept in every fold
    rest[0] = False  # the full coalition: fitted exactly, residual 0
    for held in rows:
        rest[held] = False
    resid = np.zeros_like(y)  # [store rows, k]
    resid[1:] = held_r  # y_B - m_B(B) on every fold's rows
    # sum over folds of P[:, B] r_B = P held_r (held_r is zero off the folds)
    shift = times_p(inv, held_r)
    mean_alpha = alpha - shift / len(rows)  # the mean of the folds' alphas (zero on their B)
    resid[1:][rest] = nugget * mean_alpha[rest]  # y - m_B = noise alpha_B, mean over folds
    phi = cross.T @ mean_alpha  # the mean of phi(m_B) = cross^T alpha_B
    phi_r, error = kernel._fit(plan, resid, resid[1] - resid[0])
    assert error is not None  # sampled
    phi += (y[1] - phi.sum(axis=0)) / phi.shape[0]  # rounding only: m_B(full) = v(full)
    return phi + phi_r, error


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The posterior on every evaluated coalition but the empty one (store row 0; the full
    one is store row 1); KernelSHAP when exact or beyond MAX_ROWS or MAX_PLAYERS."""
    if plan.exact or len(plan.masks) - 1 > MAX_ROWS or plan.masks.shape[1] > MAX_PLAYERS:
        return kernel._blas_limited_fit(plan, y, total)
    with _blas().limit(limits=1, user_api="blas"):
        post = _posterior(plan.masks[1:], y[1:], total, halves(plan)[1:])
        phi, std, cross, low, nugget, alpha = post
        if len(plan.masks) < CHECK_FROM * plan.masks.shape[1]:
            phi_k, _ = kernel._fit(plan, y, total)
            # A sample whose additive fit reproduces every draw supports no smaller error
            # (kernel.interpolation_floor): the posterior's own may be ~1e-7 there.
            return phi, np.maximum(std, kernel.interpolation_floor(plan, y, phi_k)[None, :])
        # The prior's misfit is a bias that neither the posterior variance nor the halves see.
        # KernelSHAP on the same rows is consistent, and so is the regression adjustment with
        # the posterior mean as surrogate (less noisy where the surrogate fits part of the
        # game): where the posterior differs from the reference of the smaller jackknife error
        # (per output) by more than that error allows, the prior misses part of the game; that
        # output gets the reference's answer and error.
        phi_k, std_k = kernel._fit(plan, y, total)
        assert std_k is not None  # sampled, not exact
        refs = [(phi_k, std_k)]
        adjusted = _adjust(plan, y, cross, low, nugget, alpha, overwrite=True)  # low's last use
        if adjusted is not None:
            refs.append(adjusted)
    err = np.stack([(e**2).mean(axis=0) for _, e in refs])  # [refs, k]
    pick = np.argmin(err, axis=0)
    cols = np.arange(phi.shape[1])
    phi_r = np.stack([p for p, _ in refs])[pick, :, cols].T
    std_r = np.stack([e for _, e in refs])[pick, :, cols].T
    # The reference's error is bounded away from zero (issue 28): kernel._fit floors an
    # interpolating design's jackknife, and no reference is trusted below REFERENCE_FLOOR of
    # the values' scale, so a collapsed error bar is never adopted nor divided by.
    scale = np.maximum(np.abs(y).max(axis=0), 1e-300)  # [k]
    std_r = np.maximum(std_r, REFERENCE_FLOOR * scale[None, :])
    gap2 = (phi - phi_r) ** 2  # [n, k]
    misfit = gap2.mean(axis=0) > MISFIT * (std_r**2).mean(axis=0)  # [k]
    # Where the posterior is kept, a gap to the consistent reference beyond the reference's
    # own noise is a bias the posterior's variance cannot see: it joins the error bar
    # (per player, the gap's excess over 4 reference variances, i.e. over 2 standard errors).
    std = np.sqrt(std**2 + np.maximum(gap2 - 4 * std_r**2, 0.0))
    std = np.maximum(std, kernel.interpolation_floor(plan, y, phi_k)[None, :])
    phi[:, misfit], std[:, misfit] = phi_r[:, misfit], std_r[:, misfit]
    return phi, std


def few_caveat(coalitions: int, players: int) -> Caveat | None:
    """A warning below CALIBRATED_FROM coalitions per player (bench/calibration_bench.py)."""
    evidence = "threshold games 0.80-0.88 of values were within 2 error_std there"
    return uncalibrated_below("gp", coalitions, players, CALIBRATED_FROM, evidence)


# Gaussian-process Shapley values, in rounds (rounds.py).
gp = kernel.OnPlan(_fit, "gp", few_caveat)
rounds = gp.rounds
