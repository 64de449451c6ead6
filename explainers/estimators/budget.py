"""Default budgets, in model evaluations (coalitions times rows per coalition), and rows per
model call from the model's memory budget (MAX_BATCH_BYTES, models/base.py rows_per_pass)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from explainers.estimators import exact
from explainers.games.errors import BudgetError

if TYPE_CHECKING:
    from models.base import Model

TARGET_FACTOR = 64  # with a precision target, the default budget is this many times the usual
TARGET_CEILING = 1 << 24  # ... and at most this many model evaluations (the service's MAX_BUDGET)

# The caller's ceiling on default budgets (the service's MAX_BUDGET); a context variable so that
# it reaches the explainer without a setting in the library.
_CEILING: ContextVar[int] = ContextVar("budget_ceiling", default=TARGET_CEILING)


@contextmanager
def ceiling(rows: int) -> Iterator[None]:
    """Bound the generous default budget of precision targets by `rows` model evaluations."""
    token = _CEILING.set(rows)
    try:
        yield
    finally:
        _CEILING.reset(token)


def default_budget(
    n_players: int, cost: int = 1, estimator: str = "auto", target: bool = False
) -> int:
    """All 2^n coalitions for exact; else shap's 2n + 2048, capped at 2^n (then exact).

    With a precision target (the sampling stops when it is met): TARGET_FACTOR times that,
    capped at the ceiling (never below the usual default).
    """
    coalitions = 2 * n_players + 2048
    if estimator == "exact" or exact.fits(n_players, coalitions):
        coalitions = 1 << n_players
    if target and estimator != "exact":
        # Not capped at 2^n: the estimators stop there themselves (kernel: exact; permutation:
        # further permutations are free), and auto's race spends some on the loser first.
        generous = TARGET_FACTOR * coalitions
        coalitions = max(coalitions, min(generous, _CEILING.get() // max(cost, 1)))
    return coalitions * cost


class MemoryBudgetError(BudgetError):
    """One row needs more working memory than a model call may take (MAX_BATCH_BYTES)."""


def rows_per_call(model: Model, backward: bool = False, cap: int | None = None) -> int:
    """Rows per model call (with the backward pass to the input when `backward`): the
    model's `rows_per_pass`, at most `cap`. Raises MemoryBudgetError (HTTP 400) before any
    model call when one row cannot fit."""
    from models.base import RowTooLargeError  # torch: not for the estimators' imports

    try:
        rows = model.rows_per_pass(backward)
    except RowTooLargeError as exc:
        raise MemoryBudgetError(str(exc)) from None
    return rows if cap is None else max(1, min(rows, cap))
