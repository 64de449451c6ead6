"""Leave-one-out on a recorded game, and the two ways AttriBoT narrows it (hierarchy, proxy).

LOO_j = v(all) − v(all without player j) of a coalition game; for a removal game (a span game:
log-likelihood of a response without some sentences) the players are units of atoms, over a
base of atoms removed already (`Removal` builds that game). Liu, Kandpal & Raffel (ICLR 2025),
"AttriBoT": hierarchical LOO (score groups, keep the best, score their members with the other
groups removed) and proxy pruning (a cheap game keeps the best units, the target game rescores
them in the pruned context). Every evaluation goes through a GameRecorder; every score is an
Estimate (index LOO).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from explainers.estimators.base import Estimate
from explainers.games import Game, GameRecorder

Units = Sequence[frozenset[int]]
# (units, base) -> the coalition game over `units` (True = present) with the `base` atoms absent
Removal = Callable[[tuple[frozenset[int], ...], frozenset[int]], Game]
NAME = "loo"


def min_coalitions(n: int) -> int:
    """v(all) and one coalition without each player."""
    return n + 1


def leave_one_out(recorder: GameRecorder) -> Estimate:
    """v(all) − v(all without j) per player [n] (or [n, k]); base_value and full_value are v(all),
    LOO's reference point. One game call, v(all) first (a removal game's reference pass)."""
    n = recorder.n_players
    masks = np.vstack([np.ones((1, n), dtype=bool), ~np.eye(n, dtype=bool)])  # [n + 1, n]
    v = recorder.evaluate_distinct(masks)  # distinct: one batch in this order, no memo sort
    full = recorder.shape_out(v[0])
    return Estimate(
        values=recorder.shape_out(v[0] - v[1:]),
        base_value=full,
        full_value=full,
        exact=True,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator=NAME,
        index="LOO",
    )


def scores(removal: Removal, units: Units, base: frozenset[int] = frozenset()) -> Estimate:
    """LOO of each unit with `base` removed: values [n], full_value v(base)."""
    units = tuple(units)
    return leave_one_out(GameRecorder(removal(units, base), len(units)))


def top(values: np.ndarray, k: int) -> set[int]:
    """Indices of the k highest scores, ties at the cutoff kept (AttriBoT)."""
    if k >= len(values):
        return set(range(len(values)))
    cutoff = np.sort(values)[::-1][k - 1]
    return {int(i) for i in np.flatnonzero(values >= cutoff)}


@dataclass(frozen=True)
class Narrowed:
    """A narrowing step: its LOO estimate, what it kept, the new base and the units left."""

    estimate: Estimate  # of the groups (hierarchy) or of the candidates (pruning)
    kept: set[int]  # indices into the estimate's values
    base: frozenset[int]  # atoms removed from now on
    candidates: list[int]  # unit indices still to score

    @property
    def scores(self) -> np.ndarray:
        return np.asarray(self.estimate.values)


def by_groups(
    removal: Removal,
    groups: Units,
    group_of: Sequence[int],
    candidates: Sequence[int],
    keep: int,
    base: frozenset[int] = frozenset(),
) -> Narrowed:
    """Hierarchical LOO's first level: LOO of the groups, the `keep` best stay; the others are
    removed. `group_of[j]`: the group of unit j."""
    est = scores(removal, groups, base)
    kept = top(np.asarray(est.values), keep)
    dropped = frozenset().union(*(g for i, g in enumerate(groups) if i not in kept))
    left = [j for j in candidates if group_of[j] in kept]
    return Narrowed(est, kept, base | dropped, left)


def by_proxy(
    proxy: Removal,
    units: Units,
    candidates: Sequence[int],
    keep: int,
    base: frozenset[int] = frozenset(),
) -> Narrowed:
    """Proxy pruning: LOO of the candidates under a cheap game, the `keep` best stay; the
    others are removed."""
    est = scores(proxy, [units[j] for j in candidates], base)
    kept = top(np.asarray(est.values), keep)
    dropped = frozenset().union(*(units[j] for k, j in enumerate(candidates) if k not in kept))
    left = [j for k, j in enumerate(candidates) if k in kept]
    return Narrowed(est, kept, base | dropped, left)


def hierarchical_loo(
    removal: Removal,
    groups: Units,
    units: Units,
    group_of: Sequence[int],
    keep: int,
) -> tuple[Estimate, Narrowed]:
    """Hierarchical LOO: scores of every unit [n] (0 for units of dropped groups; full_value
    v(base) of the second level, model evaluations of both) and the group step."""
    step = by_groups(removal, groups, group_of, range(len(units)), keep)
    second = scores(removal, [units[j] for j in step.candidates], step.base)
    values = np.zeros(len(units))
    values[step.candidates] = second.values
    spent = step.estimate.n_evaluations + second.n_evaluations
    coalitions = step.estimate.n_coalitions + second.n_coalitions
    est = Estimate(
        values, second.base_value, second.full_value, False, spent, coalitions, "hierarchical loo",
        index="LOO",
    )  # fmt: skip
    return est, step


__all__ = [
    "NAME",
    "Narrowed",
    "Removal",
    "by_groups",
    "by_proxy",
    "hierarchical_loo",
    "leave_one_out",
    "min_coalitions",
    "scores",
    "top",
]
