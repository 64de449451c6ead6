"""Gaussian-process interaction indices: the posterior mean of every term, closed-form.

gp.py's prior on the Möbius (Harsanyi) dividends of Grabisch (1997), "k-order additive
discrete fuzzy measures and their representation" (a_T independent normal, variance
s^2 q_i alone and s^2 (gamma / theta) prod_{j in T} u_j for |T| >= 2, u = theta q), after
Rasmussen & Williams (2006), "Gaussian processes for machine learning". Every index is
linear in the dividends, I_R = sum over T containing R of W[|T|, |R|] a_T (SII: Grabisch &
Roubens 1999; k-SII: Bordt & von Luxburg 2023; STII, FSII, FBII:
estimators/interactions.py), so [ours] cov(I_R, v(U)) = 1[R in U] ((gamma / theta) prod_R u
sum_j W[t + j, t] e_j(u on U - R) + W[1, 1] (1 - gamma) q_r when R = {r}), with e_j the elementary
symmetric polynomials: e_j(U) by a product over players, e_j(U - R) by dividing the generating
polynomial prod_U (1 + x u) by (1 + x u_r), from below where u_r <= 1 and from above
otherwise (no error growth either way); the last division is folded into the weights, so
one order costs a matrix product per (t-1)-subset. The posterior mean is cross^T K^-1 y and
its variance the prior's (the same sums with W^2 over all players) minus the quadratic form,
scaled by gp.py's s^2 (likelihood, leave-one-out inflated, over m - n degrees of freedom)
times Student's t 97.5% over 1.96, raised per order to the spread of two fits on complementary
halves of the drawn pairs and to the delete-a-group jackknife of the term means over folds of
the pairs (all folds from one factorisation, gp.held_out). Calibration (bench/
gp_interactions_calibration.py, order 2, 4n-64n): 93-100% of all terms within 2 sd on tanh16,
digits 2x2 and breast-cancer; order 1 of k-SII can stay lower (0.81 on a digits 2x2 image):
there the error is the prior's misfit, a bias of constant sign over seeds that neither the
halves nor the jackknife see. Own time: the inverse of the kernel matrix and two fits of half
its size besides (0.05 -> 0.08-0.10 s at 16 players, 1024 coalitions; 0.2 -> 0.4 s at 30, 1920).

Coalitions: KernelSHAP's plan (kernel.Planner: small sizes enumerated, the rest in
complement pairs), seeded, at most the coalitions given; hyperparameters: gp_prior._choose.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import comb

import numpy as np

from explainers.estimators import gp, gp_prior, kernel
from explainers.explanation import OptionError
from explainers.games import GameRecorder

MAX_CELLS = 5_000_000  # coalitions times terms: beyond, seconds and gigabytes for one fit
MAX_ROWS = 4096  # at most this many coalitions in the fit (the rest of a budget is unspent)

__all__ = ["MAX_CELLS", "MAX_ROWS", "fits", "gp_interactions", "term_covariances"]


def fits(n: int, k: int, coalitions: int) -> bool:
    """Whether gp takes this many players, orders and coalitions (MAX_CELLS)."""
    terms = sum(comb(n, t) for t in range(1, k + 1))
    return min(coalitions, MAX_ROWS + 1, 1 << n) * terms <= MAX_CELLS


Terms = dict[tuple[int, ...], float]


def _elementary(z: np.ndarray, u: np.ndarray) -> np.ndarray:
    """e_j of u over each row's coalition, j = 0..n. [m, n+1]"""
    m, n = z.shape
    e = np.zeros((m, n + 1))
    e[:, 0] = 1.0
    for i in range(n):
        e[:, 1:] += (z[:, i : i + 1] * u[i]) * e[:, :-1]
    return e


def _quotients(f: np.ndarray, u: np.ndarray) -> np.ndarray:
    """f / (1 + u_r x) for each r (coefficients, low first; f divisible where r is in the
    coalition, elsewhere the result is finite and masked later). [r, m, d+1]"""
    d = f.shape[1] - 1
    out = np.zeros((len(u), *f.shape))
    small = u <= 1.0
    low, ul = out[small], u[small][:, None]  # from below: q_j = f_j - u q_{j-1}
    low[:, :, 0] = f[:, 0]
    for j in range(1, d + 1):
        low[:, :, j] = f[:, j] - ul * low[:, :, j - 1]
    high, uh = out[~small], u[~small][:, None]  # from above: q_{j-1} = (f_j - q_j) / u
    for j in range(d, 0, -1):
        high[:, :, j - 1] = (f[:, j] - high[:, :, j]) / uh
    out[small], out[~small] = low, high
    return out


def _folded(c: np.ndarray, u: np.ndarray) -> np.ndarray:
    """G[s] with sum_j c_j (f / (1 + u_s x))_j = sum_l f_l G[s, l]. [n, d+1]"""
    d = len(c) - 1
    g = np.zeros((len(u), d + 1))
    for s, us in enumerate(u):
        if us <= 1.0:  # from below: q_j = sum_i (-u)^i f_{j-i}
            powers = (-us) ** np.arange(d + 1)
            g[s] = [c[lo:] @ powers[: d + 1 - lo] for lo in range(d + 1)]
        else:  # from above: q_j = sum_i (-1)^i f_{j+1+i} / u^(i+1)
            powers = (-1.0) ** np.arange(d) / us ** np.arange(1, d + 1)
            g[s, 1:] = [c[:lo][::-1] @ powers[:lo] for lo in range(1, d + 1)]
    return g


def _sums(
    e: np.ndarray,
    u: np.ndarray,
    c: np.ndarray,
    t: int,
    start: int = 0,
    prefix: tuple[int, ...] = (),
) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """(R, sum_j c_j e_j(U - R)) for every R of size t, in lexicographic order. [m] each"""
    n = len(u)
    if len(prefix) == t - 1:
        s = e @ _folded(c, u[start:]).T  # [m, n - start]
        for j, i in enumerate(range(start, n)):
            yield (*prefix, i), s[:, j]
        return
    q = _quotients(e, u[start:])  # [n - start, m, n+1]
    for j, i in enumerate(range(start, n)):
        yield from _sums(q[j], u, c, t, i + 1, (*prefix, i))


def term_covariances(
    prior: gp_prior.Prior, z: np.ndarray, weights: np.ndarray, square: bool = False
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The terms R of order 1..k and cov(I_R, v(U)) for the rows U of z (s^2 = 1); with
    `square`, sum over T containing R and within U of W^2 var(a_T) (z all ones: the prior
    variance). [m, terms]

    `weights` [n+1, k+1]: interactions.distribution_weights of the index.
    """
    n = z.shape[1]
    k = weights.shape[1] - 1
    w = weights**2 if square else weights
    e = _elementary(z, prior.u)
    keys: list[tuple[int, ...]] = []
    blocks = []
    for t in range(1, k + 1):
        c = np.zeros(n + 1)
        c[: n - t + 1] = w[t:, t]
        order = list(_sums(e, prior.u, c, t))
        idx = np.array([key for key, _ in order], dtype=np.int64).reshape(-1, t)
        block = np.stack([col for _, col in order], axis=1)  # [m, C(n, t)]
        block *= (prior.gamma / prior.theta) * prior.u[idx].prod(axis=1)
        if t == 1:  # a player alone: variance q_i, not gamma q_i
            block += w[1, 1] * (1 - prior.gamma) * prior.q[None, :]
        block *= z[:, idx].prod(axis=2)  # only R within U
        keys += [tuple(int(p) for p in key) for key, _ in order]
        blocks.append(block)
    return keys, np.concatenate(blocks, axis=1)


def _jackknife(
    plan: kernel.Design, cross: np.ndarray, low: np.ndarray, alpha: np.ndarray
) -> np.ndarray | None:
    """Delete-a-group jackknife variance of every term's posterior mean over folds of the
    drawn pairs, every fold from one factorisation (gp.held_out: alpha_B' = alpha - P[:, B]
    r_B). [terms]; None with too few pairs. `low` is overwritten (its inverse)."""
    folds = gp.held_out(plan, low, alpha, overwrite=True)  # low's last use
    if folds is None:
        return None
    inv, rows, held_r = folds
    each = np.zeros((len(alpha), len(rows)))  # fold f's r_B in column f, zero elsewhere
    for f, held in enumerate(rows):
        each[held, f] = held_r[held, 0]
    shifts = gp.times_p(inv, each)  # P[:, B] r_B per fold
    means = cross.T @ (alpha - shifts)  # [terms, folds]
    dev = means - means.mean(axis=1, keepdims=True)
    return np.asarray((len(rows) - 1) / len(rows) * (dev**2).sum(axis=1))


def gp_interactions(
    recorder: GameRecorder,
    weights: np.ndarray,
    coalitions: int,
    column: int,
    rng: np.random.Generator,
) -> tuple[Terms, Terms]:
    """Posterior means and standard deviations of every term of order 1..k of one output.

    At most `coalitions` coalitions in all (the empty and full ones included, evaluated
    through the recorder's memo); `weights` [n+1, k+1]: the index's distribution_weights.
    """
    n = recorder.n_players
    k = weights.shape[1] - 1
    planner = kernel.Planner(n, "kernel", rng)
    if not fits(n, k, coalitions):
        raise OptionError(
            f"{n} players to order {k} at {coalitions} coalitions: too many terms for gp "
            "(a smaller max_order or budget, or the kernel estimator)"
        )
    planner.extend(min(coalitions, MAX_ROWS + 1, 1 << n))
    plan = planner.design()
    masks = plan.masks  # [m + 1, n]: empty, full, ...
    v = recorder(masks)[:, column]
    z = masks[1:].astype(np.float64)  # non-empty, the full one first
    y = (v[1:] - v[0])[:, None]  # [m, 1]
    half = gp.halves(plan)
    with gp_prior._blas().limit(limits=1, user_api="blas"):
        prior, nugget, inflate = gp_prior._choose(z, y)
        cov, norm = gp_prior._kernel(prior, z)  # the upper triangle
        keys, cross = term_covariances(prior, z, weights)
        cross /= norm  # [m, terms]
        _, prior_var = term_covariances(prior, np.ones((1, n)), weights, square=True)
        low, nugget, a0, alpha = gp_prior._solved(cov, y, nugget)
        mean = cross.T @ alpha[:, 0]  # [terms]
        white = gp_prior._solve_triangular(low, cross, lower=True, check_finite=False)
        var = np.maximum(prior_var[0] / norm - (white**2).sum(axis=0), 1e-300)
        m = len(y)
        dof = max(m - n, 1)
        s2 = float((a0**2).mean()) * float(inflate[0]) * m / dof * (gp_prior._t975(dof) / 1.96) ** 2
        order = np.array([len(key) for key in keys])
        scale = np.full(len(keys), s2)
        rows = [np.flatnonzero(h != 1) for h in (half[1:], 1 - half[1:])]
        if min(len(r) for r in rows) < m:
            # Two fits on complementary halves of the pairs differ by about twice the
            # variance of each, four times the full fit's: per order, where they differ
            # more, the prior's own variance is too small (gp._posterior, per output there).
            means = [
                cross[r].T @ gp_prior._solved(cov[np.ix_(r, r)], y[r], nugget)[3][:, 0]
                for r in rows
            ]
            gap = (means[0] - means[1]) ** 2 / 4
            for t in range(1, k + 1):
                scale[order == t] = max(s2, float(gap[order == t].mean() / var[order == t].mean()))
        jack = _jackknife(plan, cross, low, alpha)
        if jack is not None:  # per order, raised to the folds' jackknife variance
            for t in range(1, k + 1):
                g = order == t
                scale[g] = np.maximum(scale[g], float(jack[g].mean() / var[g].mean()))
    std = np.sqrt(var * scale)
    return (
        dict(zip(keys, mean.tolist(), strict=True)),
        dict(zip(keys, std.tolist(), strict=True)),
    )
