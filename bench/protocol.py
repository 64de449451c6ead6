"""Statistics of the held-out benchmark protocol (issue 28), shared by the bench scripts.

Every RMSE ratio in docs/benchmarks.md that follows the protocol comes from `ratio_interval`:
RMSE = sqrt(mean over answers of each answer's mean squared error), ratio = ours / the best
peer's, with a 90% paired bootstrap interval over answers (an answer: one explicand or game
instance at one seed, so seeds and explicands are resampled jointly; the same resampled answers
for every contender, the best peer picked inside each replicate; Efron & Tibshirani 1993, the
percentile interval). Shares within 2 error_std get a Wilson score interval (`wilson`; Wilson
1927), which treats the values of one answer as independent (optimistic where they are
correlated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

Z90 = 1.6448536269514722  # the normal's 95% quantile: two-sided 90%


def wilson(hits: int, total: int, z: float = Z90) -> tuple[float, float]:
    """Wilson score interval of a proportion (90% by default); NaNs when total is 0."""
    if total == 0:
        return float("nan"), float("nan")
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return float(centre - half), float(centre + half)


@dataclass(frozen=True)
class Ratio:
    """An RMSE ratio with its bootstrap interval and the peer it is taken against."""

    point: float
    lo: float
    hi: float
    best: str

    def __str__(self) -> str:
        if not np.isfinite(self.point):
            return "-"
        return f"{self.point:.2f} [{self.lo:.2f}, {self.hi:.2f}]"

    def meets(self, goal: float) -> bool:
        """A goal "ratio <= goal" is met only where the interval's upper end meets it."""
        return bool(np.isfinite(self.hi) and self.hi <= goal)


NAN_RATIO = Ratio(float("nan"), float("nan"), float("nan"), "-")


def ratio_interval(
    ours: np.ndarray,
    peers: Mapping[str, np.ndarray],
    reps: int = 2000,
    seed: int = 0,
    level: float = 0.9,
) -> Ratio:
    """RMSE(ours) / min over peers RMSE and its paired bootstrap interval over answers.

    ours: each answer's mean squared error [answers]; peers: the same for each peer on the same
    answers (same order). Peers with a non-finite entry (one that did not run) are left out.
    """
    ours = np.asarray(ours, dtype=np.float64)
    names = [k for k, v in peers.items() if len(v) == len(ours) and np.all(np.isfinite(v))]
    if not names or len(ours) == 0:
        return NAN_RATIO
    stack = np.stack([np.asarray(peers[k], dtype=np.float64) for k in names])  # [peers, answers]
    rmse = np.sqrt(stack.mean(axis=1))
    best = int(np.argmin(rmse))
    point = float(np.sqrt(ours.mean()) / rmse[best])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ours), size=(reps, len(ours)))
    boot = np.sqrt(ours[idx].mean(axis=1)) / np.sqrt(stack[:, idx].mean(axis=2)).min(axis=0)
    tail = (1 - level) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return Ratio(point, float(lo), float(hi), names[best])
