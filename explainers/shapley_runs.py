"""Per instance, one index of the `shapley` explainer: the game, an estimator, one output.

SV: `shapley_values`; API (aggregated positive interactions): `api_allocation`; the other
interaction indices: `interactions`. `pick` turns a multi-output estimate into one Explanation
(shared with cocoa and rankshap).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from explainers import api_allocation, interactions
from explainers.estimators.base import Estimate
from explainers.estimators.registry import shapley_values
from explainers.explanation import Caveat, Explanation, OptionError
from explainers.games import Game, GameRecorder

if TYPE_CHECKING:
    from explainers.shapley import ShapleyOptions
    from models.base import Model


class Run(NamedTuple):
    """What every instance of one request shares."""

    options: ShapleyOptions
    budget: int  # per instance, model evaluations
    seed: int
    model: Model
    target: int | None


def shapley_one(game: Game, n_players: int, run: Run) -> Explanation:
    options, budget, seed, model, target = run
    est = shapley_values(
        game,
        n_players,
        estimator=options.estimator,
        budget=budget,
        seed=seed,
        sampler=options.sampler,
        target_se=options.target_se,
        target_output=target if target is not None else partial(explained, model),
        costly=model.modality == "text",
    )
    return pick(est, model, target)


def explained(model: Model, full_value: np.ndarray) -> int:
    """The output explained without a target: the predicted class, or the single output."""
    return int(np.argmax(full_value)) if model.task == "classification" else 0


def pick(est: Estimate, model: Model, target: int | None) -> Explanation:
    """One output of an estimate as an Explanation: the estimate's own output when it has one
    (interaction indices), else the target, else the predicted class. Its interactions become
    the response's `interactions` field, the one place where a player tuple is written "i,j"."""
    if est.output is not None:  # values [n] of that output already
        out = est.output

        def column(a: np.ndarray) -> np.ndarray:
            return a

    else:  # values [n, k]
        out = target if target is not None else explained(model, np.atleast_1d(est.full_value))

        def column(a: np.ndarray) -> np.ndarray:
            return a[..., out]

    details = None
    if est.precision is not None:
        worst = 0.0 if est.error_std is None else float(np.max(column(est.error_std)))
        details = {"precision": {**est.precision.as_dict(), "max_error_std": worst}}
    interactions = None
    if est.interactions is not None:
        interactions = {
            "index": est.index,
            "max_order": est.max_order,
            "values": {",".join(map(str, key)): v for key, v in est.interactions.items()},
        }
    return Explanation(
        output_index=out,
        values=column(est.values),
        base_value=float(column(est.base_value)),
        instance_output_value=float(column(est.full_value)),
        exact=est.exact,
        n_model_evals=est.n_evaluations,
        estimator=est.estimator,
        error_std=None if est.error_std is None else column(est.error_std),
        partial=est.partial,
        details=details,
        interactions=interactions,
    )


def api_one(game: Game, n_players: int, run: Run) -> Explanation:
    options, budget, seed, model, target = run
    if options.estimator not in ("auto", "exact", "permutation"):
        raise OptionError("API supports the estimators auto, exact and permutation")
    recorder = GameRecorder(game, n_players, budget)
    est = api_allocation.api_values(
        recorder, np.random.default_rng(seed), options.api_variant, options.estimator
    )
    return pick(est, model, target)


def interactions_one(game: Game, n_players: int, run: Run) -> Explanation:
    options, budget, seed, model, target = run
    output = target if target is not None or model.task == "classification" else 0
    res = interactions.interaction_values(
        game,
        n_players,
        index=options.index,
        max_order=min(options.max_order, n_players),
        estimator=options.estimator,
        budget=budget,
        seed=seed,
        output=output,
        gp_auto=model.modality != "text",
    )
    explanation = pick(res, model, target)
    if model.modality == "text" and res.estimator == "gp":  # asked for by name
        misfit = Caveat(
            "prior_misfit",
            "gp's prior misses word interactions on text models: its first-order terms can be "
            "biased beyond their error_std (docs/benchmarks.md); from about 64n coalitions "
            "estimator kernel (KernelSHAP-IQ) is more accurate",
        )
        explanation = replace(explanation, warnings=(*explanation.warnings, misfit))
    return explanation
