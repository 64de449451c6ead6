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
    """Every coalition of one size. [C(n, size), n]"""
    members = np.array(list(combinations(range(n), size)), dtype=np.int64).reshape(-1, size)
    masks = np.zeros((members.shape[0], n), dtype=bool)
    np.put_along_axis(masks, members, True, axis=1)
    return masks


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
    seen: dict[bytes, int] = {}  # canonical pair key -> pair row (rows 2p and 2p+1)
    rows: list[np.ndarray] = []  # [pairs_i, 2, n] new distinct pairs per round
    draw_pairs: list[np.ndarray] = []  # pair row of every accepted draw, in draw order
    draw_groups: list[np.ndarray] = []
    for _ in range(64):  # rounds; late rounds mostly hit coalitions already drawn
        if left < 2:
            break
        batch = max(left, 16)
        g = rng.choice(len(groups), size=batch, p=q)
        picked = np.argsort(rng.random((batch, n)), axis=1) < sizes[g][:, None]
        canonical = np.where(picked[:, :1], picked, ~picked)  # one key per complement pair
        packed = np.packbits(canonical, axis=1)
        uniq, first, inverse = np.unique(
            packed.view(f"V{packed.shape[1]}").ravel(), return_index=True, return_inverse=True
        )
        known = np.array([seen.get(k, -1) for k in uniq.tolist()], dtype=np.int64)
        fresh = np.flatnonzero(known < 0)
        fresh = fresh[np.argsort(first[fresh])]  # in order of first draw
        take = fresh[: left // 2]
        # Draws are accepted in order up to the first new pair that no longer fits.
        cutoff = int(first[fresh[left // 2]]) if len(fresh) > left // 2 else batch
        known[take] = len(seen) + np.arange(len(take))
        seen.update(zip(uniq[take].tolist(), known[take].tolist(), strict=True))
        new = canonical[first[take]]
        rows.append(np.stack([new, ~new], axis=1))
        draw_pairs.append(known[inverse.ravel()[:cutoff]])
        draw_groups.append(g[:cutoff])
        left -= 2 * len(take)
    if not seen:
        return Design(enumerated, fixed, np.zeros((0, n), bool), empty, np.zeros(0), 0)
    sampled = np.concatenate(rows).reshape(-1, n)
    pair_rows = np.concatenate(draw_pairs)
    n_pairs = pair_rows.shape[0]
    coalition = np.stack([2 * pair_rows, 2 * pair_rows + 1], axis=1).ravel()
    all_draws = sampled[coalition]  # the two members of each pair weigh the same
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
            scale = plan.n_pairs / (plan.n_pairs - np.diff(bounds) / 2)[:, None, None]
            a_loo = a + (a_s - np.stack([p[0] for p in parts])) * scale  # [groups, n-1, n-1]
            b_loo = b + (b_s - np.stack([p[1] for p in parts])) * scale  # [groups, n-1, k]
            head = np.linalg.pinv(a_loo, rcond=1e-12, hermitian=True) @ b_loo
            loo = np.concatenate([head, total - head.sum(axis=1, keepdims=True)], axis=1)
            spread = ((loo - loo.mean(axis=0)) ** 2).sum(axis=0) * (groups - 1) / groups
            error = np.sqrt(spread)
        a, b = a + a_s, b + b_s
    return _solve(a, b, total), error
