"""Games: batched value functions over coalitions, and the recorder that meters them.

A game maps a boolean mask array [m, n] (True = player present) to values [m] or [m, k].
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

Game = Callable[[np.ndarray], Any]  # bool [m, n] -> float [m] or [m, k]


class ExplainerError(Exception):
    """Base error of the explainers package."""


class BudgetError(ExplainerError):
    """The budget cannot pay for what was asked."""


class DeadlineExceeded(ExplainerError):
    """The caller's time limit passed before the work was done."""


class Cancelled(ExplainerError):
    """The caller withdrew the work (a cancelled job): no answer, partial or not, is wanted.
    Not a DeadlineExceeded, so sampling estimators don't turn it into an anytime answer."""


# time.monotonic() by which the current explanation must finish (None: no limit). A context
# variable, so it follows the computation into its thread without changing any signature.
_DEADLINE: ContextVar[float | None] = ContextVar("explain_deadline", default=None)


@contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Run the block under a deadline (a time.monotonic() value; None: none)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


# A check that says the work was withdrawn (a job's cancel flag), asked before each model call.
_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("explain_stop", default=None)


@contextmanager
def stop_when(cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """Run the block with a cancel check: once `cancelled()` is true, the next model call
    raises Cancelled. It runs before every batched model call, so it must be cheap."""
    token = _STOP.set(cancelled)
    try:
        yield
    finally:
        _STOP.reset(token)


def has_deadline() -> bool:
    """A deadline or a cancel check is set: long work is cut into short model calls (about
    0.1 s, see estimators/rounds.py) so that either is noticed soon, even inside a round."""
    return _DEADLINE.get() is not None or _STOP.get() is not None


def check_deadline() -> None:
    """Raise DeadlineExceeded once the current deadline has passed, Cancelled once the work
    was withdrawn; long loops call this."""
    at = _DEADLINE.get()
    if at is not None and time.monotonic() > at:
        raise DeadlineExceeded("the time limit (timeout_ms) passed before the answer was ready")
    stop = _STOP.get()
    if stop is not None and stop():
        raise Cancelled("the work was cancelled")


def rows_per_coalition(game: Game) -> int:
    """Model rows one coalition costs (background rows); 1 for a plain callable."""
    return int(getattr(game, "rows_per_coalition", 1))


def all_masks(n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Masks of coalitions start..stop-1 in bit order: bit i of the index = player i. [m, n]"""
    idx = np.arange(start, (1 << n) if stop is None else stop, dtype=np.int64)
    return ((idx[:, None] >> np.arange(n, dtype=np.int64)) & 1).astype(bool)


class GameRecorder:
    """Evaluates a game within a budget, memoising coalitions and counting model rows.

    `budget` is in model evaluations (rows given to the model); one coalition costs
    `rows_per_coalition(game)` of them. Values are returned as float64 [m, k].
    """

    def __init__(self, game: Game, n_players: int, budget: int | None = None) -> None:
        self.game = game
        self.n_players = n_players
        self.cost = rows_per_coalition(game)
        self.budget = budget
        self.n_coalitions = 0
        self.n_outputs: int | None = None
        self.squeeze = False
        self._memo: dict[bytes, np.ndarray] = {}

    @property
    def n_evaluations(self) -> int:
        return self.n_coalitions * self.cost

    @property
    def remaining(self) -> int | None:
        """Coalitions still affordable (None = unlimited)."""
        if self.budget is None:
            return None
        return self.budget // self.cost - self.n_coalitions

    def _raw(self, masks: np.ndarray) -> np.ndarray:
        if masks.shape[0] == 0:
            return np.zeros((0, self.n_outputs or 1))
        check_deadline()
        rem = self.remaining
        if rem is not None and masks.shape[0] > rem:
            raise BudgetError(
                f"{masks.shape[0]} coalitions requested but only {rem} fit in the budget"
            )
        out = np.asarray(self.game(masks), dtype=np.float64)
        if out.ndim == 1:
            self.squeeze = True
            out = out[:, None]
        if out.shape[0] != masks.shape[0]:
            raise ExplainerError(f"game returned {out.shape[0]} values for {masks.shape[0]} masks")
        self.n_outputs = out.shape[1]
        self.n_coalitions += masks.shape[0]
        return out

    def evaluate_distinct(self, masks: np.ndarray) -> np.ndarray:
        """Evaluate masks known to be distinct and new, bypassing the memo. [m, k]"""
        return self._raw(np.asarray(masks, dtype=bool))

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        """Evaluate masks, paying only for coalitions not seen before. [m, k]"""
        masks = np.asarray(masks, dtype=bool)
        if masks.shape[0] == 0:
            return self._raw(masks)
        packed = np.packbits(masks, axis=1)
        uniq, first, inverse = np.unique(
            packed.view(f"V{packed.shape[1]}").ravel(), return_index=True, return_inverse=True
        )
        keys = uniq.tolist()
        todo = [i for i, key in enumerate(keys) if key not in self._memo]
        if todo:
            values = self._raw(masks[first[todo]])
            self._memo.update(zip((keys[i] for i in todo), values, strict=True))
        table = np.stack([self._memo[key] for key in keys])
        return table[inverse.ravel()]

    def shape_out(self, values: np.ndarray) -> np.ndarray:
        """Drop the output axis again when the game returned scalars."""
        return values[..., 0] if self.squeeze else values
