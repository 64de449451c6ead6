"""The estimator table and `choose`: the one way to the estimators (the entries that run a
choice on a game, `shapley_values`, `interaction_values` and `api_values`: library.py).

One table (`TABLE`): index (SV, an interaction index, API, LOO, surrogate) x estimator -> a
runner that takes a recorder and returns an `Estimate`, the coalitions it needs, whether it
samples and where it stands on text players. `choose` resolves a request's estimator from it
once, to a `Choice` that is passed down (the explainers resolve before any model call, then run
the choice).
Shapley (1953); KernelSHAP: Lundberg & Lee (2017); permutation sampling: Castro et al. (2009);
interaction indices: interactions.py; API: api.py (Chang, Lee & Choi, ICLR 2025); leave-one-out:
loo.py. "Exact when 2^n fits" is `exact.fits`. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np

from explainers.estimators import (
    api,
    exact,
    gp,
    interactions,
    kernel,
    loo,
    msr,
    partition,
    permutation,
    regression,
    surrogate,
)
from explainers.estimators.base import Estimate, Target
from explainers.estimators.budget import default_budget
from explainers.estimators.gp_interactions import fits as gp_fits
from explainers.explanation import Caveat, OptionError
from explainers.games import BudgetError, GameRecorder

# Names for options models (pydantic Literals): the Shapley-value estimators, their old names
# still accepted (RENAMED), and the kernel's samplers.
EstimatorName = Literal[
    "exact", "permutation", "kernel", "surrogate_kernel", "msr", "gp", "partition", "regression"
]
EstimatorChoice = Literal["auto", EstimatorName]
SamplerName = Literal["kernel", "leverage"]
# Where a row stands on text players (every coalition a transformer pass): "any"; "costly":
# auto prefers it there (gp's fit is cheap against the passes); "by_name": auto never picks it
# there and an answer by name carries the row's text caveat.
TextPolicy = Literal["any", "costly", "by_name"]
AutoRank = Literal["", "first", "fallback"]  # interaction terms: where auto takes a row


@dataclass(frozen=True)
class Ask:
    """What a request asks of an estimator besides the game: the index (and `terms`: one
    output's interaction terms, not values of every output), its highest order, the explained
    output (terms; None: v(all)'s argmax), the API rule, the kernel's sampler, a precision
    target and the seed (shapiq's approximators take it; the others the rng made from it)."""

    index: str = "SV"
    terms: bool = False
    max_order: int = 1
    output: int | None = 0
    variant: str = "chain"
    sampler: str = "kernel"
    target: Target | None = None
    seed: int = 0


Runner = Callable[[GameRecorder, np.random.Generator, Ask], Estimate]


@dataclass(frozen=True)
class Row:
    """One line of the estimator table: index x estimator -> runner, the coalitions it needs
    for n players, whether it samples, where it stands on text players (TextPolicy) and, for
    interaction terms, where auto takes it ("first", else "fallback") and whether it takes a
    size (players, order, coalitions)."""

    index: str
    name: str
    run: Runner
    min_coalitions: Callable[[int], int]
    sampled: bool
    terms: bool = False
    text: TextPolicy = "any"
    text_caveat: Caveat | None = None
    auto: AutoRank = ""
    takes: Callable[[int, int, int], bool] | None = None


def _terms(runner: interactions.TermsRunner) -> Runner:
    """A terms runner (interactions.py) on the table's signature."""

    def run(recorder: GameRecorder, rng: np.random.Generator, ask: Ask) -> Estimate:
        k = 1 if ask.index == "SV" else ask.max_order
        return runner(recorder, rng, interactions.Terms(ask.index, k, ask.output), ask.seed)

    return run


def _row(
    name: str, run: Runner, need: Callable[[int], int], sampled: bool, text: TextPolicy = "any"
) -> Row:
    """A Shapley-value row (values of every output)."""
    return Row("SV", name, run, need, sampled, text=text)


# The Shapley-value estimators, by name: add one here and to EstimatorName.
ESTIMATORS: tuple[Row, ...] = (
    _row("exact", lambda rec, rng, _a: exact.exact(rec, rng), exact.min_coalitions, False),
    _row(
        "permutation",
        lambda rec, rng, a: permutation.permutation(rec, rng, a.target),
        permutation.min_coalitions,
        True,
    ),
    _row(
        "kernel",
        lambda rec, rng, a: kernel.kernel(rec, rng, a.sampler, a.target),
        kernel.min_coalitions,
        True,
    ),
    # cubic-surrogate-adjusted KernelSHAP (inspired by Witter et al. 2025; not their estimator)
    _row(
        "surrogate_kernel",
        lambda rec, rng, a: regression.surrogate_kernel(rec, rng, a.sampler, a.target),
        regression.min_coalitions,
        True,
    ),
    # Witter, Liu & Musco (2025): XGBoost surrogate + unbiased maximum-sample-reuse residual
    _row("msr", lambda rec, rng, a: msr.msr(rec, rng, a.target), msr.min_coalitions, True),
    _row(
        "gp",
        lambda rec, rng, a: gp.gp(rec, rng, a.sampler, a.target),
        gp.min_coalitions,
        True,
        text="costly",
    ),
    # Owen values over game.hierarchy (not Shapley values: never chosen by auto)
    _row(
        "partition",
        lambda rec, rng, a: partition.partition(rec, rng, a.target),
        partition.min_coalitions,
        False,
    ),
)


_PRIOR_MISFIT = Caveat(
    "prior_misfit",
    "gp's prior misses word interactions on text models: its first-order terms can be "
    "biased beyond their error_std (docs/benchmarks.md); from about 64n coalitions "
    "estimator kernel (KernelSHAP-IQ) is more accurate",
)
_SAMPLED_TERMS = interactions.min_coalitions
# auto's sampled estimator per index ("first"; gp: not on text games, see _PRIOR_MISFIT): RMSE of
# gp over the best of shapiq's at equal coalitions, 4n-64n, tanh and breast-cancer games
# (bench/gp_interactions_bench.py, docs/benchmarks.md): SII 0.32-0.79x, k-SII 0.27-0.76x, STII
# 0.17-1.01x PermutationSamplingSTII (SVARM-IQ is worse), FSII 0.05-0.50x RegressionFSII, FBII
# 0.02-0.75x RegressionFBII. "fallback": where gp does not apply.
_GP_TERMS = tuple(
    Row(
        index,
        "gp",
        _terms(interactions.gp_terms),
        _SAMPLED_TERMS,
        sampled=True,
        terms=True,
        text="by_name",
        text_caveat=_PRIOR_MISFIT,
        auto="first",
        takes=gp_fits,
    )
    for index in ("SII", "k-SII", "STII", "FSII", "FBII")  # gp_interactions.py: any linear index
)
# (index, estimator, shapiq approximator, its index argument, auto)
_SHAPIQ: tuple[tuple[str, str, str, str | None, AutoRank], ...] = (
    ("SII", "kernel", "KernelSHAPIQ", "SII", "fallback"),
    ("k-SII", "kernel", "KernelSHAPIQ", "k-SII", "fallback"),
    ("FSII", "kernel", "RegressionFSII", None, "fallback"),
    ("FBII", "kernel", "RegressionFBII", None, "fallback"),
    ("SII", "svarm", "SVARMIQ", "SII", ""),
    ("k-SII", "svarm", "SVARMIQ", "k-SII", ""),
    ("STII", "svarm", "SVARMIQ", "STII", ""),
    ("SII", "permutation", "PermutationSamplingSII", "SII", ""),
    ("k-SII", "permutation", "PermutationSamplingSII", "k-SII", ""),
    ("STII", "permutation", "PermutationSamplingSTII", None, "fallback"),
)
_TERMS: tuple[Row, ...] = (
    *(
        Row(
            index,
            "exact",
            _terms(interactions.exact_terms),
            exact.min_coalitions,
            False,
            terms=True,
        )
        for index in interactions.INDICES  # SV too: its terms of one output, order 1
    ),
    *_GP_TERMS,
    *(
        Row(
            index,
            name,
            _terms(interactions.shapiq_terms(name, cls, arg)),
            _SAMPLED_TERMS,
            sampled=True,
            terms=True,
            auto=auto,
        )
        for index, name, cls, arg, auto in _SHAPIQ
    ),
)
_API: tuple[Row, ...] = (
    Row(
        "API",
        "exact",
        lambda rec, rng, a: api.exact_api(rec, rng, a.variant),
        exact.min_coalitions,
        False,
    ),
    Row(
        "API",
        "permutation",
        lambda rec, rng, _a: api.permutation_chain(rec, rng),
        api.min_coalitions,
        True,
    ),
)


def _surrogate(recorder: GameRecorder, rng: np.random.Generator, ask: Ask) -> Estimate:
    """ContextCite's Lasso surrogate on every coalition the budget pays for but v(all)."""
    if recorder.remaining is None:
        raise OptionError("a sampled surrogate needs a budget")
    return surrogate.linear_surrogate(recorder, rng, recorder.remaining - 1)


# Leave-one-out (one coalition without each player) and ContextCite's sampled surrogate (its
# defaults; attribot.py passes its own options to surrogate.py) are asked for by name by their
# explainers; TreeSHAP reads the trees, not a game (tree.py, shapley/trees.py): no row.
_OTHER: tuple[Row, ...] = (
    Row("LOO", "loo", lambda rec, _rng, _a: loo.leave_one_out(rec), loo.min_coalitions, False),
    Row("surrogate", surrogate.NAME, _surrogate, lambda _n: 3, True),
)

TABLE: tuple[Row, ...] = (*ESTIMATORS, *_TERMS, *_API, *_OTHER)
_ROWS = {(row.index, row.name, row.terms): row for row in TABLE}
_BY_NAME = {spec.name: spec for spec in ESTIMATORS}
EstimatorSpec = Row  # the name of a table row before interactions and API joined the table
# Old names, accepted for one release after a rename: the answer names the new one
# (Estimate.estimator) and carries a deprecated_name warning. Remove an entry (and its name in
# EstimatorName) in the release after the one that renamed it.
RENAMED: dict[str, str] = {
    # issue 28: not Witter et al.'s regression-adjusted estimator (regression.py says how)
    "regression": "surrogate_kernel",
}
GP_BELOW = 3  # auto: gp below this many coalitions per player (else kernel)
if len(_ROWS) != len(TABLE) or len(_BY_NAME) != len(ESTIMATORS):
    raise ValueError("duplicate estimator table rows")
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


@dataclass(frozen=True)
class Choice:
    """One request's resolved estimator: the table row, what was asked (auto, an old name) and
    the sizes it was checked against. Resolved once (`choose`) and passed down."""

    row: Row
    asked: str
    n_players: int
    budget: int  # model evaluations
    cost: int  # model rows per coalition
    target: bool = False
    text: bool = False

    @property
    def estimator(self) -> str:
        return self.row.name

    @property
    def is_auto(self) -> bool:
        return canonical_estimator(self.asked) == "auto"

    def run(self, recorder: GameRecorder, rng: np.random.Generator, ask: Ask) -> Estimate:
        """The row's runner on the recorded game, with its text caveat where it applies."""
        est = self.row.run(recorder, rng, ask)
        caveat = self.row.text_caveat if self.text else None
        return est if caveat is None else replace(est, warnings=(*est.warnings, caveat))


def choose(
    ask: Ask,
    estimator: str,
    n_players: int,
    budget: int,
    cost: int = 1,
    *,
    target: bool = False,
    text: bool = False,
) -> Choice:
    """Resolve `estimator` (auto, a name, an old name) for `ask` on n players within `budget`
    model evaluations at `cost` rows per coalition, from the table; raise OptionError or
    BudgetError before any model call when it cannot answer. `text`: the players are a text
    model's (TextPolicy)."""
    if ask.index == "API":
        row = _choose_api(estimator, n_players, budget // cost, ask.variant)
    elif ask.terms:
        row = _choose_terms(ask, estimator, n_players, budget, cost, text)
    else:
        row = _choose_sv(estimator, n_players, budget, cost, target, text)
    return Choice(row, estimator, n_players, budget, cost, target, text)


def _choose_sv(
    estimator: str, n_players: int, budget: int, cost: int, target: bool, text: bool
) -> Row:
    """Shapley values: auto is exact when 2^n fits, else gp below GP_BELOW n coalitions or on
    text players (gp's row: "costly"), else kernel (choose_estimator)."""
    coalitions = budget // cost
    estimator = canonical_estimator(estimator)
    if estimator == "auto":
        fits = exact.fits(n_players, coalitions)
        if target:
            fits = fits and (1 << n_players) <= default_budget(n_players)
        costly = text and _BY_NAME["gp"].text == "costly"
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
    return _BY_NAME[estimator]


def _auto_row(index: str, auto: str) -> Row | None:
    """The interaction-terms row auto takes first, or where that one does not apply."""
    return next((r for r in TABLE if r.terms and r.index == index and r.auto == auto), None)


def _choose_terms(
    ask: Ask, estimator: str, n_players: int, budget: int, cost: int, text: bool
) -> Row:
    """Interaction terms of one output: auto is exact when 2^n fits, else the index's "first"
    row where it applies (TextPolicy, its size), else its "fallback"."""
    index, k = ask.index, 1 if ask.index == "SV" else ask.max_order
    coalitions = budget // cost
    fits = exact.fits(n_players, coalitions)
    if estimator == "auto":
        first, fallback = _auto_row(index, "first"), _auto_row(index, "fallback")
        estimator = "exact" if fits else "kernel"  # SV: no sampled terms (the error below)
        if not fits and first is not None:
            skip = text and first.text == "by_name"
            skip = skip or (first.takes is not None and not first.takes(n_players, k, coalitions))
            estimator = (fallback or first).name if skip else first.name
    if estimator == "exact":
        if not fits:
            raise BudgetError(
                f"exact needs all {1 << n_players} coalitions ({(1 << n_players) * cost} model "
                f"evaluations) and at most {exact.MAX_PLAYERS} players"
            )
        return _ROWS[index, "exact", True]
    if index == "SV":
        raise OptionError("sampled SV: use the shapley estimators (index SV with kernel)")
    row = _ROWS.get((index, estimator, True))
    if row is None:
        raise OptionError(f"estimator {estimator!r} is not available for {index}")
    need = row.min_coalitions(n_players)
    if coalitions < need:
        raise BudgetError(f"budget pays for {coalitions} coalitions; at least {need} needed")
    return row


API_ESTIMATORS = ("auto", *(row.name for row in TABLE if row.index == "API"))


def _choose_api(estimator: str, n_players: int, coalitions: int, variant: str) -> Row:
    """API: auto is exact when 2^n fits, else the permutation estimator (chain rule only)."""
    if estimator not in API_ESTIMATORS:
        raise OptionError("API supports the estimators auto, exact and permutation")
    if variant not in api.VARIANTS:
        raise OptionError(f"unknown API variant {variant!r}; use one of {api.VARIANTS}")
    fits = exact.fits(n_players, coalitions)
    if estimator == "auto":
        estimator = "exact" if fits else "permutation"
    if estimator == "exact":
        if not fits:
            raise BudgetError(f"exact API needs all {1 << n_players} coalitions")
        return _ROWS["API", "exact", False]
    if variant != "chain":
        raise BudgetError(
            "sampled API is the permutation estimator of the chain variant; the moebius variant "
            "needs all 2^n coalitions"
        )
    row = _ROWS["API", "permutation", False]
    if coalitions < row.min_coalitions(n_players):
        raise BudgetError(
            f"API needs at least {row.min_coalitions(n_players)} coalitions for {n_players} players"
        )
    return row


def choose_estimator(
    estimator: str,
    n_players: int,
    budget: int,
    cost: int = 1,
    target: bool = False,
    costly: bool = False,
) -> str:
    """The Shapley-value estimator `choose` resolves (its name): auto is exact when 2^n fits,
    else gp below 3n coalitions or for a `costly` game, else kernel; the budget is checked.

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
    return choose(Ask(), estimator, n_players, budget, cost, target=target, text=costly).estimator


__all__ = [
    "API_ESTIMATORS",
    "ESTIMATORS",
    "ESTIMATOR_NAMES",
    "RENAMED",
    "SAMPLER_NAMES",
    "TABLE",
    "Ask",
    "Choice",
    "EstimatorChoice",
    "EstimatorName",
    "EstimatorSpec",
    "Row",
    "SamplerName",
    "canonical_estimator",
    "choose",
    "choose_estimator",
    "renamed_caveat",
]
