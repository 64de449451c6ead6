"""Gaussian-process Shapley values: a Bayesian regression of the game on a Möbius kernel.

Prior [ours, after Rasmussen & Williams (2006), "Gaussian processes for machine learning",
their automatic relevance determination, and the Möbius (Harsanyi) dividends of Grabisch
(1997)]: v(S) = sum over non-empty T within S of a_T, the dividends independent normal with
variance s^2 q_i for a player i alone and s^2 (gamma / theta) prod_{j in T} theta q_j for
|T| >= 2. The relevances q (mean 1) are |beta|^p of a ridge linear fit, floored at FLOOR of the
largest; p = 0 is the isotropic prior. Then, with u = theta q,
cov(v(S), v(U)) = s^2 [(1 - gamma) sum_{S & U} q + (gamma / theta)(prod_{S & U}(1 + u) - 1)],
and for phi_i = sum over T containing i of a_T / |T|, i in S,
cov(phi_i, v(S)) = s^2 [q_i + (gamma / theta) u_i (int_0^1 prod_{S - i}(1 + x u) dx - 1)]
(Gauss-Legendre, exact): the posterior mean and variance of every Shapley value are closed-form
in the sampled coalitions, every order of interaction at once. theta = tau / n, p, gamma and a
nugget (the part of the game the prior misses) are chosen by marginal likelihood on
max(PILOT_ROWS, 2n) rows (every combination of the grid on 3n to FULL_GRID_ROWS rows, else one
parameter at a time: the full grid took the 16-player tanh games from 1.03x to 0.88x the best
peer's RMSE at 4n, digits 2x2 from 0.84x, 0.65x, 0.63x to 0.79x, 0.52x, 0.47x at 4n, 32n, 64n,
for up to 0.1-0.15 s); s^2 is the likelihood's on
all rows, raised to the leave-one-out estimate where larger, over m - n degrees of freedom,
times Student's t over the normal quantile, and raised again where two fits on complementary
halves of the drawn pairs differ by more than it allows (the prior's own variance can be wrong;
calibration: docs/benchmarks.md).
What neither sees is the prior's misfit, a bias (on sentiment-minilm words the likelihood takes
the largest nugget and smooths over word interactions). Two consistent estimators on the same
rows see it: KernelSHAP, and the regression adjustment of Witter et al. (2025), "Regression-
adjusted Monte Carlo estimators for Shapley values and probabilistic values", with the
posterior mean as surrogate, cross-fitted over FOLDS folds of the drawn pairs (`_adjust`; its
error is the residual regression's jackknife). From CHECK_FROM * n coalitions, an output whose
posterior mean differs from the one of the two with the smaller jackknife error by more than
BEST_MISFIT times that error's variance (means over players) answers that one's values and error
(bench/gp_variants_bench.py: adjusting every output is worse below 64n; on sentiment words the
adjustment takes gp from 1.07-1.09x the best peer to 0.58-0.67x at 32n-64n).

Coalitions: exactly KernelSHAP's plan (kernel.Planner: small sizes enumerated, the rest in
complement pairs, same seed, rounds and budget accounting); v(full) is fitted without nugget,
so the posterior mean is efficient. The posterior is well posed at any budget: where
KernelSHAP's regression is square (2n coalitions: n-1 pairs for n-1 free values) and amplifies
noise, this shrinks. Own time: a Cholesky factorisation of the m x m kernel matrix (m
coalitions), two of half its size and, from CHECK_FROM * n, the inverse from the first (every
fold of the adjustment from it), about 0.14 s at m = 2048 on one core, 0.26 s with the
adjustment (bench/gp_variants_bench.py --own-time); beyond MAX_ROWS coalitions or MAX_PLAYERS
players it is KernelSHAP on the same plan.
"""

from __future__ import annotations

from functools import cache
from itertools import product

import numpy as np
from threadpoolctl import ThreadpoolController

from explainers.estimators import kernel
from explainers.estimators.kernel import Design, min_coalitions

TAUS = (0.02, 0.2, 1.0, 2.0, 4.0, 8.0, 16.0)  # n times theta (interaction strength per order)
POWERS = (0.0, 1.0, 2.0, 4.0)  # relevance q ~ |linear effect|^p (0: every player alike) ...
FLOOR = 0.05  # ... at least this share of the largest (an unseen effect keeps prior variance)
GAMMAS = (0.25, 1.0, 4.0)  # variance of order >= 2 relative to the geometric law from order 1
NUGGETS = (1e-6, 1e-4, 1e-3, 1e-2)  # unexplained variance, relative to the kernel's diagonal
PILOT_ROWS = 256  # rows (at least 2n) of the marginal-likelihood choice of the prior
FULL_GRID_ROWS = 256  # up to this many rows every combination of the grid, else one at a time
MAX_ROWS = 2560  # at most this many coalitions in the fit (default budgets: 2n + 2048) ...
MAX_PLAYERS = 512  # ... and players
CHECK_FROM = 4  # from this many coalitions per player, the check against a reference ...
MISFIT = 2.0  # ... answers it where the mean squared gap exceeds this times its variance ...
BEST_MISFIT = 1.0  # ... or this, against the lower-error of KernelSHAP and the adjustment
FOLDS = 8  # cross-fitting folds of the drawn pairs in the regression adjustment ...
MIN_FOLD_PAIRS = 8  # ... fewer when a fold would hold fewer distinct pairs than this
# The rule (bench/gp_variants_bench.py): best (the check against the lower-error reference);
# never (against KernelSHAP alone), flagged (KernelSHAP's check, the adjustment's answer),
# selfcheck (against the adjustment alone), always (the adjustment for every output).
ADJUST = "best"

__all__ = ["MAX_PLAYERS", "MAX_ROWS", "Prior", "gp", "min_coalitions", "posterior", "rounds"]


def _solve_triangular(a: np.ndarray, b: np.ndarray, **kw: bool) -> np.ndarray:
    """scipy's triangular solve, imported on first use (keeps the estimators' import light)."""
    from scipy.linalg import solve_triangular

    return np.asarray(solve_triangular(a, b, **kw))


@cache
def _blas() -> ThreadpoolController:
    """The loaded BLAS libraries, scanned once scipy.linalg is loaded: scipy's wheels bring an
    OpenBLAS of their own, which a scan before its import misses (kernel._blas: then the
    triangular solves run unlimited, several times slower on a busy machine)."""
    import scipy.linalg  # noqa: F401

    return ThreadpoolController()


def _invert_lower(low: np.ndarray) -> np.ndarray:
    """Inverse of a lower triangular matrix (LAPACK trtri)."""
    from scipy.linalg.lapack import dtrtri

    inv, info = dtrtri(low, lower=1)
    if info != 0:
        return _solve_triangular(low, np.eye(len(low)), lower=True, check_finite=False)
    return np.asarray(inv)


def _t975(dof: int | float) -> float:
    """Student's t 97.5% quantile (scipy imported on first use)."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


class Prior:
    """The dividend prior with relevances q (mean 1), theta and gamma (s^2 = 1)."""

    def __init__(self, q: np.ndarray, theta: float, gamma: float) -> None:
        self.q, self.theta, self.gamma = q, theta, gamma
        self.u = theta * q

    def cov(self, z: np.ndarray) -> np.ndarray:
        """cov(v(S), v(U)) for the rows of z (in place: m^2 temporaries are the cost). [m, m]"""
        k = (z * np.log1p(self.u)) @ z.T
        np.expm1(k, out=k)
        k *= self.gamma / self.theta
        if self.gamma != 1.0:
            k += (1 - self.gamma) * ((z * self.q) @ z.T)
        return np.asarray(k)

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """Gauss-Legendre nodes and weights on [0, 1], exact for degree n - 1 and 2n - 2."""
        x, w = np.polynomial.legendre.leggauss(len(self.q) // 2 + 2)
        return (x + 1) / 2, w / 2

    def cross(self, z: np.ndarray) -> np.ndarray:
        """cov(phi_i, v(S)) for the rows of z. [m, n]"""
        x, w = self._nodes()
        prod = np.exp(z @ np.log1p(np.outer(x, self.u)).T)  # [m, nodes] prod over S of 1 + x u
        integral = (prod * w) @ (1.0 / (1.0 + np.outer(x, self.u)))  # [m, n] without i
        return np.asarray(z * (self.q + self.gamma / self.theta * self.u * (integral - 1.0)))

    def variance(self) -> np.ndarray:
        """Prior variance of each Shapley value. [n]"""
        x, w = self._nodes()
        xy, wxy = np.outer(x, x).ravel(), np.outer(w, w).ravel()
        logs = np.log1p(np.outer(xy, self.u))  # [nodes^2, n]
        integral = (np.exp(logs.sum(axis=1, keepdims=True) - logs) * wxy[:, None]).sum(axis=0)
        return np.asarray(self.q + self.gamma / self.theta * self.u * (integral - 1.0))


def _factor(k: np.ndarray, noise: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of k + diag(noise); None when not positive definite."""
    from scipy.linalg.lapack import dpotrf

    a = k.copy()
    a[np.diag_indices_from(a)] += noise
    # LAPACK on the transpose (Fortran order, the same symmetric matrix), in place: half
    # numpy's time at 256 rows (its checks and copies), a third less at 2048.
    low, info = dpotrf(a.T, lower=1, clean=1, overwrite_a=1)
    return np.asarray(low) if info == 0 else None


def _noise(m: int, nugget: float) -> np.ndarray:
    """The nugget on every row but the first (the full coalition, fitted exactly)."""
    noise = np.full(m, nugget)
    noise[0] = 0.0
    return noise


def _relevance(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|linear effect| of each player relative to the largest (over outputs), by ridge. [n]"""
    n = z.shape[1]
    a = z.T @ z
    a[np.diag_indices(n)] += 1e-3 * np.trace(a) / n
    beta = np.abs(np.linalg.solve(a, z.T @ y))  # [n, k]
    return np.asarray((beta / np.maximum(beta.max(axis=0), 1e-300)).max(axis=1))


def _q(r: np.ndarray, p: float) -> np.ndarray:
    q = np.maximum(r**p, FLOOR)
    return np.asarray(q / q.mean())


def _choose(z: np.ndarray, y: np.ndarray) -> tuple[Prior, float, np.ndarray]:
    """The prior and nugget of the largest marginal likelihood (s^2 profiled out, shared by
    the outputs) on at most max(PILOT_ROWS, 2n) rows (the full coalition and a seeded spread of
    the rest): (tau, nugget) with every player alike and gamma 1, then p, then gamma. Also,
    there, the ratio of the leave-one-out estimate of s^2 to the likelihood's (at least 1; per
    output): where the prior is wrong, held-out errors are larger than it expects."""
    (m, n), pilot = z.shape, max(PILOT_ROWS, 2 * z.shape[1])
    if m > pilot:
        pick = np.random.default_rng(m).choice(np.arange(1, m), pilot - 1, replace=False)
        idx = np.concatenate([[0], np.sort(pick)])
        z, y, m = z[idx], y[idx], pilot
    r = _relevance(z, y)
    best: tuple[float, Prior, float, np.ndarray, np.ndarray] | None = None

    def trial(tau: float, p: float, gamma: float) -> None:
        nonlocal best
        prior = Prior(_q(r, p), tau / n, gamma)
        k = prior.cov(z)
        k /= max(float(k.diagonal().mean()), 1e-300)
        if not np.isfinite(k).all():
            return
        for nugget in NUGGETS:
            low = _factor(k, _noise(m, nugget))
            if low is None:
                continue
            a0 = _solve_triangular(low, y, lower=True, check_finite=False)
            s2 = np.maximum((a0**2).mean(axis=0), 1e-300)
            nll = 0.5 * m * float(np.log(s2).sum()) + y.shape[1] * float(
                np.log(low.diagonal()).sum()
            )
            if best is None or nll < best[0]:
                best = (nll, prior, nugget, low, s2)

    # Every combination where it is cheap and matters most; not on the near-square design
    # below 3n, where the likelihood is flat and the full grid over-fits it (breast-cancer-mlp
    # at 2n: 87% within 2 error_std against 91%).
    full = 3 * n <= m <= FULL_GRID_ROWS
    for tau, p, gamma in product(TAUS, POWERS, GAMMAS) if full else ((t, 0.0, 1.0) for t in TAUS):
        trial(tau, p, gamma)
    if best is None:
        return Prior(np.ones(n), 1.0 / n, 1.0), 1e-2, np.ones(y.shape[1])
    if not full:  # one parameter at a time from the isotropic prior's tau
        theta = best[1].theta
        for p in POWERS[1:]:
            trial(theta * n, p, 1.0)
        p = next(p for p in POWERS if np.allclose(best[1].q, _q(r, p)))
        for gamma in GAMMAS:
            if gamma != 1.0:
                trial(theta * n, p, gamma)
    _, prior, nugget, low, s2 = best
    inv = _invert_lower(low)  # L^-1: a third of a solve against the identity
    alpha = inv.T @ (inv @ y)
    s2_loo = (alpha**2 / np.maximum((inv**2).sum(axis=0), 1e-300)[:, None]).mean(axis=0)
    return prior, nugget, np.maximum(s2_loo / s2, 1.0)


def _solved(
    k: np.ndarray, y: np.ndarray, nugget: float
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Cholesky factor of k + the nugget (raised tenfold until positive definite), that
    nugget, the whitened values and alpha = (k + noise)^-1 y. [m, m], -, [m, k], [m, k]"""
    low = _factor(k, _noise(len(y), nugget))
    while low is None:
        nugget *= 10
        low = _factor(k, _noise(len(y), nugget))
    a0 = _solve_triangular(low, y, lower=True, check_finite=False)  # [m, k]
    return low, nugget, a0, _solve_triangular(low.T, a0, lower=False, check_finite=False)


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
    k = prior.cov(z)
    norm = max(float(k.diagonal().mean()), 1e-300)
    k /= norm
    cross = prior.cross(z) / norm  # cov(v(S), phi_i) [m, n]
    low, used, a0, alpha = _solved(k, y, nugget)
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
    if half is not None and min((half == 0).sum(), (half == 1).sum()) >= n:
        # Two fits on complementary halves of the pairs differ by about twice the variance of
        # each, that is, four times the full fit's (variance ~ 1 / pairs): where they differ
        # more, the prior's own variance is too small.
        phis = [
            _mean(k[np.ix_(rows, rows)], cross[rows], y[rows], total, nugget, whiten=False)[0]
            for rows in (np.flatnonzero(half != 1), np.flatnonzero(half != 0))
        ]
        spread = ((phis[0] - phis[1]) ** 2).mean(axis=0) / 4  # [k]
        s2 = np.maximum(s2, spread / var.mean())
    return phi, np.sqrt(var[:, None] * s2[None, :]), cross, low, used, alpha


def _adjust(
    plan: Design,
    y: np.ndarray,
    cross: np.ndarray,
    low: np.ndarray,
    nugget: float,
    alpha: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Regression-adjusted Monte Carlo with the posterior mean as surrogate (Witter et al.
    2025, "Regression-adjusted Monte Carlo estimators for Shapley values and probabilistic
    values"), cross-fitted: for each of FOLDS folds B of the distinct drawn pairs, the posterior
    mean m_B fitted without B (enumerated rows always in), whose Shapley values are closed-form
    (cross^T alpha_B); B's pairs take the residual v - m_B, the other rows the residual of the
    mean surrogate (the nugget's share: v(full) is fitted exactly, so the residual's total is
    0); KernelSHAP's constrained regression of the residual on the plan, with its
    delete-a-group jackknife error, is added to the mean of phi(m_B). Every fold from the one
    factorisation (block leave-out [ours, after Rasmussen & Williams (2006), sec. 5.4.2]: with
    P = (K + noise)^-1, r_B = P_BB^-1 alpha_B and alpha_B' = alpha - P[:, B] r_B).
    `cross`, `low`, `nugget`, `alpha`: the posterior's, on its rows (store rows 1 on). None
    with too few pairs."""
    from scipy.linalg import cho_factor, cho_solve
    from scipy.linalg.blas import dsymm
    from scipy.linalg.lapack import dpotri

    firsts = np.unique(plan.draws.reshape(-1, 2)[:, 0])  # one store row per distinct pair
    folds = min(FOLDS, len(firsts) // MIN_FOLD_PAIRS)
    if folds < 2:
        return None
    fold = np.arange(len(firsts)) % folds  # store order: the order of first draw
    inv, info = dpotri(low, lower=1)  # P in the lower triangle (the upper one is stale)
    if info != 0:
        return None
    resid = np.zeros_like(y)  # [store rows, k]
    held_r = np.zeros_like(alpha)  # r_B on every fold's rows B
    rest = np.ones(len(alpha), dtype=bool)  # rows kept in every fold
    rest[0] = False  # the full coalition: fitted exactly, residual 0
    for f in range(folds):
        held = np.sort(np.concatenate([firsts[fold == f], firsts[fold == f] + 1]) - 1)
        # sorted rows: the lower triangle of P_BB is P's (all that cho_factor reads)
        factor = cho_factor(inv[np.ix_(held, held)], lower=True, check_finite=False)
        held_r[held] = cho_solve(factor, alpha[held], check_finite=False)  # y_B - m_B(B)
        rest[held] = False
    resid[1:] = held_r
    # sum over folds of P[:, B] r_B, from the lower triangle (symmetric product)
    shift = dsymm(1.0, inv, held_r, lower=1)
    mean_alpha = alpha - shift / folds  # the mean of the folds' alphas (zero on their B)
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
    half = np.full(len(plan.masks), -1)
    pairs = plan.draws.reshape(-1, 2)
    half[pairs] = (np.arange(len(pairs)) % 2)[:, None]  # draws alternate: i.i.d. halves
    with _blas().limit(limits=1, user_api="blas"):
        phi, std, cross, low, nugget, alpha = _posterior(plan.masks[1:], y[1:], total, half[1:])
        if ADJUST == "always":
            adjusted = _adjust(plan, y, cross, low, nugget, alpha)
            return (phi, std) if adjusted is None else adjusted
        if len(plan.masks) < CHECK_FROM * plan.masks.shape[1]:
            return phi, std
        # The prior's misfit is a bias that neither the posterior variance nor the halves see.
        # KernelSHAP on the same rows is consistent, and so is the regression adjustment with
        # the posterior mean as surrogate (less noisy where the surrogate fits part of the
        # game): where the posterior differs from the reference by more than the reference's
        # own (jackknife) error allows, the prior misses part of the game; that output gets
        # the reference's answer and error.
        refs: list[tuple[np.ndarray, np.ndarray]] = []  # [k] KernelSHAP, the adjustment
        if ADJUST in ("never", "flagged", "best"):
            phi_k, std_k = kernel._fit(plan, y, total)
            assert std_k is not None  # sampled, not exact
            refs.append((phi_k, std_k))
        adjusted = None if ADJUST == "never" else _adjust(plan, y, cross, low, nugget, alpha)
        if adjusted is not None and ADJUST in ("selfcheck", "best"):
            refs.append(adjusted)
        if not refs:
            return phi, std
        # per output, the reference of the smaller jackknife error
        err = np.stack([(e**2).mean(axis=0) for _, e in refs])  # [refs, k]
        pick = np.argmin(err, axis=0)
        cols = np.arange(phi.shape[1])
        phi_r = np.stack([p for p, _ in refs])[pick, :, cols].T
        std_r = np.stack([e for _, e in refs])[pick, :, cols].T
        limit = BEST_MISFIT if ADJUST in ("selfcheck", "best") else MISFIT
        misfit = ((phi - phi_r) ** 2).mean(axis=0) > limit * (std_r**2).mean(axis=0)  # [k]
        if ADJUST == "flagged" and adjusted is not None:
            phi_r, std_r = adjusted
    phi[:, misfit], std[:, misfit] = phi_r[:, misfit], std_r[:, misfit]
    return phi, std


# Gaussian-process Shapley values, in rounds (rounds.py).
gp = kernel.OnPlan(_fit, "gp")
rounds = gp.rounds
