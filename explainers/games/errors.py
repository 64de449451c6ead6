"""Errors of the explainers package (no torch); app/errors.py renders them from their own
`status` and `code`."""

from __future__ import annotations


class ExplainerError(Exception):
    """Base error of the explainers package. Every error says what it means to a caller:
    `status` (the HTTP status the service answers with) and `code` (the error body's code)."""

    status = 400
    code = "invalid_option"

    def public_message(self) -> str:
        """The message a caller reads."""
        return str(self)


class BudgetError(ExplainerError):
    """The budget cannot pay for what was asked."""

    code = "budget_too_small"


class DeadlineExceeded(ExplainerError):
    """The caller's time limit passed before the work was done."""


class Cancelled(ExplainerError):
    """The caller withdrew the work (a cancelled job): no answer, partial or not, is wanted.
    Not a DeadlineExceeded, so sampling estimators don't turn it into an anytime answer."""

    status = 503  # withdrawn work: nobody waits for it
    code = "cancelled"


class NotDifferentiableError(ExplainerError):
    """The model gives no input gradients (a remote black box, or a text model)."""

    status = 422
    code = "not_differentiable"
