"""Per instance, one index of the `shapley` explainer: the game, an estimator, the outputs.

The estimator is the request's `Choice` from the estimator table (estimators/registry.py),
resolved once per player count before any model call (`choices`). SV: `shapley_values`; API
(aggregated positive interactions) and the other interaction indices: the choice's runner.
`pick` turns a multi-output estimate into one Explanation (shared with cocoa and rankshap).
With several targets, SV and API give every output from one estimate (the same coalitions);
interaction indices explain one output per run, over a game memoised across the runs (`Memo`),
so a coalition is paid for once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from explainers.estimators.base import Estimate
from explainers.estimators.library import interaction_values, shapley_values_chosen
from explainers.estimators.registry import Ask, Choice, choose
from explainers.explanation import Explanation
from explainers.games import Game, GameRecorder, rows_per_coalition
from models.modality import Modality

if TYPE_CHECKING:
    from explainers.shapley.explainer import ShapleyOptions
    from models.base import Model


class Run(NamedTuple):
    """What every instance of one request shares."""

    options: ShapleyOptions
    budget: int  # per instance, model evaluations
    seed: int
    model: Model
    target: int | tuple[int, ...] | None  # a tuple: several outputs, in the order asked
    choices: Mapping[int, Choice]  # the estimator, resolved once per player count


def _ask(options: ShapleyOptions, n_players: int) -> Ask:
    """What the index asks of the estimator on n players."""
    if options.index == "API":
        return Ask("API", variant=options.api_variant)
    if options.index == "SV":
        return Ask(sampler=options.sampler)
    return Ask(options.index, True, min(options.max_order, n_players))


def choices(
    options: ShapleyOptions, model: Model, games: Sequence[tuple[Game, int]], budget: int
) -> dict[int, Choice]:
    """The request's estimator for each player count (smallest first), from the table: raises
    before any model call when it cannot answer."""
    first: dict[int, Game] = {}
    for game, n in games:
        first.setdefault(n, game)
    text = model.modality == Modality.TEXT  # gp: costly for SV, by name for interactions
    return {
        n: choose(
            _ask(options, n),
            options.estimator,
            n,
            budget,
            rows_per_coalition(first[n]),
            target=options.target_se is not None,
            text=text,
        )
        for n in sorted(first)
    }


def wanted(target: int | tuple[int, ...] | None) -> tuple[int | None, ...]:
    """The outputs of one instance's explanations (None: the explainer's default)."""
    return target if isinstance(target, tuple) else (target,)


def shared(est: Estimate, model: Model, target: int | tuple[int, ...] | None) -> list[Explanation]:
    """One explanation per output asked for, from one estimate: the first carries its model
    evaluations, the others add none."""
    picked = [pick(est, model, t) for t in wanted(target)]
    return picked[:1] + [replace(e, n_model_evals=0) for e in picked[1:]]


def shapley_one(game: Game, n_players: int, run: Run) -> list[Explanation]:
    options, budget, seed, model, target, _ = run
    # target_se watches the explained output; with several, every output (a superset)
    watch = None if isinstance(target, tuple) else target
    est, chosen = shapley_values_chosen(
        game,
        n_players,
        estimator=options.estimator,
        budget=budget,
        seed=seed,
        sampler=options.sampler,
        target_se=options.target_se,
        target_output=watch if target is not None else partial(explained, model),
        choice=run.choices[n_players],
        # auto's measured choice, kept per model version and game size (estimators/auto.py)
        remember=(model.name, model.version, n_players, budget, rows_per_coalition(game)),
    )
    if chosen is None:
        return shared(est, model, target)
    return [
        replace(e, details={**(e.details or {}), "auto": chosen})
        for e in shared(est, model, target)
    ]


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
        warnings=est.warnings,
    )


def api_one(game: Game, n_players: int, run: Run) -> list[Explanation]:
    options, budget, seed, model, target, choices = run
    recorder = GameRecorder(game, n_players, budget)
    est = choices[n_players].run(recorder, np.random.default_rng(seed), _ask(options, n_players))
    return shared(est, model, target)


class Memo:
    """A game memoised across the runs of several outputs: a coalition an earlier run
    evaluated is not evaluated again; `rows` counts the model rows actually spent."""

    def __init__(self, game: Game) -> None:
        self.game = game
        self.rows_per_coalition = rows_per_coalition(game)
        self.rows = 0
        self._memo: dict[bytes, np.ndarray] = {}

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)
        keys = [row.tobytes() for row in np.packbits(masks, axis=1)]
        new = {k: i for i, k in enumerate(keys) if k not in self._memo}
        if new:
            values = np.asarray(self.game(masks[list(new.values())]), dtype=np.float64)
            self._memo.update(zip(new, values, strict=True))
            self.rows += len(new) * self.rows_per_coalition
        if not keys:
            return np.zeros((0,))
        return np.stack([self._memo[k] for k in keys])


def interactions_one(game: Game, n_players: int, run: Run) -> list[Explanation]:
    """One interaction run per output asked for (over one memo when there are several)."""
    if not isinstance(run.target, tuple):
        return [_interactions(game, n_players, run, run.target)]
    memo = Memo(game)
    out = []
    for t in run.target:
        before = memo.rows
        explanation = _interactions(memo, n_players, run, t)
        out.append(replace(explanation, n_model_evals=memo.rows - before))
    return out


def _interactions(game: Game, n_players: int, run: Run, target: int | None) -> Explanation:
    """One output's interaction terms (the choice's text caveat, prior_misfit, included)."""
    options, _, seed, model, _, choices = run
    output = target if target is not None or model.task == "classification" else 0
    res = interaction_values(
        game,
        n_players,
        index=options.index,
        max_order=min(options.max_order, n_players),
        seed=seed,
        output=output,
        choice=choices[n_players],
    )
    return pick(res, model, target)
