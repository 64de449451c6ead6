"""Regression-adjusted Monte Carlo Shapley values: learn the game while sampling it.

Witter et al. (2025), "Regression-adjusted Monte Carlo estimators for Shapley values and
probabilistic values": fit a cheap surrogate g of the value function on the sampled coalitions,
take g's Shapley values exactly, and add a Monte Carlo estimate of the Shapley values of the
residual v - g. Our construction [ours]: KernelSHAP's coalitions (kernel.Planner: small sizes
enumerated, the rest drawn in complement pairs); a ridge-regularised cubic surrogate on the
coalition indicators (players, pairs and triples among the players with the largest linear
effects: paired KernelSHAP is already exact on games of order <= 2, so the triples are what
helps), whose Shapley values are closed-form (each term shared equally by its players); the
residual term is constrained KernelSHAP on the residual, cross-fitted (each drawn pair's residual
is taken on the surrogate fitted without its fold), with the delete-a-group jackknife standard
error. Plain KernelSHAP on the same coalitions when no triple fits or the adjustment does not
lower the jackknife error.
"""

from __future__ import annotations

from itertools import combinations, pairwise
from math import comb

import numpy as np

from explainers.estimators import kernel
from explainers.estimators.kernel import Design, min_coalitions

FOLDS = 4  # cross-fitting folds of the drawn pairs ...
MIN_FOLD_PAIRS = 8  # ... fewer when there are fewer than this many pairs per fold (at least 2)
FEATURES_PER_ROW = 4  # surrogate coefficients per training row (ridge keeps them in check) ...
MAX_FEATURES = 1024  # ... and at most this many (the estimator's own time stays small)
RIDGE = 1e-3  # ridge penalty, relative to the mean diagonal of the weighted Gram matrix ...
RIDGES = (1e-4, 1e-3, 1e-2)  # ... of the linear fit; the surrogate's is the one of these with
# the smallest cross-fitted (held-out) residual
N_JACKKNIFE = 32  # delete-a-group jackknife groups of the drawn pairs

__all__ = ["min_coalitions", "regression", "rounds"]



def _penalty(gram: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """Ridge penalty per coefficient: `ridge` times the mean diagonal; none on the intercept."""
    diag = np.diag(gram)[1:]
    reg = np.full(len(gram), ridge * max(float(diag.mean()) if len(diag) else 0.0, 1e-300))
    reg[0] = 0.0
    return np.diag(reg)


def _solve(gram: np.ndarray, rhs: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """Ridge coefficients; the penalised Gram matrix is positive definite but for the
    unpenalised intercept, so a plain solve, with least squares as the fallback."""
    system = gram + _penalty(gram, ridge)
    try:
        return np.asarray(np.linalg.solve(system, rhs))
    except np.linalg.LinAlgError:
        return np.asarray(np.linalg.lstsq(system, rhs, rcond=None)[0])


def _top(score: np.ndarray, order: int, room: int) -> np.ndarray:
    """Every subset of `order` players among the top-t by score, t as large as `room`
    allows. [terms, order]"""
    n = len(score)
    t = order - 1
    while t < n and comb(t + 1, order) <= room:
        t += 1
    if t < order:
        return np.zeros((0, order), dtype=np.int64)
    top = np.sort(np.argsort(-score, kind="stable")[:t])
    return np.array(list(combinations(top.tolist(), order)), dtype=np.int64).reshape(-1, order)


def _terms(z: np.ndarray, y: np.ndarray, rows: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """Interaction terms of the surrogate: pairs, then triples, among the players with the
    largest linear effects, as many as the rows support (at most MAX_FEATURES coefficients);
    none when not one triple fits (paired KernelSHAP is already exact on pairs)."""
    n = z.shape[1]
    x1 = np.concatenate([np.ones((len(rows), 1)), z[rows]], axis=1)
    xw = x1 * w[:, None]
    lin = _solve(xw.T @ x1, xw.T @ y[rows])[1:]  # [n, k]
    scale = np.abs(lin).max(axis=0, keepdims=True)
    score = (np.abs(lin) / np.where(scale > 0, scale, 1.0)).max(axis=1)
    room = min(int(len(rows) * FEATURES_PER_ROW), MAX_FEATURES) - 1 - n
    pairs = _top(score, 2, room if comb(n, 2) <= room // 2 else room // 2)
    triples = _top(score, 3, room - len(pairs))
    return [pairs, triples] if len(triples) else []


def _design(z: np.ndarray, terms: list[np.ndarray]) -> np.ndarray:
    """[1, z, the product of each term's players]. [rows, 1 + n + terms]"""
    products = [z[:, t].prod(axis=2) for t in terms]
    return np.concatenate([np.ones((len(z), 1)), z, *products], axis=1)


def _shapley_of(coef: np.ndarray, n: int, terms: list[np.ndarray]) -> np.ndarray:
    """Shapley values of the polynomial: each term's coefficient shared by its players. [n, k]"""
    phi = coef[1 : n + 1].copy()
    start = n + 1
    for t in terms:
        share = coef[start : start + len(t)] / t.shape[1]
        for c in range(t.shape[1]):
            np.add.at(phi, t[:, c], share)
        start += len(t)
    return np.asarray(phi)


def _fold_of(rows: np.ndarray, folds: int) -> np.ndarray:
    """Fold of each draw, by its pair's store row: a pair drawn twice stays in one fold."""
    h = (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)
    return (h % np.uint64(folds)).astype(np.int64)


def _kernel_fit(
    z: np.ndarray,
    y: np.ndarray,
    total: np.ndarray,
    enum: np.ndarray,
    enum_w: np.ndarray,
    members: np.ndarray,
    draw_w: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Constrained KernelSHAP regression of y (v(S) - v(empty) per store row) and its
    delete-a-group jackknife standard error over the drawn pairs. [n, k] each

    Shapley-kernel weights: enumerated coalitions `enum_w`; a drawn pair (its two store rows
    in `members`) weight / inclusion probability `draw_w`, averaged over the draws.
    """
    n, m = z.shape[1], len(members)
    ones = np.ones(n)
    ze = z[enum] * enum_w[:, None]
    a_e, b_e = ze.T @ z[enum], ze.T @ y[enum]

    def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        inv = np.linalg.pinv(a, hermitian=True)
        u = inv @ ones
        nu = (ones @ inv @ b - total) / (ones @ u)
        return np.asarray(inv @ b - u[:, None] * nu[None, :])

    if m == 0:
        return solve(a_e, b_e), np.zeros((n, y.shape[1]))
    zs = z[members]  # [m, 2, n]
    groups = min(N_JACKKNIFE, m)
    bounds = np.linspace(0, m, groups + 1).astype(int)
    a_g = np.stack(
        [
            np.einsum("j,jsi,jsl->il", draw_w[lo:hi], zs[lo:hi], zs[lo:hi])
            for lo, hi in pairwise(bounds)
        ]
    )
    b_g = np.stack(
        [
            np.einsum("j,jsi,jsk->ik", draw_w[lo:hi], zs[lo:hi], y[members[lo:hi]])
            for lo, hi in pairwise(bounds)
        ]
    )
    a_s, b_s = a_g.sum(axis=0), b_g.sum(axis=0)
    phi = solve(a_e + a_s / m, b_e + b_s / m)
    if groups < 2:
        return phi, np.full_like(phi, np.inf)
    sizes = np.diff(bounds)
    loo = np.stack(
        [
            solve(a_e + (a_s - a_g[g]) / (m - sizes[g]), b_e + (b_s - b_g[g]) / (m - sizes[g]))
            for g in range(groups)
        ]
    )
    spread = ((loo - loo.mean(axis=0)) ** 2).sum(axis=0) * (groups - 1) / groups
    return phi, np.sqrt(spread)


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Regression-adjusted KernelSHAP, cross-fitted over the drawn pairs.

    phi = phi(g) + KernelSHAP(v - g): each drawn pair's residual is taken on the surrogate
    fitted without its fold; the enumerated coalitions (exact sums, no sampling error) use the
    mean of the fold surrogates, and phi(g) is that mean's. When no surrogate fits, or the
    adjusted estimate has the larger jackknife error, it is plain KernelSHAP.
    """
    n = plan.masks.shape[1]
    z = plan.masks.astype(np.float64)
    enum, enum_w = plan.enumerated, plan.enumerated_weights
    if plan.exact:
        none = np.zeros((0, 2), dtype=np.int64)
        return _kernel_fit(z, y, total, enum, enum_w, none, np.zeros(0))[0], None
    m = plan.n_pairs
    members = plan.draws.reshape(m, 2)  # store rows of each drawn pair
    weight = plan.draw_weight[::2]  # [m] kernel weight / inclusion probability
    plain = _kernel_fit(z, y, total, enum, enum_w, members, weight)
    folds = min(FOLDS, m // MIN_FOLD_PAIRS)
    rows_all = np.concatenate([enum, members.ravel()])
    w_all = np.concatenate([enum_w, np.repeat(weight / m, 2)])
    # The terms are chosen once on every row (a choice of columns; the coefficients are
    # cross-fitted), so that the folds share one design and its Gram matrices.
    terms = _terms(z, y, rows_all, w_all) if folds >= 2 else []
    if not terms:
        return plain
    x = _design(z, terms)  # [store rows, f]
    fold = _fold_of(members[:, 0], folds)
    xe = x[enum] * enum_w[:, None]
    gram_e, rhs_e = xe.T @ x[enum], xe.T @ y[enum]
    grams, rhss = [], []
    for f in range(folds):
        rows = members[fold == f].ravel()
        xw = x[rows] * np.repeat(weight[fold == f], 2)[:, None]
        grams.append(xw.T @ x[rows])
        rhss.append(xw.T @ y[rows])
    counts = np.bincount(fold, minlength=folds)
    gram_d, rhs_d = np.sum(grams, axis=0), np.sum(rhss, axis=0)
    best: tuple[float, np.ndarray, list[np.ndarray]] | None = None
    for ridge in RIDGES:
        resid = y.copy()
        coefs = []
        for f in range(folds):
            train = m - counts[f]
            if train == 0 or counts[f] == 0:
                continue
            gram = gram_e + (gram_d - grams[f]) / train
            coef = _solve(gram, rhs_e + (rhs_d - rhss[f]) / train, ridge)
            coefs.append(coef)
            rows = members[fold == f].ravel()
            resid[rows] = y[rows] - x[rows] @ coef
        rows = members.ravel()
        loss = float(np.sum(np.repeat(weight, 2)[:, None] * resid[rows] ** 2))
        if best is None or loss < best[0]:
            best = (loss, resid, coefs)
    assert best is not None  # RIDGES is not empty
    _, resid, coefs = best
    mean = np.mean(coefs, axis=0)
    drawn = np.zeros(len(y), dtype=bool)
    drawn[members.ravel()] = True
    resid[~drawn] = y[~drawn] - x[~drawn] @ mean
    resid = resid - resid[0]
    phi_r, error = _kernel_fit(z, resid, resid[1], enum, enum_w, members, weight)
    if np.sum(error**2) >= np.sum(plain[1] ** 2):
        return plain
    return _shapley_of(mean, n, terms) + phi_r, error


# Regression-adjusted Monte Carlo Shapley values, in rounds (rounds.py).
regression = kernel.OnPlan(_fit, "regression")
rounds = regression.rounds
