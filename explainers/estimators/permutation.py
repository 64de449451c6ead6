"""Antithetic permutation sampling with memoised coalitions.

Castro, Gómez, Tejada (2009), "Polynomial calculation of the Shapley value based on
sampling"; the forward/backward chain follows shap's PermutationExplainer.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators.base import Estimate
from explainers.games import BudgetError, DeadlineExceeded, GameRecorder, has_deadline

MAX_PERMUTATIONS = 1 << 16
ROUNDS = 8  # under a deadline, permutations are evaluated in this many rounds (anytime)


def min_coalitions(n: int) -> int:
    """One antithetic pair: empty, full and 2(n-1) chain coalitions."""
    return 2 if n == 1 else 2 * n


def _chains(ranks: np.ndarray) -> np.ndarray:
    """Forward prefixes {rank < j} then backward suffixes {rank >= j}, j = 0..n. [p, 2(n+1), n]"""
    n = ranks.shape[1]
    steps = np.arange(n + 1)[None, :, None]
    forward = ranks[:, None, :] < steps
    return np.concatenate([forward, ~forward], axis=1)


def _keys(ranks: np.ndarray) -> set[bytes]:
    packed = np.packbits(_chains(ranks).reshape(-1, ranks.shape[1]), axis=1)
    return set(packed.view(f"V{packed.shape[1]}").ravel().tolist())


def _plan(n: int, coalitions: int, rng: np.random.Generator) -> np.ndarray:
    """Draw as many permutations as fit in `coalitions` distinct coalitions; returns ranks."""
    seen: set[bytes] = set()
    ranks: list[np.ndarray] = []
    while len(ranks) < MAX_PERMUTATIONS:
        # Each permutation adds at most 2(n-1) new coalitions beyond the shared empty/full
        # ones, so a bulk draw of this size always fits; finish one at a time.
        bulk = (coalitions - max(len(seen), 2)) // max(2 * (n - 1), 1)
        if len(seen) == 1 << n:  # every coalition is paid for: the rest are free, draw at once
            bulk = MAX_PERMUTATIONS
        batch = max(1, min(bulk, MAX_PERMUTATIONS - len(ranks)))
        drawn = np.argsort(rng.permuted(np.tile(np.arange(n), (batch, 1)), axis=1), axis=1)
        new = _keys(drawn) - seen
        if len(seen) + len(new) > coalitions:
            break
        seen |= new
        ranks.extend(drawn)
    if not ranks:
        raise BudgetError(f"budget too small for one permutation ({min_coalitions(n)} needed)")
    return np.stack(ranks)


def permutation(recorder: GameRecorder, rng: np.random.Generator) -> Estimate:
    """Shapley values from forward and reversed (antithetic) permutation chains."""
    n = recorder.n_players
    remaining = recorder.remaining
    ranks = _plan(n, MAX_PERMUTATIONS * 2 * n if remaining is None else remaining, rng)
    chains = _chains(ranks)  # [p, 2(n+1), n]
    p = ranks.shape[0]
    partial = False
    if has_deadline() and p > 1:  # anytime: stop between rounds when time runs out
        done: list[np.ndarray] = []
        for block in np.array_split(np.arange(p), min(ROUNDS, p)):
            try:
                done.append(recorder(chains[block].reshape(-1, n)))
            except DeadlineExceeded:
                if not done:
                    raise
                partial = True
                break
        p = sum(len(d) for d in done) // (2 * (n + 1))
        ranks = ranks[:p]
        values = np.concatenate(done).reshape(p, 2, n + 1, -1)
    else:
        values = recorder(chains.reshape(-1, n)).reshape(p, 2, n + 1, -1)  # [p, fwd/bwd, step, k]
    # Player ranked j enters at forward step j+1 and leaves at backward step j+1.
    fwd_gain = values[:, 0, 1:] - values[:, 0, :-1]  # [p, j, k]
    bwd_gain = values[:, 1, :-1] - values[:, 1, 1:]
    per_perm = np.take_along_axis(fwd_gain + bwd_gain, ranks[:, :, None], axis=1) / 2  # [p, n, k]
    error = per_perm.std(axis=0, ddof=1) / np.sqrt(p) if p > 1 else None
    return Estimate(
        values=recorder.shape_out(per_perm.mean(axis=0)),
        base_value=recorder.shape_out(values[0, 0, 0]),
        full_value=recorder.shape_out(values[0, 0, -1]),
        exact=False,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="permutation",
        error_std=None if error is None else recorder.shape_out(error),
        partial=partial,
    )
