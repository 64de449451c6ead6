"""Cubic-surrogate-adjusted KernelSHAP (`surrogate_kernel`): learn the game while sampling it.

Inspired by Witter et al. (2025), "Regression-adjusted Monte Carlo estimators for Shapley values
and probabilistic values" (arXiv 2506.11849), and not their estimator: they add to a surrogate
g's exact Shapley values an *unbiased* Monte Carlo estimate of the Shapley values of the
residual v - g (maximum-sample-reuse weights), so the sum is unbiased whatever g is. Ours keeps
their first half, a surrogate with closed-form Shapley values, and replaces the second with
KernelSHAP's constrained regression on the residual, which is consistent but biased at a finite
sample (as KernelSHAP is); the name says what it is. Construction [ours]: KernelSHAP's
coalitions (kernel.Planner: small sizes enumerated, the rest drawn in complement pairs); a
ridge-regularised cubic surrogate on the coalition indicators (players, pairs and triples among
the players with the largest linear effects: paired KernelSHAP is already exact on games of
order <= 2, so the triples are what helps), whose Shapley values are closed-form (each term
shared equally by its players); the residual term is constrained KernelSHAP on the residual,
cross-fitted (each drawn pair's residual is taken on the surrogate fitted without its fold).

Standard error: a delete-a-group jackknife over the drawn pairs of the whole estimator: each
replicate refits the fold surrogates without the group (same terms and ridge), recomputes the
residuals and the KernelSHAP fit on them, and adds the refitted surrogate's Shapley values, so
the error bar sees the surrogate's fit as well as the residual's (_replicate_coefs: exact
refits by preconditioned iterative refinement). Not free: the estimator's own time grows 2-15x
(0.2-6.7 s against 0.05-0.9 s on 16-30 players, a loaded 2-core machine), for 0.95-0.99 of the
values within 2 error_std at 32n-64n against 0.90-0.97 with the surrogate held fixed
(bench/regression_bench.py --jackknife; docs/benchmarks.md).
Plain KernelSHAP on the same coalitions when no triple fits or the adjustment does not lower
the jackknife error.

Witter et al.'s own construction (an unbiased maximum-sample-reuse residual, with a tree
surrogate) is explainers/estimators/msr.py.

`estimator: "regression"`, this estimator's name until issue 28, is accepted for one release
(registry.RENAMED): the answer names `surrogate_kernel` and carries a deprecated_name warning.
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
# The jackknife refits the surrogate in every replicate; False holds it fixed (the error bar
# before issue 28, which sees only the residual's KernelSHAP: bench/regression_bench.py only).
REFIT_SURROGATE = True
REFINE_STEPS = 12  # iterative refinement of a replicate's surrogate: at most this many steps

__all__ = ["min_coalitions", "regression", "rounds", "surrogate_kernel"]


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


def _kernel_system(
    z: np.ndarray,
    enum: np.ndarray,
    enum_w: np.ndarray,
    members: np.ndarray,
    draw_w: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KernelSHAP's Gram parts: the enumerated coalitions' [n, n], each jackknife group's
    drawn pairs' [groups, n, n] (unnormalised: weight / inclusion probability), the groups'
    bounds in draw order [groups + 1]."""
    zs = z[members]  # [m, 2, n]
    m = len(members)
    groups = max(min(N_JACKKNIFE, m), 1)
    bounds = np.linspace(0, m, groups + 1).astype(int)
    a_g = np.stack(
        [
            np.einsum("j,jsi,jsl->il", draw_w[lo:hi], zs[lo:hi], zs[lo:hi])
            for lo, hi in pairwise(bounds)
        ]
    )
    ze = z[enum] * enum_w[:, None]
    return ze.T @ z[enum], a_g, bounds


def _kernel_rhs(
    z: np.ndarray, y: np.ndarray, members: np.ndarray, draw_w: np.ndarray, bounds: np.ndarray
) -> np.ndarray:
    """Each jackknife group's drawn pairs' z^T W y. [groups, n, k]"""
    per_pair = np.einsum("j,jsi,jsk->jik", draw_w, z[members], y[members])  # [m, n, k]
    return np.asarray(np.add.reduceat(per_pair, bounds[:-1], axis=0))


def _constrained(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """argmin of the weighted least squares with sum(phi) = total. [n, k]"""
    ones = np.ones(len(a))
    inv = np.linalg.pinv(a, hermitian=True)
    u = inv @ ones
    nu = (ones @ inv @ b - total) / (ones @ u)
    return np.asarray(inv @ b - u[:, None] * nu[None, :])


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
    ze = z[enum] * enum_w[:, None]
    a_e, b_e = ze.T @ z[enum], ze.T @ y[enum]
    if m == 0:
        return _constrained(a_e, b_e, total), np.zeros((n, y.shape[1]))
    _, a_g, bounds = _kernel_system(z, enum, enum_w, members, draw_w)
    b_g = _kernel_rhs(z, y, members, draw_w, bounds)
    a_s, b_s = a_g.sum(axis=0), b_g.sum(axis=0)
    phi = _constrained(a_e + a_s / m, b_e + b_s / m, total)
    groups = len(a_g)
    if groups < 2:
        return phi, np.full_like(phi, np.inf)
    sizes = np.diff(bounds)
    loo = np.stack(
        [
            _constrained(
                a_e + (a_s - a_g[g]) / (m - sizes[g]), b_e + (b_s - b_g[g]) / (m - sizes[g]), total
            )
            for g in range(groups)
        ]
    )
    return phi, _spread(loo)


def _spread(replicates: np.ndarray) -> np.ndarray:
    """Delete-a-group jackknife standard error of [groups, ...] replicates."""
    groups = len(replicates)
    centred = replicates - replicates.mean(axis=0)
    return np.asarray(np.sqrt((centred**2).sum(axis=0) * (groups - 1) / groups))


def _replicate_coefs(
    system: np.ndarray,
    gram_e: np.ndarray,
    rhs_e: np.ndarray,
    rest: tuple[np.ndarray, np.ndarray, int],
    left_out: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    ridge: float,
    coef: np.ndarray,
) -> np.ndarray:
    """One fold's surrogate refitted without each jackknife group. [groups, f, k]

    `system` is the fold's penalised Gram matrix (gram_e + gram / t + penalty) and `coef` its
    solution; `rest` = (gram, rhs, t): the fold's training pairs' unnormalised Gram and
    right-hand side and their count. `left_out[g]` = (x rows, their weights, their y) of the
    training pairs that group g removes. Each replicate's own ridge system, gram_e + (gram -
    x^T W x) / (t - k) + its penalty, is solved by iterative refinement (to 1e-10 relative),
    preconditioned with `system` less the group's rows: one Cholesky factor and a Woodbury
    correction per group, so that a group's high-leverage rows cost no extra steps; what is
    left is the k / (t - k) rescaling, a few per cent: each step gains about two digits.
    """
    from scipy.linalg import cho_factor, cho_solve

    gram, rhs, t = rest
    f, kk = coef.shape
    groups = len(left_out)
    factor = cho_factor(system)
    sizes = np.array([len(w) for _, w, _ in left_out])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    u_all = np.concatenate([u for u, _, _ in left_out]) if sizes.sum() else np.zeros((0, f))
    v_all = cho_solve(factor, u_all.T) if len(u_all) else np.zeros((f, 0))  # A^-1 x^T
    diag_e, diag_d = np.diag(gram_e)[1:], np.diag(gram)[1:]
    scale = 1.0 / (t - sizes // 2)  # [G]
    rhs_g = np.empty((groups, f, kk))
    pens = np.empty(groups)
    woodbury: list[np.ndarray | None] = []
    for g, (u, w, y) in enumerate(left_out):
        rhs_g[g] = rhs_e + (rhs - u.T @ (w[:, None] * y)) * scale[g]
        diag = diag_e + (diag_d - (w[:, None] * u[:, 1:] ** 2).sum(axis=0)) * scale[g]
        pens[g] = ridge * max(float(diag.mean()) if len(diag) else 0.0, 1e-300)
        v = v_all[:, starts[g] : starts[g + 1]]
        woodbury.append(np.linalg.inv(t * np.diag(1.0 / w) - u @ v) if len(w) else None)
    cols = np.repeat(scale, kk)  # [G * k]: the columns of the [f, G * k] layout
    pen_cols = np.repeat(pens, kk)
    rhs2 = rhs_g.transpose(1, 0, 2).reshape(f, groups * kk)
    out = np.tile(coef, (1, groups))  # [f, G * k], group-major columns
    for _ in range(REFINE_STEPS):
        ac = gram_e @ out + (gram @ out) * cols
        ac[1:] += pen_cols * out[1:]
        for g, (u, w, _y) in enumerate(left_out):
            if len(w):
                c = slice(g * kk, (g + 1) * kk)
                ac[:, c] -= u.T @ (w[:, None] * (u @ out[:, c])) * scale[g]
        a = cho_solve(factor, rhs2 - ac)
        for g, (u, _w, _y) in enumerate(left_out):
            corr = woodbury[g]
            if corr is not None:
                c = slice(g * kk, (g + 1) * kk)
                a[:, c] += v_all[:, starts[g] : starts[g + 1]] @ (corr @ (u @ a[:, c]))
        out = out + a
        if np.max(np.abs(a)) <= 1e-10 * max(float(np.max(np.abs(out))), 1e-300):
            break
    return np.asarray(out.reshape(f, groups, kk).transpose(1, 0, 2))


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Cubic-surrogate-adjusted KernelSHAP, cross-fitted over the drawn pairs.

    phi = phi(g) + KernelSHAP(v - g): each drawn pair's residual is taken on the surrogate
    fitted without its fold; the enumerated coalitions (exact sums, no sampling error) use the
    mean of the fold surrogates, and phi(g) is that mean's. The jackknife refits the whole
    construction without each group (`_adjusted` per replicate). When no surrogate fits, or the
    adjusted estimate has the larger jackknife error, it is plain KernelSHAP.
    """
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
    used = [f for f in range(folds) if counts[f] and m - counts[f]]
    best: tuple[float, float, dict[int, np.ndarray]] | None = None
    for ridge in RIDGES:
        resid = y.copy()
        coefs = {}
        for f in used:
            train = m - counts[f]
            gram = gram_e + (gram_d - grams[f]) / train
            coefs[f] = _solve(gram, rhs_e + (rhs_d - rhss[f]) / train, ridge)
            rows = members[fold == f].ravel()
            resid[rows] = y[rows] - x[rows] @ coefs[f]
        rows = members.ravel()
        loss = float(np.sum(np.repeat(weight, 2)[:, None] * resid[rows] ** 2))
        if best is None or loss < best[0]:
            best = (loss, ridge, coefs)
    assert best is not None  # RIDGES is not empty
    _, ridge, coefs = best
    _, a_g, bounds = _kernel_system(z, enum, enum_w, members, weight)
    phi = _adjusted(z, x, y, members, weight, fold, coefs, terms, plan, a_g, bounds, None)
    groups = len(a_g)
    if groups < 2:
        return plain
    # The jackknife: every group's pairs out of the surrogates' training and the residual fit.
    replicate: dict[int, np.ndarray] = {f: np.repeat(c[None], groups, 0) for f, c in coefs.items()}
    for f in used if REFIT_SURROGATE else ():
        left_out = []
        for lo, hi in pairwise(bounds):
            out = np.flatnonzero(fold[lo:hi] != f) + lo
            rows = members[out].ravel()
            left_out.append((x[rows], np.repeat(weight[out], 2), y[rows]))
        train = m - counts[f]
        gram = gram_e + (gram_d - grams[f]) / train
        system = gram + _penalty(gram, ridge)
        rest = (gram_d - grams[f], rhs_d - rhss[f], int(train))
        replicate[f] = _replicate_coefs(system, gram_e, rhs_e, rest, left_out, ridge, coefs[f])
    loo = np.stack(
        [
            _adjusted(
                z,
                x,
                y,
                members,
                weight,
                fold,
                {f: c[g] for f, c in replicate.items()},
                terms,
                plan,
                a_g,
                bounds,
                g,
            )
            for g in range(groups)
        ]
    )
    error = _spread(loo)
    if np.sum(error**2) >= np.sum(plain[1] ** 2):
        return plain
    return phi, error


def _adjusted(
    z: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    members: np.ndarray,
    weight: np.ndarray,
    fold: np.ndarray,
    coefs: dict[int, np.ndarray],
    terms: list[np.ndarray],
    plan: Design,
    a_g: np.ndarray,
    bounds: np.ndarray,
    without: int | None,
) -> np.ndarray:
    """phi(mean surrogate) + constrained KernelSHAP of the residual, on the drawn pairs less
    jackknife group `without` (None: all of them); each drawn pair's residual on its fold's
    surrogate (`coefs`, fitted without that fold, and without the group in a replicate). [n, k]"""
    n, m = z.shape[1], len(members)
    mean = np.mean(list(coefs.values()), axis=0)
    resid = y - x @ mean  # enumerated rows (and any other store row): the mean surrogate
    for f, coef in coefs.items():
        rows = members[fold == f].ravel()
        resid[rows] = y[rows] - x[rows] @ coef
    resid = resid - resid[0]
    enum, enum_w = plan.enumerated, plan.enumerated_weights
    ze = z[enum] * enum_w[:, None]
    a_e, b_e = ze.T @ z[enum], ze.T @ resid[enum]
    b_g = _kernel_rhs(z, resid, members, weight, bounds)
    a_s, b_s = a_g.sum(axis=0), b_g.sum(axis=0)
    kept = m
    if without is not None:
        a_s, b_s = a_s - a_g[without], b_s - b_g[without]
        kept = m - int(bounds[without + 1] - bounds[without])
    phi_r = _constrained(a_e + a_s / kept, b_e + b_s / kept, resid[1])
    return _shapley_of(mean, n, terms) + phi_r


# Cubic-surrogate-adjusted KernelSHAP, in rounds (rounds.py). `regression`: its old name.
surrogate_kernel = kernel.OnPlan(_fit, "surrogate_kernel")
regression = surrogate_kernel  # the module's old entry point (registry.RENAMED: the old name)
rounds = surrogate_kernel.rounds
