"""Monte-Carlo chain API: aggregated positive interactions over sampled permutations.

Chang, Lee & Choi (ICLR 2025); the chain rule and its exact form:
explainers/estimators/api.py.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators.base import Estimate
from explainers.games import BudgetError, GameRecorder


def permutation_chain(recorder: GameRecorder, rng: np.random.Generator) -> Estimate:
    """Monte-Carlo chain API over sampled permutations (n(n+1)/2 coalitions each)."""
    n = recorder.n_players
    per_perm = n * (n + 1) // 2
    remaining = recorder.remaining
    n_perms = 64 if remaining is None else (remaining - 1) // per_perm
    if n_perms < 1:
        raise BudgetError(f"API needs at least {per_perm + 1} coalitions for {n} players")
    eye = np.eye(n, dtype=bool)
    estimates = []
    base = full = np.zeros(0)
    for _ in range(n_perms):
        order = rng.permutation(n)
        prefixes = np.zeros((n + 1, n), dtype=bool)  # prefix_m = first m players of order
        for m in range(1, n + 1):
            prefixes[m] = prefixes[m - 1]
            prefixes[m, order[m - 1]] = True
        # Coalition prefix_m + order[r] for m <= r: grid[r, m]
        grid = prefixes[None, :n, :] | eye[order][:, None, :]  # [r, m, n]
        u = recorder(prefixes)  # [n+1, k]
        w = recorder(grid.reshape(-1, n)).reshape(n, n, -1)  # [r, m, k]
        psi = np.zeros((n, u.shape[1]))
        for r in range(n):
            gains = w[r, 1 : r + 1] - w[r, :r] - u[1 : r + 1] + u[:r]
            psi[order[r]] = w[r, 0] - u[0] + np.maximum(gains, 0).sum(axis=0)
        estimates.append(psi)
        base, full = u[0], u[-1]
    stacked = np.stack(estimates)
    error = stacked.std(axis=0, ddof=1) / np.sqrt(len(estimates)) if len(estimates) > 1 else None
    return Estimate(
        stacked.mean(axis=0),
        base,
        full,
        False,
        recorder.n_evaluations,
        recorder.n_coalitions,
        "permutation",
        error,
        index="API",
    )
