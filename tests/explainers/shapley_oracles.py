"""Ground-truth helpers for the explainer tests: brute-force Shapley values and toy games.

Kept deliberately naive (explicit loops over subsets) so that they share no code with
`explainers/`.
"""

from __future__ import annotations

from math import factorial

import numpy as np


def subsets(mask: int) -> list[int]:
    """All sub-bitmasks of `mask`, the empty one included."""
    out, sub = [], mask
    while True:
        out.append(sub)
        if sub == 0:
            return out
        sub = (sub - 1) & mask


def popcount(mask: int) -> int:
    return bin(mask).count("1")


def masks_to_index(masks: np.ndarray) -> np.ndarray:
    """Bitmask index of each row (bit i = player i). [m]"""
    masks = np.asarray(masks, dtype=bool)
    return (masks.astype(np.int64) << np.arange(masks.shape[1], dtype=np.int64)).sum(axis=1)


def brute_force_shapley(table: np.ndarray) -> np.ndarray:
    """phi_i = sum_{S not containing i} |S|!(n-|S|-1)!/n! (v(S+i) - v(S)). table [2^n, ...]"""
    table = np.asarray(table, dtype=np.float64)
    n = table.shape[0].bit_length() - 1
    phi = np.zeros((n, *table.shape[1:]))
    for i in range(n):
        bit = 1 << i
        for s in range(1 << n):
            if s & bit:
                continue
            k = popcount(s)
            weight = factorial(k) * factorial(n - k - 1) / factorial(n)
            phi[i] += weight * (table[s | bit] - table[s])
    return phi


class TableGame:
    """A game given by its value table [2^n] or [2^n, k]; counts the rows it is asked for."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = np.asarray(table, dtype=np.float64)
        self.n_players = self.table.shape[0].bit_length() - 1
        self.rows_seen = 0
        self.calls = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.rows_seen += masks.shape[0]
        return self.table[masks_to_index(masks)]


def random_table(n: int, seed: int, k: int | None = None) -> np.ndarray:
    """A random (non-additive) game: i.i.d. normal values on every coalition."""
    rng = np.random.default_rng(seed)
    shape = (1 << n,) if k is None else (1 << n, k)
    return rng.normal(size=shape)


def table_of(game, n: int) -> np.ndarray:
    """Evaluate a mask game on all 2^n coalitions, in bit order."""
    idx = np.arange(1 << n)
    masks = ((idx[:, None] >> np.arange(n)) & 1).astype(bool)
    return np.asarray(game(masks), dtype=np.float64)


def float32_exact(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float64 normals that are exactly representable in float32.

    MaskedModelGame stores x and references as float32; with such data the float64 oracle and
    the game see the same numbers.
    """
    return rng.normal(size=shape).astype(np.float32).astype(np.float64)
