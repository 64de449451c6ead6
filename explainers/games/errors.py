"""Errors of the explainers package (no torch: app/errors.py maps them to HTTP)."""

from __future__ import annotations


class ExplainerError(Exception):
    """Base error of the explainers package."""


class BudgetError(ExplainerError):
    """The budget cannot pay for what was asked."""


class DeadlineExceeded(ExplainerError):
    """The caller's time limit passed before the work was done."""


class Cancelled(ExplainerError):
    """The caller withdrew the work (a cancelled job): no answer, partial or not, is wanted.
    Not a DeadlineExceeded, so sampling estimators don't turn it into an anytime answer."""


class NotDifferentiableError(ExplainerError):
    """The model gives no input gradients (a remote black box, or a text model)."""
