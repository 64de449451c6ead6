"""Antithetic permutation sampling with memoised coalitions.

Castro, Gómez, Tejada (2009), "Polynomial calculation of the Shapley value based on
sampling"; the forward/backward chain follows shap's PermutationExplainer.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np

from explainers.estimators.base import Estimate, Target
from explainers.estimators.rounds import Round, Slicer, caps, drive
from explainers.explanation import Caveat
from explainers.games import BudgetError, GameRecorder

MAX_PERMUTATIONS = 1 << 16
CALIBRATED_FROM = 32  # permutations; fewer: error_std is not calibrated (issue 28) ...
UNIFORM = 1e-9  # ... and, there, a player whose draws agree to this times their range a floor


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


def _plan(
    n: int, coalitions: int, rng: np.random.Generator, seen: set[bytes], room: int
) -> np.ndarray:
    """Draw at most `room` permutations while the distinct coalitions (`seen`, updated) stay
    within `coalitions`; returns their ranks [p, n], possibly none."""
    ranks: list[np.ndarray] = []
    while len(ranks) < room:
        # Each permutation adds at most 2(n-1) new coalitions beyond the shared empty/full
        # ones, so a bulk draw of this size always fits; finish one at a time.
        bulk = (coalitions - max(len(seen), 2)) // max(2 * (n - 1), 1)
        if len(seen) == 1 << n:  # every coalition is paid for: the rest are free, draw at once
            if not ranks:
                bulk = room
            else:
                break  # end the round here; later rounds go on doubling (free)
        if bulk <= 0 and len(seen) >= coalitions:
            break
        batch = max(1, min(bulk, room - len(ranks)))
        drawn = np.argsort(rng.permuted(np.tile(np.arange(n), (batch, 1)), axis=1), axis=1)
        new = _keys(drawn) - seen
        if len(seen) + len(new) > coalitions:
            break
        seen |= new
        ranks.extend(drawn)
    return np.stack(ranks) if ranks else np.zeros((0, n), dtype=np.int64)


def permutation(
    recorder: GameRecorder, rng: np.random.Generator, target: Target | None = None
) -> Estimate:
    """Shapley values from forward and reversed (antithetic) permutation chains, in rounds."""
    return drive(rounds(recorder, rng), recorder, target)


def rounds(recorder: GameRecorder, rng: np.random.Generator) -> Iterator[Round]:
    """Rounds of permutations (see rounds.py); each yields the estimate of all so far."""
    n = recorder.n_players
    seen: set[bytes] = set()
    done: list[np.ndarray] = []  # per round: per-permutation values [p_r, n, k]
    ends: list[np.ndarray] = []  # v(empty), v(all) [k] each
    slicer = Slicer(recorder, distinct=False)
    drawn = 0
    for index, cap in enumerate(caps(n), start=1):
        remaining = recorder.remaining
        limit = len(seen) + (MAX_PERMUTATIONS * 2 * n if remaining is None else remaining)
        room = MAX_PERMUTATIONS - drawn
        if len(seen) == 1 << n:  # every coalition is paid for: free permutations, still doubling
            room = min(room, drawn)
        ranks = _plan(n, min(cap, limit), rng, seen, room)
        if ranks.shape[0] == 0:
            if index == 1:
                raise BudgetError(
                    f"budget too small for one permutation ({min_coalitions(n)} needed)"
                )
            return
        p = ranks.shape[0]
        values = slicer(_chains(ranks).reshape(-1, n)).reshape(p, 2, n + 1, -1)
        # Player ranked j enters at forward step j+1 and leaves at backward step j+1.
        fwd_gain = values[:, 0, 1:] - values[:, 0, :-1]  # [p, j, k]
        bwd_gain = values[:, 1, :-1] - values[:, 1, 1:]
        done.append(np.take_along_axis(fwd_gain + bwd_gain, ranks[:, :, None], axis=1) / 2)
        if not ends:
            ends = [values[0, 0, 0], values[0, 0, -1]]
        drawn += p
        yield Round(
            partial(_estimate, recorder, tuple(done), ends[0], ends[1]),
            samples=drawn,
            coalitions=len(seen),
            index=index,
        )
        if drawn >= MAX_PERMUTATIONS:
            return


def _estimate(
    recorder: GameRecorder, done: tuple[np.ndarray, ...], base: np.ndarray, full: np.ndarray
) -> Estimate:
    per_perm = np.concatenate(done)  # [p, n, k]
    p = per_perm.shape[0]
    error = per_perm.std(axis=0, ddof=1) / np.sqrt(p) if p > 1 else None
    if error is not None and p < CALIBRATED_FROM:  # from there, agreeing draws: a dummy
        error = np.maximum(error, _agreement_floor(per_perm))
    warnings = () if p >= CALIBRATED_FROM else (_few_caveat(p),)
    return Estimate(
        values=recorder.shape_out(per_perm.mean(axis=0)),
        base_value=recorder.shape_out(base),
        full_value=recorder.shape_out(full),
        exact=False,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="permutation",
        error_std=None if error is None else recorder.shape_out(error),
        warnings=warnings,
    )


def _agreement_floor(per_perm: np.ndarray) -> np.ndarray:
    """Per player, 3 / p times the range of every drawn marginal contribution where the
    player's p draws all agree, else 0 (issue 28). [n, k]

    A player pivotal in few orderings (a threshold game) can show the same contribution in
    every drawn permutation: the sample standard error is 0 whatever its value. By the rule of
    three the orderings where it differs hold at most a share 3 / p (95%), each moving the mean
    by at most the contributions' range.
    """
    p = per_perm.shape[0]
    spread = np.ptp(per_perm, axis=(0, 1))  # [k] over all players and permutations
    agree = np.ptp(per_perm, axis=0) <= UNIFORM * np.maximum(spread, 1e-300)[None, :]
    return np.where(agree, 3.0 / p * spread[None, :], 0.0)


def _few_caveat(p: int) -> Caveat:
    return Caveat(
        "uncalibrated_error",
        f"error_std is a standard error over {p} permutations, fewer than {CALIBRATED_FROM}: "
        "too few to see skewed marginal contributions (a player pivotal in few orderings), so "
        "players whose draws all agree get a rule-of-three floor, not an estimate; raise the "
        "budget",
    )
