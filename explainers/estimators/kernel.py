"""KernelSHAP: Shapley values as a constrained weighted regression over sampled coalitions.

Lundberg & Lee (2017), "A unified approach to interpreting model predictions"; paired
sampling after Covert & Lee (2021), "Improving KernelSHAP"; the leverage sampler after
Musco & Witter (2025), "Provably accurate Shapley value estimation via leverage score sampling".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import combinations, pairwise
from math import comb

import numpy as np
from threadpoolctl import ThreadpoolController

from explainers.estimators.base import Estimate
from explainers.games import BudgetError, GameRecorder

N_JACKKNIFE = 32
SAMPLERS = ("kernel", "leverage")


def min_coalitions(n: int) -> int:
    """Empty, full and n-1 complement pairs: under the efficiency constraint a pair gives
    one equation, and n-1 free coefficients need n-1 of them."""
    return 2 * n


@cache
def _blas() -> ThreadpoolController:
    """The loaded BLAS libraries, scanned once: a scan costs milliseconds per call."""
    return ThreadpoolController()


def _size_weight(n: int, s: int) -> float:
    """Shapley-kernel weight of one coalition of size s (0 < s < n)."""
    return (n - 1) / (comb(n, s) * s * (n - s))


@dataclass(frozen=True)
class Design:
    """Regression rows: enumerated coalitions with kernel weights, then sampled ones."""

    enumerated: np.ndarray  # [e, n]
    enumerated_weights: np.ndarray  # [e]
    sampled: np.ndarray  # [u, n] distinct
    draw_coalition: np.ndarray  # [2 * n_pairs] row of `sampled` per drawn coalition, pair-major
    draw_weight: np.ndarray  # [2 * n_pairs] kernel weight / inclusion probability
    n_pairs: int

    @property
    def exact(self) -> bool:
        return self.sampled.shape[0] == 0


def _full_size(n: int, size: int) -> np.ndarray:
    idx = np.array([sum(1 << i for i in c) for c in combinations(range(n), size)], dtype=np.int64)
    return ((idx[:, None] >> np.arange(n)) & 1).astype(bool)


def design(n: int, coalitions: int, sampler: str, rng: np.random.Generator) -> Design:
    """Plan the coalitions for a budget of `coalitions` (empty and full included)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; use one of {SAMPLERS}")
    if coalitions < min_coalitions(n):
        raise BudgetError(f"budget too small for KernelSHAP ({min_coalitions(n)} coalitions)")
    left = coalitions - 2
    groups = list(range(1, n // 2 + 1))  # size groups {s, n-s}
    mass = {s: _size_weight(n, s) * comb(n, s) * (1 if 2 * s == n else 2) for s in groups}
    masks: list[np.ndarray] = [np.zeros((0, n), dtype=bool)]
    weights: list[np.ndarray] = [np.zeros(0)]
    # Enumerate whole groups, largest kernel mass first, while sampling would cover them anyway.
    while groups:
        s = groups[0]
        count = comb(n, s) * (1 if 2 * s == n else 2)
        if count > left or left * mass[s] / sum(mass[g] for g in groups) < count:
            break
        for size in sorted({s, n - s}):
            masks.append(_full_size(n, size))
            weights.append(np.full(comb(n, size), _size_weight(n, size)))
        left -= count
        groups.pop(0)
    enumerated, fixed = np.concatenate(masks), np.concatenate(weights)
    empty = np.zeros(0, dtype=np.int64)
    if not groups:
        return Design(enumerated, fixed, np.zeros((0, n), bool), empty, np.zeros(0), 0)
    if sampler == "kernel":
        q = np.array([mass[s] for s in groups])
    else:  # leverage scores 1/C(n,|S|): every size equally likely
        q = np.array([1.0 if 2 * s == n else 2.0 for s in groups])
    q = q / q.sum()
    sizes = np.array(groups)
    incl = q * np.where(2 * sizes == n, 2, 1) / np.array([comb(n, int(s)) for s in sizes])
    seen: set[bytes] = set()
    rows: list[np.ndarray] = []
    draws: list[np.ndarray] = []  # [pairs, 2, n] accepted draws, in order
    draw_groups: list[np.ndarray] = []
    n_pairs = 0
    for _ in range(64):  # rounds; late rounds mostly hit coalitions already drawn
        if left < 2:
            break
        batch = max(left, 16)
        g = rng.choice(len(groups), size=batch, p=q)
        picked = np.argsort(rng.random((batch, n)), axis=1) < sizes[g][:, None]
        pairs = np.stack([picked, ~picked], axis=1)  # [batch, 2, n]
        canonical = np.where(picked[:, :1], picked, ~picked)  # one key per complement pair
        packed = np.packbits(canonical, axis=1)
        keys = packed.view(f"V{packed.shape[1]}").ravel().tolist()
        accepted = 0
        for key, pair in zip(keys, pairs, strict=True):
            if key not in seen:
                if left < 2:
                    break
                seen.add(key)
                rows.extend(pair)
                left -= 2
            accepted += 1
        draws.append(pairs[:accepted])
        draw_groups.append(g[:accepted])
        n_pairs += accepted
    if not rows:
        return Design(enumerated, fixed, np.zeros((0, n), bool), empty, np.zeros(0), 0)
    sampled = np.stack(rows)
    all_draws = np.concatenate(draws).reshape(-1, n)  # [2 * pairs, n]
    packed_rows = np.packbits(sampled, axis=1)
    index = {
        k: i for i, k in enumerate(packed_rows.view(f"V{packed_rows.shape[1]}").ravel().tolist())
    }
    packed_draws = np.packbits(all_draws, axis=1)
    coalition = np.array(
        [index[k] for k in packed_draws.view(f"V{packed_draws.shape[1]}").ravel().tolist()]
    )
    kernel_w = np.array([_size_weight(n, s) for s in range(n + 1) if 0 < s < n])
    draw_w = kernel_w[all_draws.sum(axis=1) - 1] / np.repeat(incl[np.concatenate(draw_groups)], 2)
    return Design(
        enumerated,
        fixed,
        sampled,
        coalition,
        draw_w,
        n_pairs,
    )


def _system(
    masks: np.ndarray, y: np.ndarray, total: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Normal equations of the regression with phi_n = total - sum(phi_<n) eliminated."""
    z = masks.astype(np.float64)
    x = z[:, :-1] - z[:, -1:]
    target = y - z[:, -1:] * total[None, :]
    xw = x * weights[:, None]
    return xw.T @ x, xw.T @ target


def _solve(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Coefficients from the small (n-1)^2 system; lstsq tolerates rank deficiency. [n, k]"""
    head, *_ = np.linalg.lstsq(a, b, rcond=None)
    return np.concatenate([head, total[None, :] - head.sum(axis=0, keepdims=True)])


def kernel(recorder: GameRecorder, rng: np.random.Generator, sampler: str = "kernel") -> Estimate:
    """KernelSHAP with paired sampling, exact small sizes and the efficiency constraint.

    The standard error comes from a delete-a-group jackknife over the sampled pairs.
    """
    n = recorder.n_players
    remaining = recorder.remaining
    budget = (1 << n) if remaining is None else min(remaining, 1 << n)
    plan = design(n, budget, sampler, rng)
    ends = np.zeros((2, n), dtype=bool)
    ends[1] = True
    # The plan's coalitions are distinct by construction: skip the memo's hashing.
    values = recorder.evaluate_distinct(np.concatenate([ends, plan.enumerated, plan.sampled]))
    base, full = values[0], values[1]
    total = full - base
    y = values[2:] - base[None, :]
    with _blas().limit(limits=1, user_api="blas"):  # tiny products; BLAS threads only contend
        phi, error = _fit(plan, y, total)
    return Estimate(
        values=recorder.shape_out(phi),
        base_value=recorder.shape_out(base),
        full_value=recorder.shape_out(full),
        exact=plan.exact,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="kernel",
        error_std=None if error is None else recorder.shape_out(error),
    )


def _fit(plan: Design, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Solve the regression; jackknife standard errors when coalitions were sampled."""
    e = plan.enumerated.shape[0]
    a, b = _system(plan.enumerated, y[:e], total, plan.enumerated_weights)
    error = None
    if not plan.exact:
        # Sampled rows one per draw, in draw order; pairs are i.i.d., so contiguous blocks
        # of pairs are the jackknife groups.
        draws = plan.sampled[plan.draw_coalition]
        y_draws = y[e:][plan.draw_coalition]
        w = plan.draw_weight / plan.n_pairs
        groups = min(N_JACKKNIFE, plan.n_pairs)
        bounds = np.linspace(0, plan.n_pairs, groups + 1).astype(int) * 2
        parts = [
            _system(draws[lo:hi], y_draws[lo:hi], total, w[lo:hi]) for lo, hi in pairwise(bounds)
        ]
        a_s = sum(p[0] for p in parts)
        b_s = sum(p[1] for p in parts)
        if groups > 1:
            sizes = np.diff(bounds) / 2
            loo = np.stack(
                [
                    _solve(
                        a + (a_s - ag) * plan.n_pairs / (plan.n_pairs - m),
                        b + (b_s - bg) * plan.n_pairs / (plan.n_pairs - m),
                        total,
                    )
                    for (ag, bg), m in zip(parts, sizes, strict=True)
                ]
            )
            spread = ((loo - loo.mean(axis=0)) ** 2).sum(axis=0) * (groups - 1) / groups
            error = np.sqrt(spread)
        a, b = a + a_s, b + b_s
    return _solve(a, b, total), error
