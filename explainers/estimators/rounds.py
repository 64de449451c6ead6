"""Sampling in rounds: anytime answers at a deadline, stopping at a precision target, and the
race that picks the sampled estimator reaching a target first.

A sampled estimator is a generator of `Round`s. Round r raises the estimator's own coalitions to
about FIRST_ROUND * n * 2^r (all earlier samples kept), so the first round is small and finishes
early and the work per round doubles. The schedule depends only on the seed and the budget, so a
complete answer is the same with or without a deadline or a target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace

import numpy as np

from explainers.estimators.base import Estimate, Precision, Target
from explainers.games import BudgetError, DeadlineExceeded, GameRecorder, has_deadline
from explainers.games.deadlines import time_left

FIRST_ROUND = 8  # coalitions per player in the first round
MIN_SAMPLES = 16  # permutations / coalition pairs before a target counts as reached
PILOT_ROUNDS = 3  # race: rounds of each contender before the cheaper one goes on alone
SLICE_S = 0.1  # under a deadline, model calls of about this long (the deadline is seen between)
FIRST_SLICE = 256  # coalitions of the first call, before the rate is measured
# Under a deadline the last completed round must still be fitted (KernelSHAP's regression and
# jackknife: about 2 s per million coalitions of 64 players): sampling stops while the time left
# is under RESERVE_FACTOR x the fit's measured cost, timed once on the first round of at least
# TIMED_FROM coalitions (a few ms).
TIMED_FROM = 4096
RESERVE_FACTOR = 2.0
_RESERVE: ContextVar[float] = ContextVar("fit_reserve", default=0.0)


@dataclass(frozen=True)
class Round:
    """The state after a completed round: its estimate on demand, and how far it got."""

    estimate: Callable[[], Estimate]
    samples: int  # i.i.d. units so far (permutations, coalition pairs); unused when exact
    coalitions: int  # coalitions this estimator has paid for
    index: int  # 1-based round number
    exact: bool = False


def caps(n: int) -> Iterator[int]:
    """Cumulative coalition targets of the rounds: 8n, 16n, 32n, ..."""
    cap = FIRST_ROUND * max(n, 1)
    while True:
        yield cap
        cap *= 2


class Slicer:
    """Evaluates a round's coalitions; under a deadline or a cancel check in calls of about
    SLICE_S seconds, so that either is noticed soon, even inside a large round."""

    def __init__(self, recorder: GameRecorder, distinct: bool) -> None:
        self.call = recorder.evaluate_distinct if distinct else recorder
        self.rate: float | None = None  # seconds per coalition, measured
        self.took = 0.0  # seconds of the last call: the next one may take as long

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        if not has_deadline():
            return self.call(masks)
        parts, start = [], 0
        while start < len(masks):
            left = time_left()
            if left is not None and left < _RESERVE.get() + self.took:
                raise DeadlineExceeded("the time left is needed to fit the rounds so far")
            size = FIRST_SLICE if self.rate is None else max(1, int(SLICE_S / self.rate))
            t0 = time.monotonic()
            parts.append(self.call(masks[start : start + size]))
            took = self.took = max(time.monotonic() - t0, 1e-6)
            self.rate = took / max(len(parts[-1]), 1)
            start += size
        return np.concatenate(parts) if parts else self.call(masks)


def _finish(
    last: Round,
    est: Estimate | None,
    recorder: GameRecorder,
    target: Target | None,
    partial: bool,
    reached: bool,
) -> Estimate:
    est = last.estimate() if est is None else est
    precision = None
    if target is not None:
        worst = target.worst(est)
        precision = Precision(target.se, reached or worst <= target.se, worst, last.index)
    return replace(
        est,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        partial=partial,
        precision=precision,
    )


def _checked(r: Round, target: Target) -> tuple[Estimate | None, bool]:
    """The round's estimate when it can be judged, and whether it meets the target."""
    if not (r.exact or r.samples >= MIN_SAMPLES):
        return None, False
    est = r.estimate()
    return est, target.worst(est) <= target.se


def drive(rounds: Iterator[Round], recorder: GameRecorder, target: Target | None) -> Estimate:
    """Run rounds until the target is met or the budget is spent; at the deadline, the last
    completed round's estimate (partial). DeadlineExceeded only when no round completed."""
    last: Round | None = None
    est: Estimate | None = None
    reached = partial = False
    rate: float | None = None  # seconds of fitting per coalition, measured once
    reserve = _RESERVE.set(0.0)
    try:
        for r in rounds:
            last, est = r, None
            t0 = time.monotonic()
            if target is not None:
                est, reached = _checked(r, target)
                if reached:
                    break
            if time_left() is not None and not r.exact and r.coalitions >= TIMED_FROM:
                if rate is None or est is not None:
                    est = r.estimate() if est is None else est
                    rate = (time.monotonic() - t0) / r.coalitions
                _RESERVE.set(RESERVE_FACTOR * rate * r.coalitions)
    except DeadlineExceeded:
        if last is None:
            raise
        partial = True
    finally:
        _RESERVE.reset(reserve)
    if last is None:
        raise BudgetError("the budget is too small for one round of sampling")
    return _finish(last, est, recorder, target, partial, reached)


def _cost_to_target(r: Round, est: Estimate, target: Target) -> float:
    """Coalitions predicted to reach the target, from the 1/sqrt(samples) law."""
    worst = target.worst(est)
    return r.coalitions * max(worst / target.se, 1.0) ** 2


def race(
    contenders: dict[str, Iterator[Round]], recorder: GameRecorder, target: Target
) -> Estimate:
    """Advance the contenders in lockstep (equal coalitions each): the first to meet the target
    wins; after PILOT_ROUNDS the one predicted to need fewer coalitions goes on alone."""
    last: dict[str, tuple[Round, Estimate | None]] = {}
    live = dict(contenders)
    try:
        for _ in range(PILOT_ROUNDS):
            for name, rounds in list(live.items()):
                r = next(rounds, None)
                if r is None:
                    live.pop(name)
                    continue
                est, reached = _checked(r, target)
                last[name] = (r, est)
                if reached:
                    return _finish(r, est, recorder, target, False, True)
            if not live:
                break
    except DeadlineExceeded:
        if not last:
            raise
        r, est = min(last.values(), key=lambda pair: _judge(pair, target))
        return _finish(r, est, recorder, target, True, False)
    if not last:
        raise BudgetError("the budget is too small for one round of sampling")
    name = min(last, key=lambda k: _judge(last[k], target))
    r, _ = last[name]
    rest = live.get(name, iter(()))
    # The winner's pilot round is where it continues from.
    return drive(_prepend(r, rest), recorder, target)


def _judge(pair: tuple[Round, Estimate | None], target: Target) -> float:
    r, est = pair
    est = r.estimate() if est is None else est
    return _cost_to_target(r, est, target)


def _prepend(first: Round, rest: Iterator[Round]) -> Iterator[Round]:
    yield first
    yield from rest
