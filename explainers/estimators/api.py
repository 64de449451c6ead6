"""Aggregated positive interactions (API): an allocation that does not let negative
interactions cancel a player's decisive effect.

Chang, Lee & Choi (ICLR 2025), "Rethinking Shapley Value for Negative Interactions in Non-convex
Games". No reference code was found: the two rules below are our reconstruction from the paper's
published summary (METHODS.md 1b), not the authors' code.

* chain (default): psi_i = Delta_i(empty) + E_pi[ sum_m max(0, I_{i p_m}(P_{m-1})) ], the
  Shapley marginal of i telescoped over the players p_1..p_k before it, keeping only positive
  second-order terms I_ij(S) = v(S+i+j) - v(S+i) - v(S+j) + v(S).
* moebius: psi_i = sum over T containing i of max(m(T), 0) / |T|.
Both are at least the Shapley values (they drop negative terms of a sum that gives Shapley) and
efficiency is given up. chain equals Shapley exactly when no I_ij(S) is negative, i.e. on
convex (supermodular) games. moebius equals Shapley exactly when no Möbius dividend m(T) is
negative (totally monotone games), a stricter condition once n >= 3: the convex game
v(S) = max(0, |S| - 1), n = 3, has dividends 1 on pairs and -1 on the triple, so Shapley and
chain give 2/3 each and moebius 1. With two players the rules coincide.
Sampled: the permutation estimator of the chain rule (api_chain.py). Which runs is the estimator
table's choice (registry.py, `api_values`).
"""

from __future__ import annotations

from math import factorial

import numpy as np

from explainers.estimators.api_chain import permutation_chain
from explainers.estimators.base import Estimate
from explainers.estimators.exact import value_table
from explainers.estimators.mobius import mobius_transform, popcounts, shapley_from_mobius
from explainers.games import GameRecorder

VARIANTS = ("chain", "moebius")


def chain_from_table(table: np.ndarray) -> np.ndarray:
    """Exact chain-rule API from v over all coalitions [2^n, k]. [n, k]"""
    n = table.shape[0].bit_length() - 1
    sizes = popcounts(n)
    # P(the players before j are exactly S, and i comes after j) = |S|! (n-|S|-1)! / n!
    weight = np.array([factorial(s) * factorial(n - s - 1) / factorial(n) for s in range(n)])
    index = np.arange(1 << n)
    psi = np.zeros((n, table.shape[1]))
    for i in range(n):
        psi[i] = table[1 << i] - table[0]
        for j in range(n):
            if j == i:
                continue
            s = index[(index >> i & 1) == 0]
            s = s[(s >> j & 1) == 0]  # coalitions without i and j
            inter = table[s | 1 << i | 1 << j] - table[s | 1 << i] - table[s | 1 << j] + table[s]
            psi[i] += (weight[sizes[s]][:, None] * np.maximum(inter, 0)).sum(axis=0)
    return psi


def moebius_from_table(table: np.ndarray) -> np.ndarray:
    """Shapley shares of the positive Möbius coefficients only. [n, k]"""
    dividends = mobius_transform(table)
    return shapley_from_mobius(np.maximum(dividends, 0))


def exact_api(recorder: GameRecorder, rng: np.random.Generator, variant: str) -> Estimate:
    """Exact API of either rule from v over all 2^n coalitions."""
    del rng
    table = value_table(recorder)
    rule = chain_from_table if variant == "chain" else moebius_from_table
    return Estimate(
        rule(table),
        table[0],
        table[-1],
        True,
        recorder.n_evaluations,
        recorder.n_coalitions,
        "exact",
        index="API",
    )


def min_coalitions(n: int) -> int:
    """Sampled (chain) API: v(empty) and one permutation's n(n+1)/2 coalitions."""
    return n * (n + 1) // 2 + 1


__all__ = [
    "VARIANTS",
    "chain_from_table",
    "exact_api",
    "min_coalitions",
    "moebius_from_table",
    "permutation_chain",
]
