"""Deadlines and cancel checks that follow an explanation into its thread (context variables)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from explainers.games.errors import Cancelled, DeadlineExceeded

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


# A check that says the work was withdrawn (a job's cancel flag, a client that left, a server
# shutting down), asked before each model call.
_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("explain_stop", default=None)


def any_of(*checks: Callable[[], bool] | None) -> Callable[[], bool] | None:
    """One cancel check that is true once any of `checks` is (None entries are skipped)."""
    live = tuple(c for c in checks if c is not None)
    if not live:
        return None
    if len(live) == 1:
        return live[0]
    return lambda: any(check() for check in live)


@contextmanager
def stop_when(cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """Run the block with a cancel check, added to any check already set (a job's cancel flag
    still counts inside a request's): once one is true, the next model call raises Cancelled.
    It runs before every batched model call, so it must be cheap."""
    token = _STOP.set(any_of(_STOP.get(), cancelled))
    try:
        yield
    finally:
        _STOP.reset(token)


def time_left() -> float | None:
    """Seconds until the current deadline (negative once passed); None without one."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()


def has_deadline() -> bool:
    """A deadline or a cancel check is set: long work is cut into short model calls (about
    0.1 s, see estimators/rounds.py) so that either is noticed soon, even inside a round."""
    return _DEADLINE.get() is not None or _STOP.get() is not None


def check_deadline() -> None:
    """Raise DeadlineExceeded once the current deadline has passed, Cancelled once the work
    was withdrawn; long loops call this."""
    stop = _STOP.get()  # first: withdrawn work wants no answer, not even a partial one
    if stop is not None and stop():
        raise Cancelled("the work was cancelled")
    at = _DEADLINE.get()
    if at is not None and time.monotonic() > at:
        raise DeadlineExceeded("the time limit (timeout_ms) passed before the answer was ready")
