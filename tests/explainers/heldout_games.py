"""Held-out games for calibration checks: families no estimator was designed or tuned on.

Four families, each with several random instances by seed, n = 10-14 players, and exact Shapley
values by enumeration of all 2^n coalitions (a vectorised sum over the table, sharing no code
with `explainers/`):

- threshold: v(S) = 1[at least `q` of `c` chosen players are in S] + a small linear part;
- max: v(S) = max over i in S of a_i (0 for the empty set) + a small linear part;
- product: v(S) = prod over chosen i in S of (1 + c_i) - 1 + a small linear part;
- tree: a small fitted tree ensemble (sklearn gradient boosting, else random forest) on random
  data; v(S) = the interventional expectation of its prediction at x with the features outside
  S taken from each of a few background rows (the mean over them).

Do not use these families to tune anything: they are here so that calibration is measured on
games no design decision looked at (issue 28). Importable from bench/ too (tests/ is a package).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from math import comb

import numpy as np

FAMILIES = ("threshold", "max", "product", "tree")


@dataclass
class HeldOutGame:
    """One game: `value(masks [m, n]) -> [m]`, with its exact Shapley values (`exact`)."""

    family: str
    seed: int
    n_players: int
    value: Callable[[np.ndarray], np.ndarray]
    rows_per_coalition: int = 1

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        return np.asarray(self.value(np.asarray(masks, dtype=bool)), dtype=np.float64)

    @property
    def name(self) -> str:
        return f"{self.family}-{self.seed}"

    @cached_property
    def table(self) -> np.ndarray:
        """v at every coalition, bit i of the index = player i. [2^n]"""
        n = self.n_players
        index = np.arange(1 << n, dtype=np.int64)
        masks = ((index[:, None] >> np.arange(n)) & 1).astype(bool)
        return self(masks)

    @cached_property
    def exact(self) -> np.ndarray:
        """Shapley values by enumeration: sum over S without i of w(|S|) (v(S+i) - v(S)). [n]"""
        n, table = self.n_players, self.table
        index = np.arange(1 << n, dtype=np.int64)
        size = np.array([bin(int(s)).count("1") for s in index])
        weight = np.array([1.0 / (n * comb(n - 1, k)) for k in range(n)])
        phi = np.zeros(n)
        for i in range(n):
            without = index[(index >> i) & 1 == 0]
            gain = table[without | (1 << i)] - table[without]
            phi[i] = float((weight[size[without]] * gain).sum())
        return phi


def _linear(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    return rng.normal(0.0, scale, n)


def threshold(seed: int, n: int = 14, chosen: int = 5, quota: int = 3) -> HeldOutGame:
    """1[at least `quota` of `chosen` random players present] + a linear part of scale 0.05."""
    rng = np.random.default_rng(10_000 + seed)
    members = rng.choice(n, chosen, replace=False)
    b = _linear(rng, n, 0.05)

    def value(masks: np.ndarray) -> np.ndarray:
        hits = masks[:, members].sum(axis=1)
        return (hits >= quota).astype(np.float64) + masks @ b

    return HeldOutGame("threshold", seed, n, value)


def maximum(seed: int, n: int = 12) -> HeldOutGame:
    """max_{i in S} a_i (a_i ~ U(0, 1); 0 when S is empty) + a linear part of scale 0.02."""
    rng = np.random.default_rng(20_000 + seed)
    a = rng.uniform(0.0, 1.0, n)
    b = _linear(rng, n, 0.02)

    def value(masks: np.ndarray) -> np.ndarray:
        top = np.where(masks, a[None, :], 0.0).max(axis=1)
        return top + masks @ b

    return HeldOutGame("max", seed, n, value)


def product(seed: int, n: int = 12, chosen: int = 6) -> HeldOutGame:
    """prod over `chosen` random players in S of (1 + c_i) - 1 (c_i ~ U(0.2, 1)) + a linear
    part of scale 0.05: interactions of every order among the chosen players."""
    rng = np.random.default_rng(30_000 + seed)
    members = rng.choice(n, chosen, replace=False)
    c = rng.uniform(0.2, 1.0, chosen)
    b = _linear(rng, n, 0.05)

    def value(masks: np.ndarray) -> np.ndarray:
        factors = np.where(masks[:, members], 1.0 + c[None, :], 1.0)
        return factors.prod(axis=1) - 1.0 + masks @ b

    return HeldOutGame("product", seed, n, value)


def tree(seed: int, n: int = 10, background: int = 4) -> HeldOutGame:
    """A gradient-boosted tree ensemble (depth 3, 30 trees) fitted on 300 random rows of a
    nonlinear target; v(S) = mean over `background` rows b of f(x_S, b_rest)."""
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(40_000 + seed)
    x = rng.normal(size=(300, n))
    w = rng.normal(size=n)
    y = x @ w + 2.0 * (x[:, 0] > 0) * x[:, 1] + np.sin(2 * x[:, 2]) * x[:, 3] + (x[:, 4] * x[:, 5])
    model = GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=seed).fit(x, y)
    point = rng.normal(size=n)
    rows = x[rng.choice(len(x), background, replace=False)]

    def value(masks: np.ndarray) -> np.ndarray:
        m = len(masks)
        mixed = np.where(masks[:, None, :], point[None, None, :], rows[None, :, :])
        out = model.predict(mixed.reshape(m * background, n)).reshape(m, background)
        return np.asarray(out.mean(axis=1))

    return HeldOutGame("tree", seed, n, value)


BUILDERS: dict[str, Callable[[int], HeldOutGame]] = {
    "threshold": threshold,
    "max": maximum,
    "product": product,
    "tree": tree,
}


def game(family: str, seed: int) -> HeldOutGame:
    """Instance `seed` of a family (FAMILIES)."""
    return BUILDERS[family](seed)


def games(families: tuple[str, ...] = FAMILIES, seeds: range = range(3)) -> Iterator[HeldOutGame]:
    for family in families:
        for seed in seeds:
            yield game(family, seed)
