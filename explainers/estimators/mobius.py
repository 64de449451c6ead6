"""Fast subset transforms over value tables indexed by coalition bitmask.

Tables have shape [2^n, k]; row s is the coalition whose bit i is player i.
"""

from __future__ import annotations

import numpy as np


def popcounts(n: int) -> np.ndarray:
    """Coalition sizes of all 2^n bitmasks. [2^n]"""
    sizes = np.zeros(1, dtype=np.int64)
    for _ in range(n):
        sizes = np.concatenate([sizes, sizes + 1])
    return sizes


def mobius_transform(values: np.ndarray) -> np.ndarray:
    """Harsanyi dividends m(T) = sum_{L <= T} (-1)^{|T|-|L|} v(L), in O(n 2^n). [2^n, k]"""
    m = np.array(values, dtype=np.float64, copy=True)
    size = m.shape[0]
    n = size.bit_length() - 1
    if 1 << n != size:
        raise ValueError(f"table length {size} is not a power of two")
    rest = m.shape[1:]
    for i in range(n):
        view = m.reshape(-1, 2, 1 << i, *rest)  # axis 1 = bit i absent/present
        view[:, 1] -= view[:, 0]
    return m


def shapley_from_mobius(dividends: np.ndarray) -> np.ndarray:
    """phi_i = sum over T containing i of m(T) / |T|. [n, k]"""
    size = dividends.shape[0]
    n = size.bit_length() - 1
    sizes = popcounts(n).astype(np.float64)
    sizes[0] = np.inf  # the empty coalition's dividend is v(empty), shared by nobody
    shares = dividends / sizes.reshape(-1, *([1] * (dividends.ndim - 1)))
    rest = dividends.shape[1:]
    return np.stack([shares.reshape(-1, 2, 1 << i, *rest)[:, 1].sum(axis=(0, 1)) for i in range(n)])
