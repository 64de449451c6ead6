"""Shapley interaction indices: exact from Möbius coefficients, sampled through shapiq.

SII: Grabisch & Roubens (1999); k-SII: Bordt & von Luxburg (2023); STII: Sundararajan et al.
(2020); FSII: Tsai, Yeh & Ravikumar (2023); FBII: Tsai et al. (2023). Sampled estimators:
shapiq (Muschalik et al. 2024) approximators run on our metered game.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from math import comb
from typing import Any

import numpy as np
from scipy.special import bernoulli

from explainers.estimators import exact as exact_estimator
from explainers.estimators.base import Estimate
from explainers.estimators.budget import default_budget
from explainers.estimators.gp_interactions import fits as gp_fits
from explainers.estimators.gp_interactions import gp_interactions
from explainers.estimators.mobius import mobius_transform, popcounts
from explainers.estimators.rounds import Slicer
from explainers.explanation import OptionError
from explainers.games import BudgetError, Game, GameRecorder, rows_per_coalition

INDICES = ("SV", "SII", "k-SII", "STII", "FSII", "FBII")
EFFICIENT = frozenset({"SV", "k-SII", "STII", "FSII"})  # sum of all terms = v(N) - v(empty)


def _fsii(s: int, t: int, k: int) -> float:
    return (-1) ** (k - t) * t / (k + t) * comb(k, t) * comb(s - 1, k) / comb(s + k - 1, k + t)


def distribution_weights(index: str, n: int, k: int) -> np.ndarray:
    """W[s, t]: the share of a size-s Möbius coefficient given to each size-t subset. [n+1, k+1]"""
    w = np.zeros((n + 1, k + 1))
    b = bernoulli(k)  # B_0 = 1, B_1 = -1/2, ...
    for s in range(1, n + 1):
        for t in range(1, min(k, s) + 1):
            if index in ("SV", "SII"):
                w[s, t] = 1 / (s - t + 1)
            elif index == "k-SII":  # SII aggregated with Bernoulli weights, folded per size
                w[s, t] = sum(
                    comb(s - t, j) * b[j] / (s - t - j + 1) for j in range(min(k, s) - t + 1)
                )
            elif s <= k:  # STII, FSII, FBII keep low-order coefficients where they are
                w[s, t] = float(s == t)
            elif index == "STII":
                w[s, t] = 1 / comb(s, k) if t == k else 0.0
            elif index == "FSII":
                w[s, t] = _fsii(s, t, k)
            elif index == "FBII":
                w[s, t] = (-1) ** (k - t) * 0.5 ** (s - t) * comb(s - t - 1, k - t)
    return w


def superset_sums(values: np.ndarray) -> np.ndarray:
    """Z(T) = sum over S containing T of values(S), in O(n 2^n). [2^n, c]"""
    z = np.array(values, dtype=np.float64, copy=True)
    n = z.shape[0].bit_length() - 1
    for i in range(n):
        view = z.reshape(-1, 2, 1 << i, *z.shape[1:])
        view[:, 0] += view[:, 1]
    return z


def _members(mask: int, n: int) -> tuple[int, ...]:
    return tuple(i for i in range(n) if mask >> i & 1)


def from_table(
    table: np.ndarray, index: str, max_order: int
) -> tuple[dict[tuple[int, ...], np.ndarray], np.ndarray]:
    """Exact interactions of order 1..max_order and the baseline from v over all coalitions."""
    n = table.shape[0].bit_length() - 1
    k = 1 if index == "SV" else max_order
    dividends = mobius_transform(table)  # [2^n, c]
    sizes = popcounts(n)
    w = distribution_weights(index, n, k)
    out: dict[tuple[int, ...], np.ndarray] = {}
    for t in range(1, min(k, n) + 1):
        sums = superset_sums(dividends * w[sizes, t][:, None])
        for mask in np.flatnonzero(sizes == t):
            out[_members(int(mask), n)] = sums[mask]
    baseline = dividends[0].copy()
    if index == "FBII":  # the empty set absorbs part of each higher-order coefficient
        high = sizes > k
        share = (
            (-1) ** k * 0.5 ** sizes[high] * np.array([comb(int(s) - 1, k) for s in sizes[high]])
        )
        baseline = baseline + (share[:, None] * dividends[high]).sum(axis=0)
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0]))), baseline


def _terms(n: int, k: int) -> list[tuple[int, ...]]:
    return [t for size in range(1, k + 1) for t in combinations(range(n), size)]


InteractionResult = Estimate  # the name these results had before the one result type


def _estimate(
    terms: dict[tuple[int, ...], float],
    n_players: int,
    index: str,
    k: int,
    ends: tuple[float, float],
    recorder: GameRecorder,
    estimator: str,
    column: int,
) -> Estimate:
    """One output's interaction terms as an Estimate: first-order values [n] and every term."""
    ordered = dict(sorted(terms.items(), key=lambda kv: (len(kv[0]), kv[0])))
    return Estimate(
        values=np.array([ordered.get((i,), 0.0) for i in range(n_players)]),
        base_value=np.asarray(ends[0]),
        full_value=np.asarray(ends[1]),
        exact=estimator == "exact",
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator=estimator,
        index=index,
        max_order=k,
        interactions=ordered,
        output=column,
    )


def _approximators() -> dict[tuple[str, str], Callable[..., Any]]:
    import shapiq  # heavy; only for sampled interactions

    return {
        ("SII", "kernel"): lambda n, k, s: shapiq.KernelSHAPIQ(n, k, "SII", random_state=s),
        ("k-SII", "kernel"): lambda n, k, s: shapiq.KernelSHAPIQ(n, k, "k-SII", random_state=s),
        ("FSII", "kernel"): lambda n, k, s: shapiq.RegressionFSII(n, k, random_state=s),
        ("FBII", "kernel"): lambda n, k, s: shapiq.RegressionFBII(n, k, random_state=s),
        ("SII", "svarm"): lambda n, k, s: shapiq.SVARMIQ(n, k, "SII", random_state=s),
        ("k-SII", "svarm"): lambda n, k, s: shapiq.SVARMIQ(n, k, "k-SII", random_state=s),
        ("STII", "svarm"): lambda n, k, s: shapiq.SVARMIQ(n, k, "STII", random_state=s),
        ("SII", "permutation"): lambda n, k, s: shapiq.PermutationSamplingSII(
            n, k, "SII", random_state=s
        ),
        ("k-SII", "permutation"): lambda n, k, s: shapiq.PermutationSamplingSII(
            n, k, "k-SII", random_state=s
        ),
        ("STII", "permutation"): lambda n, k, s: shapiq.PermutationSamplingSTII(
            n, k, random_state=s
        ),
    }


SAMPLED_ESTIMATORS = ("kernel", "svarm", "permutation", "gp")
GP_INDICES = ("SII", "k-SII", "STII", "FSII", "FBII")  # gp_interactions.py: any linear index
# auto's sampled estimator (gp: not on text games, see interaction_values); RMSE of gp over the
# best of shapiq's at equal coalitions, 4n-64n, tanh and breast-cancer games
# (bench/gp_interactions_bench.py, docs/benchmarks.md)
_DEFAULT_SAMPLED = {
    "SV": "kernel",
    "SII": "gp",  # 0.32-0.79x
    "k-SII": "gp",  # 0.27-0.76x
    "STII": "gp",  # 0.17-1.01x PermutationSamplingSTII (SVARM-IQ is worse)
    "FSII": "gp",  # 0.05-0.50x RegressionFSII
    "FBII": "gp",  # 0.02-0.75x RegressionFBII
}
_SAMPLED_FALLBACK = {"STII": "permutation"}  # where gp does not apply (else kernel)


def interaction_values(
    game: Game,
    n_players: int,
    *,
    index: str,
    max_order: int = 2,
    estimator: str = "auto",
    budget: int | None = None,
    seed: int = 0,
    output: int | None = 0,
    gp_auto: bool = True,
) -> Estimate:
    """Interaction index values of `game` for one output (`output`; None = v(all)'s argmax):
    `interactions` holds every term of order 1..max_order, `values` the first-order ones.

    `gp_auto` False: `auto` never picks gp (the explainers pass it for text games, where gp's
    prior misses word interactions: its first-order k-SII terms are biased, docs/benchmarks.md).
    """
    if index not in INDICES:
        raise OptionError(f"unknown index {index!r}; use one of {INDICES}")
    if not 1 <= max_order <= n_players:
        raise OptionError(f"max_order must be between 1 and {n_players}")
    k = 1 if index == "SV" else max_order
    cost = rows_per_coalition(game)
    if budget is None:
        budget = default_budget(n_players, cost, "exact" if estimator == "exact" else "auto")
    coalitions = budget // cost
    fits = exact_estimator.fits(n_players, coalitions)
    if estimator == "auto":
        estimator = "exact" if fits else _DEFAULT_SAMPLED[index]
        if estimator == "gp" and not (gp_auto and gp_fits(n_players, k, coalitions)):
            estimator = _SAMPLED_FALLBACK.get(index, "kernel")
    if estimator == "exact":
        if not fits:
            raise BudgetError(
                f"exact needs all {1 << n_players} coalitions ({(1 << n_players) * cost} model "
                f"evaluations) and at most {exact_estimator.MAX_PLAYERS} players"
            )
        recorder = GameRecorder(game, n_players, budget)
        table = exact_estimator.value_table(recorder)
        column = int(np.argmax(table[-1])) if output is None else output
        values, baseline = from_table(table[:, [column]], index, k)
        terms = {key: float(v[0]) for key, v in values.items()}
        edge = (float(baseline[0]), float(table[-1, column]))
        return _estimate(terms, n_players, index, k, edge, recorder, "exact", column)
    if index == "SV":
        raise OptionError("sampled SV: use the shapley estimators (index SV with kernel)")
    make = _approximators().get((index, estimator))
    if make is None and not (estimator == "gp" and index in GP_INDICES):
        raise OptionError(f"estimator {estimator!r} is not available for {index}")
    if coalitions < 2 * n_players:
        raise BudgetError(
            f"budget pays for {coalitions} coalitions; at least {2 * n_players} needed"
        )
    recorder = GameRecorder(game, n_players, budget)
    ends = np.zeros((2, n_players), dtype=bool)
    ends[1] = True
    v_ends = recorder(ends)
    column = int(np.argmax(v_ends[1])) if output is None else output
    edge = (float(v_ends[0, column]), float(v_ends[1, column]))
    if make is None:  # gp: the posterior of every term, with standard deviations
        w = distribution_weights(index, n_players, k)
        rng = np.random.default_rng(seed)
        means, stds = gp_interactions(recorder, w, coalitions, column, rng)
        est = _estimate(means, n_players, index, k, edge, recorder, "gp", column)
        return replace(est, error_std=np.array([stds[(i,)] for i in range(n_players)]))

    sliced = Slicer(recorder, distinct=False)  # shapiq may ask for its whole budget at once

    def scalar(masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, dtype=bool))
        return sliced(masks)[:, column]

    approximator = make(n_players, k, seed)
    nominal = coalitions
    if estimator == "permutation" and index in ("SII", "k-SII") and k == 2:
        # shapiq plans an order-2 SII permutation at its full cost, but on our memoised game one
        # costs at most 2n - 2 new coalitions (its prefix chains); a larger nominal budget
        # lets it use what we pay for. The recorder still enforces the real budget.
        per_perm = int(getattr(approximator, "iteration_cost", 1))
        nominal = 1 + max(1, (coalitions - 2) // max(2 * n_players - 2, 1)) * per_perm
    approx = approximator.approximate(nominal, scalar)
    estimated = dict.fromkeys(_terms(n_players, k), 0.0)  # unsampled terms are 0, not absent
    estimated.update(
        (tuple(int(p) for p in key), float(approx.values[pos]))
        for key, pos in approx.interaction_lookup.items()
        if 1 <= len(key) <= k
    )
    name = f"{estimator} (shapiq {type(approximator).__name__})"
    return _estimate(estimated, n_players, index, k, edge, recorder, name, column)
