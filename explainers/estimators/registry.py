"""The estimator list, `choose_estimator` and `shapley_values`: the one entry to the estimators.

Shapley (1953); KernelSHAP: Lundberg & Lee (2017); permutation sampling: Castro et al. (2009).
"Exact when 2^n fits" is `exact.fits`. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import numpy as np

from explainers.estimators import (
    auto,
    exact,
    gp,
    kernel,
    msr,
    partition,
    permutation,
    regression,
    rounds,
)
from explainers.estimators.base import Estimate, OutputRule, Precision, Target
from explainers.estimators.budget import default_budget
from explainers.explanation import Caveat, OptionError
from explainers.games import BudgetError, Game, GameRecorder, rows_per_coalition

# Names for options models (pydantic Literals): the estimators below, their old names still
# accepted (RENAMED), and the kernel's samplers.
EstimatorName = Literal[
    "exact", "permutation", "kernel", "surrogate_kernel", "msr", "gp", "partition", "regression"
]
EstimatorChoice = Literal["auto", EstimatorName]
SamplerName = Literal["kernel", "leverage"]


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    run: Callable[[GameRecorder, np.random.Generator, str, Target | None], Estimate]
    min_coalitions: Callable[[int], int]


# The Shapley-value estimators, by name: add one here and to EstimatorName.
ESTIMATORS: tuple[EstimatorSpec, ...] = (
    EstimatorSpec("exact", lambda rec, rng, _s, _t: exact.exact(rec, rng), exact.min_coalitions),
    EstimatorSpec(
        "permutation",
        lambda rec, rng, _s, t: permutation.permutation(rec, rng, t),
        permutation.min_coalitions,
    ),
    EstimatorSpec("kernel", kernel.kernel, kernel.min_coalitions),
    # cubic-surrogate-adjusted KernelSHAP (inspired by Witter et al. 2025; not their estimator)
    EstimatorSpec("surrogate_kernel", regression.surrogate_kernel, regression.min_coalitions),
    # Witter, Liu & Musco (2025): XGBoost surrogate + unbiased maximum-sample-reuse residual
    EstimatorSpec("msr", lambda rec, rng, _s, t: msr.msr(rec, rng, t), msr.min_coalitions),
    EstimatorSpec("gp", gp.gp, gp.min_coalitions),
    # Owen values over game.hierarchy (not Shapley values: never chosen by auto)
    EstimatorSpec(
        "partition",
        lambda rec, rng, _s, t: partition.partition(rec, rng, t),
        partition.min_coalitions,
    ),
)
_BY_NAME = {spec.name: spec for spec in ESTIMATORS}
# Old names, accepted for one release after a rename: the answer names the new one
# (Estimate.estimator) and carries a deprecated_name warning. Remove an entry (and its name in
# EstimatorName) in the release after the one that renamed it.
RENAMED: dict[str, str] = {
    # issue 28: not Witter et al.'s regression-adjusted estimator (regression.py says how)
    "regression": "surrogate_kernel",
}
GP_BELOW = 3  # auto: gp below this many coalitions per player (else kernel)
if len(_BY_NAME) != len(ESTIMATORS):
    raise ValueError("duplicate estimator names")
if set(_BY_NAME) | set(RENAMED) != set(get_args(EstimatorName)) or set(RENAMED) & set(_BY_NAME):
    raise ValueError("ESTIMATORS, RENAMED and EstimatorName disagree")
ESTIMATOR_NAMES: tuple[str, ...] = tuple(_BY_NAME)
SAMPLER_NAMES: tuple[str, ...] = get_args(SamplerName)


def canonical_estimator(estimator: str) -> str:
    """The estimator's current name: `estimator` itself unless it is an old name (RENAMED)."""
    return RENAMED.get(estimator, estimator)


def renamed_caveat(estimator: str) -> Caveat | None:
    """The deprecated_name warning of an old estimator name, else None."""
    new = RENAMED.get(estimator)
    if new is None:
        return None
    return Caveat(
        "deprecated_name",
        f"estimator {estimator!r} is now called {new!r} and was answered as {new!r}; the old "
        "name is accepted for this release only: send the new one",
    )


def choose_estimator(
    estimator: str,
    n_players: int,
    budget: int,
    cost: int = 1,
    target: bool = False,
    costly: bool = False,
) -> str:
    """Resolve `auto` (exact when 2^n fits, else gp below 3n coalitions or for a `costly`
    game, else kernel) and check the budget suffices.

    `costly`: a coalition costs far more than gp's own fit (text models: a transformer pass
    each, about 3 ms on one core for MiniLM against gp's 0.04-0.3 s for 2,000 coalitions); gp
    is then at least as accurate as KernelSHAP on the same coalitions at most budgets and
    0.6x its RMSE from 32n on sentiment-minilm words (docs/benchmarks.md).

    gp below 3n: KernelSHAP's regression is then nearly square (2n: n-1 pairs for n-1 free
    values) and its error can exceed the values; the GP posterior is well posed and costs
    milliseconds at that size (docs/benchmarks.md, issue 17). With a precision target, exact
    only when 2^n also fits the no-target default budget (2n + 2048 coalitions); else `kernel`
    here and a race in `shapley_values`. `partition` (Owen values over the game's hierarchy,
    not Shapley values) is never chosen by auto: it is asked for by name.
    """
    coalitions = budget // cost
    estimator = canonical_estimator(estimator)
    if estimator == "auto":
        fits = exact.fits(n_players, coalitions)
        if target:
            fits = fits and (1 << n_players) <= default_budget(n_players)
        use_gp = not target and (costly or coalitions < GP_BELOW * n_players)
        use_gp = use_gp and n_players <= gp.MAX_PLAYERS
        estimator = "exact" if fits or n_players == 1 else "gp" if use_gp else "kernel"
    if estimator not in _BY_NAME:
        raise OptionError(f"unknown estimator {estimator!r}; use auto or one of {list(_BY_NAME)}")
    if estimator == "partition" and target:
        raise OptionError(
            "target_se applies to sampled estimators; partition is deterministic: send a budget"
        )
    if estimator == "exact" and n_players > exact.MAX_PLAYERS:
        raise OptionError(f"exact is limited to {exact.MAX_PLAYERS} players, got {n_players}")
    need = 2 if n_players == 1 else _BY_NAME[estimator].min_coalitions(n_players)
    if coalitions < need:
        raise BudgetError(
            f"budget {budget} pays for {coalitions} coalitions at {cost} model evaluations "
            f"each; estimator {estimator!r} needs at least {need} coalitions for {n_players} "
            f"players, a budget of {need * cost}"
        )
    return estimator


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
) -> Estimate:
    """Shapley values of `game` (bool masks [m, n] -> values [m] or [m, k]).

    `costly`: each coalition costs far more than gp's fit (choose_estimator; text models).

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
) -> tuple[Estimate, dict[str, Any] | None]:
    """`shapley_values` and, when `estimator` is auto, how auto chose (details.auto: what it
    measured, predicted and why; auto.py), else None."""
    if n_players < 1:
        raise OptionError("a game needs at least one player")
    if target_se is not None and not (np.isfinite(target_se) and target_se > 0):
        raise OptionError(f"target_se must be a positive number, got {target_se}")
    cost = rows_per_coalition(game)
    target = None if target_se is None else Target(float(target_se), target_output)
    if budget is None:
        budget = default_budget(n_players, cost, estimator, target=target is not None)
    name = choose_estimator(
        estimator, n_players, budget, cost, target=target is not None, costly=costly
    )
    if n_players == 1:
        name = "exact"
    is_auto = canonical_estimator(estimator) == "auto"
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
        chooser = auto.Chooser(timed, n_players)
        est = rounds.drive(
            kernel.rounds(recorder, rng, sampler, fit=chooser, name="auto"), recorder, None
        )
        if chooser.choice is not None:
            est = replace(est, estimator=chooser.choice.chosen)
            details = chooser.choice.as_dict()
        else:  # no fit ran (exact enumeration needs none)
            est = replace(est, estimator="kernel")
    else:
        est = _BY_NAME[name].run(recorder, rng, sampler, target)
        if is_auto:
            details = auto.static(name, _static_reason(name, n_players, budget // cost, costly))
    if target is not None and est.precision is None:  # exact
        est = replace(est, precision=Precision(target.se, True, 0.0, 1))
    renamed = renamed_caveat(estimator)
    if renamed is not None:
        est = replace(est, warnings=(*est.warnings, renamed))
    return est, details


def _static_reason(name: str, n_players: int, coalitions: int, costly: bool) -> str:
    """Why auto chose `name` without measuring (the rule of choose_estimator)."""
    if name == "exact":
        return f"exact: all 2^{n_players} coalitions fit the budget ({coalitions})"
    if name == "gp" and costly:
        return "gp: every coalition is a text model pass, far costlier than gp's fit"
    if name == "gp":
        return f"gp: {coalitions} coalitions < {GP_BELOW}n, where KernelSHAP's regression is " \
            "nearly square"
    if n_players > gp.MAX_PLAYERS or coalitions > gp.MAX_ROWS:
        return (f"kernel: beyond gp's {gp.MAX_ROWS} coalitions or {gp.MAX_PLAYERS} players "
                "gp is KernelSHAP")  # fmt: skip
    if not auto.enabled():
        return f"kernel: {auto.ENV}=0 (the static rule: kernel from {GP_BELOW}n)"
    return f"{name}: the static rule"


__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_NAMES",
    "RENAMED",
    "SAMPLER_NAMES",
    "EstimatorChoice",
    "EstimatorName",
    "EstimatorSpec",
    "SamplerName",
    "canonical_estimator",
    "choose_estimator",
    "renamed_caveat",
    "shapley_values",
    "shapley_values_chosen",
]
