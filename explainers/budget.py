"""Default budgets, in model evaluations (coalitions times rows per coalition)."""

from __future__ import annotations

from explainers.estimators.exact import MAX_PLAYERS


def default_budget(n_players: int, cost: int = 1, estimator: str = "auto") -> int:
    """All 2^n coalitions for exact; else shap's 2n + 2048, capped at 2^n (then exact)."""
    coalitions = 2 * n_players + 2048
    if estimator == "exact":
        coalitions = 1 << n_players
    elif n_players <= MAX_PLAYERS:
        coalitions = min(coalitions, 1 << n_players)
    return coalitions * cost
