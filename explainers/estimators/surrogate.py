"""A sampled sparse linear surrogate of a game: ContextCite's attributions.

Cohen-Wang, Shah, Georgiev & Madry (2024), "ContextCite: Attributing Model Generation to
Context": random ablations keep each player with probability `keep_prob`; a Lasso on the
standardised presence indicators fits the game's values; its weights (in the game's units) are
the attributions and its intercept is the surrogate's v(empty). Seeded by the caller's rng.
No torch here; sklearn is imported when a surrogate is fitted.
"""

from __future__ import annotations

import numpy as np

from explainers.estimators.base import Estimate
from explainers.explanation import OptionError
from explainers.games import BudgetError, GameRecorder

NAME = "surrogate"


def sample_masks(
    n_players: int, n_samples: int, keep_prob: float, rng: np.random.Generator
) -> np.ndarray:
    """Random ablations: each player present with probability keep_prob. bool [m, n]"""
    return rng.random((n_samples, n_players)) < keep_prob


def fit_lasso(
    masks: np.ndarray, y: np.ndarray, alpha: float, scale: float = 1.0
) -> tuple[np.ndarray, float]:
    """Lasso of y [m] on standardised presence [m, n] (constant columns left as they are):
    weights [n] and intercept in y's units. The fit is on y / scale, weights scaled back."""
    from sklearn.linear_model import Lasso  # heavy; only when a surrogate is fitted

    x = masks.astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    fit = Lasso(alpha=alpha, fit_intercept=True)
    fit.fit((x - mean) / std, y / scale)
    weights = fit.coef_ / std * scale
    intercept = (fit.intercept_ - (fit.coef_ * mean / std).sum()) * scale
    return weights, float(intercept)


def linear_surrogate(
    recorder: GameRecorder,
    rng: np.random.Generator,
    n_samples: int,
    keep_prob: float = 0.5,
    alpha: float = 0.01,
    scale: float = 1.0,
) -> Estimate:
    """Lasso surrogate weights of the recorded game from `n_samples` random ablations.

    The ablations and v(all) go to the game as one batch (a repeated ablation costs nothing:
    the recorder memoises). `scale` divides the values before the fit (ContextCite fits the
    mean per-token log-likelihood: scale = response tokens). values [n] or [n, k];
    base_value is the intercept, full_value v(all).
    """
    n = recorder.n_players
    if n_samples < 2:
        raise BudgetError(f"a linear surrogate needs at least 2 ablations, got {n_samples}")
    if not 0 < keep_prob < 1:
        raise OptionError(f"keep_prob must be between 0 and 1, got {keep_prob}")
    if not (np.isfinite(scale) and scale > 0):
        raise OptionError(f"scale must be a positive number, got {scale}")
    masks = sample_masks(n, n_samples, keep_prob, rng)
    values = recorder(np.vstack([masks, np.ones((1, n), dtype=bool)]))  # [m + 1, k]
    fits = [fit_lasso(masks, values[:-1, c], alpha, scale) for c in range(values.shape[1])]
    weights = np.stack([w for w, _ in fits], axis=1)  # [n, k]
    intercept = np.array([b for _, b in fits])
    return Estimate(
        values=recorder.shape_out(weights),
        base_value=recorder.shape_out(intercept),
        full_value=recorder.shape_out(values[-1]),
        exact=False,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator=NAME,
        index="surrogate",
    )


__all__ = ["fit_lasso", "linear_surrogate", "sample_masks"]
