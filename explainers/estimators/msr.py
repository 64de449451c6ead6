"""Regression-adjusted Monte Carlo with maximum sample reuse ("Tree MSR").

Witter, Liu & Musco (2025), "Regression-adjusted Monte Carlo Estimators for Shapley Values and
Probabilistic Values" (NeurIPS 2025). A surrogate f of the game is fitted on the drawn
coalitions (gradient-boosted trees on the players' indicators, XGBoost), its Shapley values are
computed exactly (interventional TreeSHAP of the trees explaining the all-present row against
the all-absent one: that is the Shapley value of the game S -> f(1_S)), and the residual
v - f is added back by the unbiased maximum-sample-reuse Monte Carlo estimate

    phi_i(v - f) = sum_S (v - f)(S) (p_{|S|-1} 1[i in S] - p_{|S|} 1[i not in S]),

with p_s = 1 / (n C(n-1, s)) the Shapley weights, over coalitions drawn from D. Here D draws
a size s in 1..n-1 from the Shapley kernel (q_s proportional to 1 / (s (n - s))) and a
coalition of that size uniformly, in complementary pairs; the empty and full coalitions are
evaluated and enter exactly. Each term then reads r(S) / q_s (1[i in S] / s - 1[i not in S] /
(n - s)); its sum over players is zero, so the values are efficient whatever f is.

Where this differs from the paper: the surrogate is cross-fitted (the pairs split into two
folds; each fold's residual is estimated with the surrogate fitted on the other fold, and the
two estimates averaged), so the estimate is unbiased given any surrogate and `error_std` is the
Monte Carlo standard error of the residual terms, which sees a surrogate that fits badly. The
paper fits and corrects on the same samples. XGBoost's parameters are fixed here (below), not
tuned per game. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

from explainers.estimators.base import Estimate, Target, uncalibrated_below
from explainers.estimators.rounds import Round, Slicer, caps, drive
from explainers.explanation import Caveat
from explainers.games import BudgetError, GameRecorder

# The surrogate: XGBoost regression trees on 0/1 indicators, one model per output.
TREES = {"n_estimators": 100, "max_depth": 4, "learning_rate": 0.1, "subsample": 1.0}
CALIBRATED_FROM = 8  # coalitions per player from which held-out coverage was >= 0.9 ...
MAX_PAIRS = 1 << 17  # i.i.d. pairs kept at most (memory); free repeats beyond the budget included
MIN_FIT = 4  # a fold with fewer pairs than this takes the other fold's surrogate


def min_coalitions(n: int) -> int:
    """The empty and full coalitions and two pairs (one per fold)."""
    return 2 if n == 1 else 6


def size_weights(n: int) -> np.ndarray:
    """q_s, s = 1..n-1: the Shapley kernel over sizes, normalised."""
    s = np.arange(1, n)
    w = 1.0 / (s * (n - s))
    return np.asarray(w / w.sum())


def _draw(n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` coalitions, sizes from size_weights, each uniform given its size. [count, n]"""
    sizes = rng.choice(np.arange(1, n), size=count, p=size_weights(n))
    keys = rng.random((count, n))
    order = np.argsort(keys, axis=1)
    ranks = np.argsort(order, axis=1)
    return ranks < sizes[:, None]


def _keys(masks: np.ndarray) -> list[bytes]:
    packed = np.packbits(masks, axis=1)
    return list(packed.view(f"V{packed.shape[1]}").ravel().tolist())


def _plan(n: int, cap: int, rng: np.random.Generator, seen: set[bytes], room: int) -> np.ndarray:
    """Pairs (S, complement) while the distinct coalitions paid for (`seen`, updated) stay within
    `cap`; once every coalition is paid for, repeats are free. [p, n] (the S of each pair)"""
    drawn: list[np.ndarray] = []
    total = 1 << n
    while len(drawn) < room:
        if len(seen) >= total:  # nothing left to pay for: draw the rest at once
            batch = _draw(n, room - len(drawn), rng)
            drawn.extend(batch)
            break
        want = max(1, (cap - len(seen)) // 2)
        if len(seen) + 2 > cap:
            break
        batch = _draw(n, min(want, room - len(drawn)), rng)
        took = 0
        for s, key, comp in zip(batch, _keys(batch), _keys(~batch), strict=True):
            new = {key, comp} - seen
            if len(seen) + len(new) > cap:
                break
            seen |= new
            drawn.append(s)
            took += 1
        if took < len(batch):
            break
    return np.stack(drawn) if drawn else np.zeros((0, n), dtype=bool)


def msr(recorder: GameRecorder, rng: np.random.Generator, target: Target | None = None) -> Estimate:
    """Tree-MSR Shapley values, in rounds of doubling coalitions (see rounds.py)."""
    return drive(rounds(recorder, rng), recorder, target)


def rounds(recorder: GameRecorder, rng: np.random.Generator) -> Iterator[Round]:
    """Rounds of complementary pairs; each yields the estimate from every pair so far."""
    n = recorder.n_players
    if n < 2:
        raise BudgetError("the regression-adjusted estimator needs at least 2 players")
    slicer = Slicer(recorder, distinct=False)
    ends = slicer(np.array([np.zeros(n, bool), np.ones(n, bool)]))  # v(empty), v(all) [2, k]
    seen = set(_keys(np.array([np.zeros(n, bool), np.ones(n, bool)])))
    pairs: list[np.ndarray] = []
    values: list[np.ndarray] = []  # [p, 2, k]: v(S), v(complement)
    for index, cap in enumerate(caps(n), start=1):
        remaining = recorder.remaining
        limit = len(seen) + (MAX_PAIRS * 2 if remaining is None else remaining)
        room = MAX_PAIRS - sum(len(p) for p in pairs)
        drawn = _plan(n, min(cap, limit), rng, seen, room)
        if drawn.shape[0] == 0:
            if index == 1:
                raise BudgetError(f"budget too small for two pairs ({min_coalitions(n)} needed)")
            return
        both = np.concatenate([drawn, ~drawn])
        got = slicer(both)
        pairs.append(drawn)
        values.append(np.stack([got[: len(drawn)], got[len(drawn) :]], axis=1))
        masks = np.concatenate(pairs)
        if index == 1 and len(masks) < 2:
            continue  # one pair cannot be split into folds: draw the next round first
        yield Round(
            partial(_estimate, recorder, masks, np.concatenate(values), ends[0], ends[1]),
            samples=len(masks),
            coalitions=len(seen),
            index=index,
        )
        if room <= len(drawn):
            return


def _fit(masks: np.ndarray, y: np.ndarray, ends: np.ndarray, seed: int) -> list[Any]:
    """One XGBoost regressor per output on the coalitions' indicators (empty and full
    included). masks [m, n], y [m, k], ends [2, k]."""
    import xgboost as xgb

    n = masks.shape[1]
    x = np.concatenate([masks, [np.zeros(n, bool), np.ones(n, bool)]]).astype(np.float32)
    targets = np.concatenate([y, ends])
    models = []
    for out in range(targets.shape[1]):
        model = xgb.XGBRegressor(**TREES, n_jobs=1, random_state=seed, base_score=0.0)
        model.fit(x, targets[:, out])
        models.append(model)
    return models


def _predict(models: list[Any], masks: np.ndarray) -> np.ndarray:
    x = masks.astype(np.float32)
    return np.stack([m.predict(x) for m in models], axis=1).astype(np.float64)


def _surrogate_shapley(models: list[Any], n: int) -> np.ndarray:
    """Exact Shapley values of S -> f(1_S): interventional TreeSHAP at the all-ones row against
    the all-zeros row. [n, k]"""
    import shap

    out = []
    for model in models:
        explainer = shap.TreeExplainer(
            model, data=np.zeros((1, n)), feature_perturbation="interventional"
        )
        out.append(np.asarray(explainer.shap_values(np.ones((1, n))), dtype=np.float64)[0])
    return np.stack(out, axis=1)


def _terms(masks: np.ndarray, r: np.ndarray, n: int) -> np.ndarray:
    """Per drawn coalition, the Monte Carlo term of the residual r [m, k] for every player:
    r(S) / q_s (1[i in S] / s - 1[i not in S] / (n - s)). [m, n, k]"""
    s = masks.sum(axis=1)
    q = size_weights(n)[s - 1]
    inside = masks / s[:, None]
    outside = ~masks / (n - s)[:, None]
    return np.asarray(((inside - outside) / q[:, None])[:, :, None] * r[:, None, :])


def _estimate(
    recorder: GameRecorder, masks: np.ndarray, y: np.ndarray, base: np.ndarray, full: np.ndarray
) -> Estimate:
    """masks [p, n] (the S of each pair), y [p, 2, k]: v(S), v(complement)."""
    n = masks.shape[1]
    p = masks.shape[0]
    ends = np.stack([base, full])
    fold = np.arange(p) % 2
    parts, variances = [], []
    fitted: dict[int, list[Any]] = {}
    for a in (0, 1):
        other = 1 - a
        train = fold == other
        if train.sum() < MIN_FIT:  # too few to fit on: both folds share the all-pairs fit
            train = np.ones(p, bool)
        key = int(train.sum()) * 2 + other
        if key not in fitted:
            both = np.concatenate([masks[train], ~masks[train]])
            ys = np.concatenate([y[train, 0], y[train, 1]])
            fitted[key] = _fit(both, ys, ends, seed=a)
        models = fitted[key]
        mine = fold == a
        s_in, s_out = masks[mine], ~masks[mine]
        f_ends = _predict(models, np.array([np.zeros(n, bool), np.ones(n, bool)]))
        r_base, r_full = base - f_ends[0], full - f_ends[1]
        # one i.i.d. unit per pair: the mean of its two coalitions' terms
        unit = (
            _terms(s_in, y[mine, 0] - _predict(models, s_in), n)
            + _terms(s_out, y[mine, 1] - _predict(models, s_out), n)
        ) / 2
        exact_part = _surrogate_shapley(models, n) + (r_full - r_base)[None, :] / n
        parts.append(exact_part + unit.mean(axis=0))
        m = unit.shape[0]
        variances.append(unit.var(axis=0, ddof=1) / m if m > 1 else np.full(unit.shape[1:], np.inf))
    values = (parts[0] + parts[1]) / 2
    error = np.sqrt(variances[0] + variances[1]) / 2
    return Estimate(
        values=recorder.shape_out(values),
        base_value=recorder.shape_out(base),
        full_value=recorder.shape_out(full),
        exact=False,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="msr",
        error_std=None if not np.all(np.isfinite(error)) else recorder.shape_out(error),
        warnings=_few(recorder.n_coalitions, n),
    )


def _few(coalitions: int, players: int) -> tuple[Caveat, ...]:
    """... below it, a warning (bench/calibration_bench.py; the threshold was set after seeing
    those games)."""
    evidence = "max games 0.865 of values were within 2 error_std at 4n"
    caveat = uncalibrated_below("msr", coalitions, players, CALIBRATED_FROM, evidence)
    return () if caveat is None else (caveat,)
