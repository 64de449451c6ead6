"""Searches for a minimal sufficient subset of players (explainers/sufficient/explainer.py): exact
over every coalition, or greedy along an attribution order then pruned; and the criterion a
coalition's values must meet to keep the class."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from explainers.estimators.library import shapley_values
from explainers.explanation import OptionError
from explainers.games import BudgetError, GameRecorder
from models.base import Model


class Criterion:
    """Which coalition values keep class c: argmax, and the optional probability/precision."""

    def __init__(self, c: int, k: int, min_p: float | None, min_prec: float | None) -> None:
        self.c, self.k = c, k
        self.min_p = min_p
        self.min_prec = min_prec

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """values [m, 2k] -> bool [m]."""
        probs, shares = values[:, : self.k], values[:, self.k :]
        ok = np.argmax(probs, axis=1) == self.c
        if self.min_p is not None:
            ok &= probs[:, self.c] >= self.min_p - 1e-12
        if self.min_prec is not None:
            ok &= shares[:, self.c] >= self.min_prec - 1e-12
        return ok


class _Column:
    """Class c's probability as a one-output game, evaluated through the shared recorder."""

    def __init__(self, recorder: GameRecorder, column: int) -> None:
        self.recorder = recorder
        self.column = column
        self.rows_per_coalition = recorder.cost

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        return self.recorder(masks)[:, self.column]


def exact_search(table: np.ndarray, ok: Criterion, n: int) -> tuple[np.ndarray | None, str]:
    """The smallest sufficient coalition of the value table [2^n, 2k] (ties: highest v_c)."""
    good = ok(table)
    if not good.any():
        return None, "minimum"
    masks_idx = np.flatnonzero(good)
    sizes = np.array([bin(int(i)).count("1") for i in masks_idx])
    best = masks_idx[sizes == sizes.min()]
    pick = int(best[np.argmax(table[best, ok.c])])  # ties: the most confident
    return ((pick >> np.arange(n)) & 1).astype(bool), "minimum"


def player_order(
    rec: GameRecorder, order: str, c: int, n: int, coalitions: int, seed: int
) -> tuple[np.ndarray, str]:
    """Attribution of class c per player (higher: more needed) and how it was computed."""
    if order == "leave-one-out":
        masks = np.ones((n + 1, n), bool)
        masks[np.arange(n), np.arange(n)] = False
        v = rec(masks)[:, c]
        return v[n] - v[:n], "leave-one-out"
    est = shapley_values(
        _Column(rec, c), n, budget=coalitions * rec.cost, seed=seed, estimator="auto"
    )
    return np.asarray(est.values, np.float64).reshape(n), f"shapley-{est.estimator}"


def greedy_search(
    rec: GameRecorder, ok: Criterion, order_values: np.ndarray
) -> tuple[np.ndarray | None, str]:
    """The shortest sufficient prefix of the order, pruned one player at a time to a 1-minimal
    subset (no single player can go); "none" when the budget stops the pruning."""
    n = rec.n_players
    rank = np.argsort(-order_values, kind="stable")
    prefixes = np.zeros((n + 1, n), bool)
    for k in range(1, n + 1):
        prefixes[k, rank[:k]] = True
    good = np.flatnonzero(ok(rec(prefixes)))
    if good.size == 0:
        return None, "minimum"
    subset = prefixes[good[0]].copy()
    while subset.any():
        members = np.flatnonzero(subset)
        remaining = rec.remaining
        if remaining is not None and remaining < len(members) + 1:  # keep one for the complement
            return subset, "none"
        trials = np.repeat(subset[None], len(members), axis=0)
        trials[np.arange(len(members)), members] = False
        values = rec(trials)
        keeps = ok(values)
        if not keeps.any():
            break
        best = np.flatnonzero(keeps)[np.argmax(values[keeps, ok.c])]
        subset = trials[best]
    return subset, "1-minimal"


class OwnOptions(Protocol):
    """The options search "own" reads (SufficientOptions)."""

    @property
    def search(self) -> str: ...
    @property
    def masker(self) -> object: ...
    @property
    def patch_size(self) -> int | None: ...


def own_subsets(model: Model, inputs: np.ndarray, options: OwnOptions) -> list[np.ndarray | None]:
    """Per input: the model's own subset, bool [n] (search "own": SST models, Bassan et al.,
    ICLR 2025, on their own players and absence), else None."""
    if options.search != "own":
        return [None] * len(inputs)
    from models.builtin.sst import has_own_subset, own_subset

    if not has_own_subset(model):
        raise OptionError(f"model {model.name!r} does not output its own sufficient subset")
    if options.masker is not None or options.patch_size not in (None, 2):
        raise OptionError("search 'own': the model's subsets are 2x2 patches with a zero baseline")
    return list(own_subset(model, inputs))


def own_budget(cost: int, budget: int | None) -> int:
    """Model evaluations of search "own": both ends, the complement and the verification."""
    need = 4 * cost
    if budget is not None and budget < need:
        raise BudgetError(f"search 'own' needs a budget of {need} model evaluations, got {budget}")
    return need if budget is None else budget
