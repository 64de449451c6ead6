"""The Gaussian-process prior of gp.py and gp_interactions.py on a game's Möbius dividends, and
its choice by marginal likelihood.

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
peer's RMSE at 4n, digits 2x2 from 0.84x, 0.65x, 0.63x to 0.79x, 0.52x, 0.47x at 4n, 32n, 64n).
The full grid is searched by successive halving [Jamieson & Talwalkar (2016), "Non-stochastic
best arm identification and hyperparameter optimization"; the schedule, SCREEN, is ours]: every
point's likelihood on a nested seeded spread of 64 rows, the best 48 on 128, the best 12 on all
(issue 30: a quarter of the full grid's time at 256 pilot rows, the full grid's choice on most
pilots and the same error; bench/gp_screen_bench.py, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from itertools import product

import numpy as np
from threadpoolctl import ThreadpoolController

TAUS = (0.02, 0.2, 1.0, 2.0, 4.0, 8.0, 16.0)  # n times theta (interaction strength per order)
POWERS = (0.0, 1.0, 2.0, 4.0)  # relevance q ~ |linear effect|^p (0: every player alike) ...
FLOOR = 0.05  # ... at least this share of the largest (an unseen effect keeps prior variance)
GAMMAS = (0.25, 1.0, 4.0)  # variance of order >= 2 relative to the geometric law from order 1
NUGGETS = (1e-6, 1e-4, 1e-3, 1e-2)  # unexplained variance, relative to the kernel's diagonal
PILOT_ROWS = 256  # rows (at least 2n) of the marginal-likelihood choice of the prior
FULL_GRID_ROWS = 256  # up to this many rows every combination of the grid, else one at a time
# Successive halving of the full grid: (rows, kept) - every point is scored on that many rows
# (at least 3n; a seeded spread, nested), the `kept` best go on to the next level, and the last
# are scored on every row.
SCREEN: tuple[tuple[int, int], ...] = ((64, 48), (128, 12))
BLOCK = 256  # rows per block of an upper-triangle kernel matrix (Prior.cov)


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


def _products(z: np.ndarray, u: np.ndarray) -> np.ndarray:
    """prod over S & U of (1 + u) - 1 for the rows of z, one matrix product: exp(z diag(log(1
    + u)) z^T) - 1. [m, m]"""
    k = (z * np.log1p(u)) @ z.T
    np.expm1(k, out=k)
    return np.asarray(k)


def _t975(dof: int | float) -> float:
    """Student's t 97.5% quantile (scipy imported on first use)."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


class Prior:
    """The dividend prior with relevances q (mean 1), theta and gamma (s^2 = 1)."""

    def __init__(self, q: np.ndarray, theta: float, gamma: float) -> None:
        self.q, self.theta, self.gamma = q, theta, gamma
        self.u = theta * q

    def cov(self, z: np.ndarray, upper: bool = False) -> np.ndarray:
        """cov(v(S), v(U)) for the rows of z (in place: m^2 temporaries are the cost). [m, m]

        `upper`: only the upper triangle (U after S; zeros below the diagonal blocks of BLOCK
        rows), half the products and exponentials, all that the Cholesky factorisation of
        `_factor` and the principal blocks taken from it in sorted order read."""
        if not upper:
            products = _products(z, self.u)
            return self._cov(products, lambda: (z * self.q) @ z.T, out=products)
        m = len(z)
        k = np.zeros((m, m))
        logs, weighted = z * np.log1p(self.u), z * self.q  # _products' and the additive part's
        space = np.empty((2, min(BLOCK, m) * m))  # two blocks' buffers: fresh pages cost
        for start in range(0, m, BLOCK):
            rows, after = slice(start, start + BLOCK), z[start:].T
            shape = (len(logs[rows]), m - start)
            block, scratch = (b[: shape[0] * shape[1]].reshape(shape) for b in space)
            np.matmul(logs[rows], after, out=block)
            np.expm1(block, out=block)
            additive = partial(np.matmul, weighted[rows], after, out=scratch)
            k[rows, start:] = self._cov(block, additive, out=block, scratch=scratch)
        return k

    def _cov(
        self,
        products: np.ndarray,
        additive: Callable[[], np.ndarray],
        out: np.ndarray | None = None,
        scratch: np.ndarray | None = None,
    ) -> np.ndarray:
        """`cov` from its parts, prod_{S & U}(1 + u) - 1 and (the call) sum_{S & U} q, into
        `out` (new arrays where `out` and `scratch` are None: the likelihood's grid reuses
        the parts over gamma, and its buffers, fresh pages being a third of its time). [m, m]"""
        k = np.multiply(products, self.gamma / self.theta, out=out)
        if self.gamma != 1.0:
            k += np.multiply(additive(), 1 - self.gamma, out=scratch)
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


def _factor(k: np.ndarray, noise: np.ndarray, overwrite: bool = False) -> np.ndarray | None:
    """Lower Cholesky factor of k + diag(noise) (upper triangle read; `overwrite`: in k's
    memory, a fresh m x m array and a copy less); None when not positive definite."""
    from scipy.linalg.lapack import dpotrf

    a = k if overwrite else k.copy()
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


def _kernel(prior: Prior, z: np.ndarray) -> tuple[np.ndarray, float]:
    """The prior's covariance on the rows of z over its diagonal mean, upper triangle only
    (Prior.cov; all that the factorisations read), and that mean. [m, m], -"""
    k = prior.cov(z, upper=True)
    norm = max(float(k.diagonal().mean()), 1e-300)
    for start in range(0, len(k), BLOCK):
        k[start : start + BLOCK, start:] /= norm
    return k, norm


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


class _Grid:
    """Marginal likelihoods of grid points (tau, p, gamma, nugget) on the rows z, y (s^2
    profiled out, shared by the outputs): `score` keeps every point's value (`seen`) and the
    best point with its Cholesky factor (`best`)."""

    def __init__(self, z: np.ndarray, y: np.ndarray, r: np.ndarray) -> None:
        self.z, self.y, self.r = z, y, r
        m = len(z)
        self.parts: dict[tuple[float, float], tuple[np.ndarray, list[np.ndarray]]] = {}
        self.buffers = np.empty((2, m, m))  # the kernel and a scratch
        self.spare: list[np.ndarray] = []  # factors not kept: their memory, for the next
        self.seen: list[tuple[float, tuple[float, float, float, float]]] = []
        self.qs: dict[float, np.ndarray] = {}  # relevances by power
        self.best: tuple[float, Prior, float, np.ndarray, np.ndarray] | None = None

    def score(self, tau: float, p: float, gamma: float, nuggets: tuple[float, ...]) -> None:
        from scipy.linalg.lapack import dpotrf, dtrtrs

        (m, n), y = self.z.shape, self.y
        if p not in self.qs:
            self.qs[p] = _q(self.r, p)
        prior = Prior(self.qs[p], tau / n, gamma)
        if (tau, p) not in self.parts:  # the products and the additive part serve every gamma
            self.parts.clear()
            self.parts[tau, p] = (_products(self.z, prior.u), [])
        products, additive = self.parts[tau, p]

        def gram() -> np.ndarray:
            if not additive:
                additive.append((self.z * prior.q) @ self.z.T)
            return additive[0]

        k = prior._cov(products, gram, out=self.buffers[0], scratch=self.buffers[1])
        k *= 1.0 / max(float(np.trace(k)) / m, 1e-300)
        if not np.isfinite(k.sum()):  # an infinity or a nan anywhere
            return
        for nugget in nuggets:
            # _factor's arithmetic, in place on one copy, the upper triangle left stale (only
            # the best is cleaned), and LAPACK's triangular solve without scipy's checks
            a = self.spare.pop() if self.spare else np.empty_like(k)
            np.copyto(a, k)
            a.ravel()[m + 1 :: m + 1] += nugget  # _noise: none on row 0, the full coalition
            low, info = dpotrf(a.T, lower=1, clean=0, overwrite_a=1)
            if info != 0:
                self.spare.append(a)
                continue
            a0 = dtrtrs(low, y, lower=1)[0]
            s2 = np.maximum(np.einsum("ij,ij->j", a0, a0) / m, 1e-300)
            nll = 0.5 * m * float(np.log(s2).sum()) + y.shape[1] * float(
                np.log(low.diagonal()).sum()
            )
            self.seen.append((nll, (tau, p, gamma, nugget)))
            if self.best is None or nll < self.best[0]:
                if self.best is not None:
                    self.spare.append(self.best[3].T)
                self.best = (nll, prior, nugget, low, s2)
            else:
                self.spare.append(a)


def _score(grid: _Grid, points: list[tuple[float, float, float, float]]) -> None:
    """Score the points, those sharing (tau, p) together (their kernel parts are reused)."""
    by: dict[tuple[float, float, float], list[float]] = {}
    for tau, p, gamma, nugget in points:
        by.setdefault((tau, p, gamma), []).append(nugget)
    for (tau, p, gamma), nuggets in sorted(by.items()):  # grid order: ties go to the first
        grid.score(tau, p, gamma, tuple(sorted(nuggets)))


def _spread(m: int, count: int, seed: int) -> np.ndarray:
    """Row 0 (the full coalition) and a seeded spread of `count - 1` of the others, sorted."""
    pick = np.random.default_rng(seed).choice(np.arange(1, m), count - 1, replace=False)
    return np.concatenate([[0], np.sort(pick)])


def _choose(z: np.ndarray, y: np.ndarray) -> tuple[Prior, float, np.ndarray]:
    """The prior and nugget of the largest marginal likelihood (s^2 profiled out, shared by
    the outputs) on at most max(PILOT_ROWS, 2n) rows (the full coalition and a seeded spread of
    the rest): every point of the grid from 3n to FULL_GRID_ROWS rows, screened by SCREEN's
    levels (each ranks the points still in on more rows, at least 3n, and keeps the best), else
    (tau, nugget) with every player alike and gamma 1, then p, then gamma. Also, there, the
    ratio of the leave-one-out estimate of s^2 to the likelihood's (at least 1; per output):
    where the prior is wrong, held-out errors are larger than it expects."""
    (m, n), pilot = z.shape, max(PILOT_ROWS, 2 * z.shape[1])
    if m > pilot:
        idx = _spread(m, pilot, m)
        z, y, m = z[idx], y[idx], pilot
    r = _relevance(z, y)
    grid = _Grid(z, y, r)
    # Every combination where it is cheap and matters most; not on the near-square design
    # below 3n, where the likelihood is flat and the full grid over-fits it (breast-cancer-mlp
    # at 2n: 87% within 2 error_std against 91%).
    full = 3 * n <= m <= FULL_GRID_ROWS
    if full:
        points = [(*t, nugget) for t in product(TAUS, POWERS, GAMMAS) for nugget in NUGGETS]
        order = np.concatenate([[0], np.random.default_rng(m + 1).permutation(np.arange(1, m))])
        ranked = 0  # rows the points are ranked on (in order): none yet
        for rows, keep in SCREEN:  # successive halving: rank on a few rows, keep the best
            rows = max(rows, 3 * n)  # the likelihood is flat on fewer (above)
            if rows >= m or keep >= len(points):
                continue
            if rows > ranked:
                sub = np.sort(order[:rows])
                level = _Grid(z[sub], y[sub], r)
                _score(level, points)
                points, ranked = [point for _, point in sorted(level.seen)], rows
            points = points[:keep]
        _score(grid, points)
    else:  # one parameter at a time from the isotropic prior's tau
        for tau in TAUS:
            grid.score(tau, 0.0, 1.0, NUGGETS)
        if grid.best is not None:
            theta = grid.best[1].theta
            for p in POWERS[1:]:
                grid.score(theta * n, p, 1.0, NUGGETS)
            p = next(p for p in POWERS if np.allclose(grid.best[1].q, _q(r, p)))
            for gamma in GAMMAS:
                if gamma != 1.0:
                    grid.score(theta * n, p, gamma, NUGGETS)
    if grid.best is None:
        return Prior(np.ones(n), 1.0 / n, 1.0), 1e-2, np.ones(y.shape[1])
    _, prior, nugget, low, s2 = grid.best
    inv = _invert_lower(np.tril(low))  # L^-1: a third of a solve against the identity
    alpha = inv.T @ (inv @ y)
    s2_loo = (alpha**2 / np.maximum((inv**2).sum(axis=0), 1e-300)[:, None]).mean(axis=0)
    return prior, nugget, np.maximum(s2_loo / s2, 1.0)


def _solved(
    k: np.ndarray,
    y: np.ndarray,
    nugget: float,
    rebuild: Callable[[], np.ndarray] | None = None,
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Cholesky factor of k + the nugget (raised tenfold until positive definite), that
    nugget, the whitened values and alpha = (k + noise)^-1 y. [m, m], -, [m, k], [m, k]

    `rebuild`: k may be factorised in place (k is then the factor's memory), and is rebuilt
    by that call where the first nugget fails."""
    low = _factor(k, _noise(len(y), nugget), overwrite=rebuild is not None)
    if low is None and rebuild is not None:
        k = rebuild()
    while low is None:
        nugget *= 10
        low = _factor(k, _noise(len(y), nugget))
    a0 = _solve_triangular(low, y, lower=True, check_finite=False)  # [m, k]
    return low, nugget, a0, _solve_triangular(low.T, a0, lower=False, check_finite=False)
