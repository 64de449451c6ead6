"""The library's entries to the estimators: `shapley_values` (and `shapley_values_chosen`, with
how `auto` chose), `interaction_values` and `api_values`. Each resolves the request's estimator
from the table once (`registry.choose`, unless a `Choice` is passed down) and runs it on a
`GameRecorder`; `auto` on Shapley values fits KernelSHAP's coalitions by kernel's or gp's fit
by measured cost (auto.py). References: registry.py.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import numpy as np

from explainers.estimators import auto, gp, interactions, kernel, permutation, rounds
from explainers.estimators.base import Estimate, OutputRule, Precision, Target
from explainers.estimators.budget import default_budget
from explainers.estimators.registry import (
    ESTIMATORS,
    GP_BELOW,
    Ask,
    Choice,
    choose,
    renamed_caveat,
)
from explainers.explanation import OptionError
from explainers.games import Game, GameRecorder, rows_per_coalition

_SV_ROWS = {row.name: row for row in ESTIMATORS}


def shapley_values(
    game: Game,
    n_players: int,
    *,
    estimator: str = "auto",
    budget: int | None = None,
    seed: int = 0,
    sampler: str = "kernel",
    target_se: float | None = None,
    target_output: OutputRule = None,
    costly: bool = False,
    choice: Choice | None = None,
) -> Estimate:
    """Shapley values of `game` (bool masks [m, n] -> values [m] or [m, k]).

    `costly`: each coalition costs far more than gp's fit (choose_estimator; text models).
    `choice`: the request's estimator, resolved already (`choose`); it then replaces
    `estimator`, `budget` and `costly`.

    `budget` counts model evaluations: coalitions times `game.rows_per_coalition` (default 1).
    `target_se`: sample in rounds until every error_std of `target_output` (an index, a rule
    from v(all) to an index, or None: all outputs) is at most this, or the budget is spent.
    """
    return shapley_values_chosen(
        game,
        n_players,
        estimator=estimator,
        budget=budget,
        seed=seed,
        sampler=sampler,
        target_se=target_se,
        target_output=target_output,
        costly=costly,
        choice=choice,
    )[0]


def shapley_values_chosen(
    game: Game,
    n_players: int,
    *,
    estimator: str = "auto",
    budget: int | None = None,
    seed: int = 0,
    sampler: str = "kernel",
    target_se: float | None = None,
    target_output: OutputRule = None,
    costly: bool = False,
    choice: Choice | None = None,
    remember: Hashable | None = None,
) -> tuple[Estimate, dict[str, Any] | None]:
    """`shapley_values` and, when `estimator` is auto, how auto chose (details.auto: what it
    measured, predicted and why; auto.py), else None. `choice`: resolved already (`choose`).
    `remember`: what is explained (auto.Chooser's key): its measured choice is kept for it."""
    if n_players < 1:
        raise OptionError("a game needs at least one player")
    if target_se is not None and not (np.isfinite(target_se) and target_se > 0):
        raise OptionError(f"target_se must be a positive number, got {target_se}")
    cost = rows_per_coalition(game)
    target = None if target_se is None else Target(float(target_se), target_output)
    if choice is None:
        if budget is None:
            budget = default_budget(n_players, cost, estimator, target=target is not None)
        choice = choose(
            Ask(), estimator, n_players, budget, cost, target=target is not None, text=costly
        )
    elif (choice.n_players, choice.cost, choice.target) != (n_players, cost, target is not None):
        raise ValueError("the choice was resolved for another game or target")
    estimator, budget, costly = choice.asked, choice.budget, choice.text
    name = "exact" if n_players == 1 else choice.estimator
    is_auto = choice.is_auto
    measure = is_auto and name == "kernel" and target is None and auto.enabled()
    measure = measure and n_players <= gp.MAX_PLAYERS and budget // cost <= gp.MAX_ROWS
    timed = auto.Timed(game) if measure else None
    recorder = GameRecorder(game if timed is None else timed, n_players, budget)
    rng = np.random.default_rng(seed)
    if target is not None and is_auto and name != "exact":
        perm_rng, kernel_rng = (np.random.default_rng(s) for s in rng.integers(2**63, size=2))
        contenders = {
            "permutation": permutation.rounds(recorder, perm_rng),
            "kernel": kernel.rounds(recorder, kernel_rng, sampler),
        }
        est = rounds.race(contenders, recorder, target)
        return est, auto.static(est.estimator, "target_se: the race of permutation and kernel")
    details: dict[str, Any] | None = None
    if timed is not None:  # kernel's plan; kernel's fit or gp's, by measured cost (auto.py)
        chooser = auto.Chooser(timed, n_players, remember)
        est = rounds.drive(
            kernel.rounds(recorder, rng, sampler, fit=chooser, name="auto"), recorder, None
        )
        if chooser.choice is not None:
            est = replace(est, estimator=chooser.choice.chosen)
            details = chooser.choice.as_dict()
        else:  # no fit ran (exact enumeration needs none)
            est = replace(est, estimator="kernel")
    else:
        ask = Ask(sampler=sampler, target=target, seed=seed)
        est = _SV_ROWS[name].run(recorder, rng, ask)
        if is_auto:
            details = auto.static(name, _static_reason(name, n_players, budget // cost, costly))
    if target is not None and est.precision is None:  # exact
        est = replace(est, precision=Precision(target.se, True, 0.0, 1))
    renamed = renamed_caveat(estimator)
    if renamed is not None:
        est = replace(est, warnings=(*est.warnings, renamed))
    return est, details


def interaction_values(
    game: Game,
    n_players: int,
    *,
    index: str,
    max_order: int = 2,
    estimator: str = "auto",
    budget: int | None = None,
    seed: int = 0,
    output: int | None = 0,
    gp_auto: bool = True,
    choice: Choice | None = None,
) -> Estimate:
    """Interaction index values of `game` for one output (`output`; None = v(all)'s argmax):
    `interactions` holds every term of order 1..max_order, `values` the first-order ones.

    `gp_auto` False: text players (TextPolicy): `auto` never picks gp (the explainers pass it for
    text games, where gp's prior misses word interactions: its first-order k-SII terms are
    biased, docs/benchmarks.md) and gp by name carries prior_misfit. `choice`: resolved
    already (`choose`); it then replaces `estimator`, `budget` and `gp_auto`.
    """
    if index not in interactions.INDICES:
        raise OptionError(f"unknown index {index!r}; use one of {interactions.INDICES}")
    if not 1 <= max_order <= n_players:
        raise OptionError(f"max_order must be between 1 and {n_players}")
    ask = Ask(index, True, max_order, output, seed=seed)
    if choice is None:
        cost = rows_per_coalition(game)
        if budget is None:
            budget = default_budget(n_players, cost, "exact" if estimator == "exact" else "auto")
        choice = choose(ask, estimator, n_players, budget, cost, text=not gp_auto)
    recorder = GameRecorder(game, n_players, choice.budget)
    return choice.run(recorder, np.random.default_rng(seed), ask)


def api_values(
    recorder: GameRecorder,
    rng: np.random.Generator,
    variant: str = "chain",
    estimator: str = "auto",
) -> Estimate:
    """API allocation of the recorded game: exact when 2^n fits, else Monte-Carlo (chain)."""
    left = recorder.remaining
    budget = (1 << 62 if left is None else left) * recorder.cost  # None: no limit
    choice = choose(
        Ask("API", variant=variant), estimator, recorder.n_players, budget, recorder.cost
    )
    return choice.run(recorder, rng, Ask("API", variant=variant))


def _static_reason(name: str, n_players: int, coalitions: int, costly: bool) -> str:
    """Why auto chose `name` without measuring (the rule of choose_estimator)."""
    if name == "exact":
        return f"exact: all 2^{n_players} coalitions fit the budget ({coalitions})"
    if name == "gp" and costly:
        return "gp: every coalition is a text model pass, far costlier than gp's fit"
    if name == "gp":
        return (
            f"gp: {coalitions} coalitions < {GP_BELOW}n, where KernelSHAP's regression is "
            "nearly square"
        )
    if n_players > gp.MAX_PLAYERS or coalitions > gp.MAX_ROWS:
        return (
            f"kernel: beyond gp's {gp.MAX_ROWS} coalitions or {gp.MAX_PLAYERS} players "
            "gp is KernelSHAP"
        )
    if not auto.enabled():
        return f"kernel: {auto.ENV}=0 (the static rule: kernel from {GP_BELOW}n)"
    return f"{name}: the static rule"
