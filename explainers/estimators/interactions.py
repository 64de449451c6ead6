"""Shapley interaction indices: exact from Möbius coefficients, sampled through shapiq or gp.

SII: Grabisch & Roubens (1999); k-SII: Bordt & von Luxburg (2023); STII: Sundararajan et al.
(2020); FSII: Tsai, Yeh & Ravikumar (2023); FBII: Tsai et al. (2023). Sampled estimators:
shapiq (Muschalik et al. 2024) approximators run on our metered game, and gp
(gp_interactions.py). The runners here take a recorder and return an Estimate of one output
(`Terms`: the index, its order and the output); which one runs is the estimator table's choice
(registry.py, `interaction_values`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from math import comb

import numpy as np
from scipy.special import bernoulli

from explainers.estimators.base import Estimate
from explainers.estimators.exact import value_table
from explainers.estimators.gp_interactions import gp_interactions
from explainers.estimators.mobius import mobius_transform, popcounts
from explainers.estimators.rounds import Slicer
from explainers.games import GameRecorder

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


def min_coalitions(n: int) -> int:
    """Sampled interactions: at least 2n coalitions (v(empty), v(all) and 2n - 2 more)."""
    return 2 * n


@dataclass(frozen=True)
class Terms:
    """What an interaction run explains: the index, its highest order and the output (None:
    v(all)'s argmax)."""

    index: str
    max_order: int
    output: int | None


TermsRunner = Callable[[GameRecorder, np.random.Generator, Terms, int], Estimate]


def exact_terms(
    recorder: GameRecorder, rng: np.random.Generator, terms: Terms, seed: int
) -> Estimate:
    """Every term exactly, from v over all 2^n coalitions (Möbius coefficients)."""
    del rng, seed
    table = value_table(recorder)
    index, k, n_players = terms.index, terms.max_order, recorder.n_players
    column = int(np.argmax(table[-1])) if terms.output is None else terms.output
    values, baseline = from_table(table[:, [column]], index, k)
    found = {key: float(v[0]) for key, v in values.items()}
    edge = (float(baseline[0]), float(table[-1, column]))
    return _estimate(found, n_players, index, k, edge, recorder, "exact", column)


def _ends(recorder: GameRecorder, output: int | None) -> tuple[int, tuple[float, float]]:
    """The explained output and (v(empty), v(all)) of it, from one call."""
    ends = np.zeros((2, recorder.n_players), dtype=bool)
    ends[1] = True
    v_ends = recorder(ends)
    column = int(np.argmax(v_ends[1])) if output is None else output
    return column, (float(v_ends[0, column]), float(v_ends[1, column]))


def gp_terms(recorder: GameRecorder, rng: np.random.Generator, terms: Terms, seed: int) -> Estimate:
    """gp: the posterior of every term, with standard deviations (gp_interactions.py)."""
    del seed
    n_players, index, k = recorder.n_players, terms.index, terms.max_order
    coalitions = _coalitions(recorder)
    column, edge = _ends(recorder, terms.output)
    w = distribution_weights(index, n_players, k)
    means, stds = gp_interactions(recorder, w, coalitions, column, rng)
    est = _estimate(means, n_players, index, k, edge, recorder, "gp", column)
    return replace(est, error_std=np.array([stds[(i,)] for i in range(n_players)]))


def _coalitions(recorder: GameRecorder) -> int:
    """The coalitions the whole budget pays for (the recorder is fresh)."""
    if recorder.budget is None:
        raise ValueError("sampled interactions need a budget")
    return recorder.budget // recorder.cost


def shapiq_terms(estimator: str, approximator: str, index: str | None = None) -> TermsRunner:
    """A runner of shapiq's `approximator` (a class name; `index`: its index argument, for the
    approximators that serve several) under our estimator name `estimator`."""

    def run(recorder: GameRecorder, rng: np.random.Generator, terms: Terms, seed: int) -> Estimate:
        import shapiq  # heavy; only for sampled interactions

        del rng
        n_players, k = recorder.n_players, terms.max_order
        coalitions = _coalitions(recorder)
        column, edge = _ends(recorder, terms.output)
        sliced = Slicer(recorder, distinct=False)  # shapiq may ask for its whole budget at once

        def scalar(masks: np.ndarray) -> np.ndarray:
            masks = np.atleast_2d(np.asarray(masks, dtype=bool))
            return sliced(masks)[:, column]

        make = getattr(shapiq, approximator)
        args = (n_players, k) if index is None else (n_players, k, index)
        model = make(*args, random_state=seed)
        nominal = coalitions
        if estimator == "permutation" and terms.index in ("SII", "k-SII") and k == 2:
            # shapiq plans an order-2 SII permutation at its full cost, but on our memoised game
            # one costs at most 2n - 2 new coalitions (its prefix chains); a larger nominal
            # budget lets it use what we pay for. The recorder still enforces the real budget.
            per_perm = int(getattr(model, "iteration_cost", 1))
            nominal = 1 + max(1, (coalitions - 2) // max(2 * n_players - 2, 1)) * per_perm
        approx = model.approximate(nominal, scalar)
        estimated = dict.fromkeys(_terms(n_players, k), 0.0)  # unsampled terms are 0, not absent
        estimated.update(
            (tuple(int(p) for p in key), float(approx.values[pos]))
            for key, pos in approx.interaction_lookup.items()
            if 1 <= len(key) <= k
        )
        name = f"{estimator} (shapiq {type(model).__name__})"
        return _estimate(estimated, n_players, terms.index, k, edge, recorder, name, column)

    return run


__all__ = [
    "EFFICIENT",
    "INDICES",
    "Terms",
    "distribution_weights",
    "exact_terms",
    "from_table",
    "gp_terms",
    "min_coalitions",
    "shapiq_terms",
    "superset_sums",
]
