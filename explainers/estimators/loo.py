"""Leave-one-out on removal games, and the two ways AttriBoT narrows it (hierarchy, proxy).

LOO_j = v(base) − v(base ∪ unit_j), where v(removed) is a removal game's value with the
`removed` atoms absent (a span game: log-likelihood of a response without some sentences).
Liu, Kandpal & Raffel (ICLR 2025), "AttriBoT": hierarchical LOO (score groups, keep the best,
score their members with the other groups removed) and proxy pruning (a cheap game keeps the
best units, the target game rescores them in the pruned context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Units = Sequence[frozenset[int]]


class RemovalGame(Protocol):
    """(v(base), v(base ∪ r) for each r), evaluated as one batch."""

    def evaluate(
        self, base: frozenset[int], removals: Units, skip_unchanged: bool = True
    ) -> tuple[float, np.ndarray]: ...


def leave_one_out(
    game: RemovalGame, units: Units, base: frozenset[int] = frozenset()
) -> tuple[np.ndarray, float]:
    """(v(base) − v(base ∪ unit) per unit [n], v(base))."""
    full, values = game.evaluate(base, units)
    return full - values, full


def top(scores: np.ndarray, k: int) -> set[int]:
    """Indices of the k highest scores, ties at the cutoff kept (AttriBoT)."""
    if k >= len(scores):
        return set(range(len(scores)))
    cutoff = np.sort(scores)[::-1][k - 1]
    return {int(i) for i in np.flatnonzero(scores >= cutoff)}


@dataclass(frozen=True)
class Narrowed:
    """A narrowing step: its scores, what it kept, the new base and the units left to score."""

    scores: np.ndarray  # of the groups (hierarchy) or of the candidates (pruning)
    kept: set[int]  # indices into `scores`
    base: frozenset[int]  # atoms removed from now on
    candidates: list[int]  # unit indices still to score


def by_groups(
    game: RemovalGame,
    groups: Units,
    group_of: Sequence[int],
    candidates: Sequence[int],
    keep: int,
    base: frozenset[int] = frozenset(),
) -> tuple[Narrowed, float]:
    """Hierarchical LOO's first level: LOO of the groups, the `keep` best stay; the others are
    removed. `group_of[j]`: the group of unit j. Returns the step and v(base)."""
    scores, full = leave_one_out(game, groups, base)
    kept = top(scores, keep)
    dropped = frozenset().union(*(g for i, g in enumerate(groups) if i not in kept))
    left = [j for j in candidates if group_of[j] in kept]
    return Narrowed(scores, kept, base | dropped, left), full


def by_proxy(
    proxy: RemovalGame,
    units: Units,
    candidates: Sequence[int],
    keep: int,
    base: frozenset[int] = frozenset(),
) -> Narrowed:
    """Proxy pruning: LOO of the candidates under a cheap game, the `keep` best stay; the
    others are removed."""
    scores, _ = leave_one_out(proxy, [units[j] for j in candidates], base)
    kept = top(scores, keep)
    dropped = frozenset().union(*(units[j] for k, j in enumerate(candidates) if k not in kept))
    left = [j for k, j in enumerate(candidates) if k in kept]
    return Narrowed(scores, kept, base | dropped, left)


def hierarchical_loo(
    game: RemovalGame,
    groups: Units,
    units: Units,
    group_of: Sequence[int],
    keep: int,
) -> tuple[np.ndarray, Narrowed, float]:
    """Hierarchical LOO: scores of every unit [n] (0 for units of dropped groups), the group
    step and v(base) of the second level."""
    step, _ = by_groups(game, groups, group_of, range(len(units)), keep)
    values = np.zeros(len(units))
    scores, full = leave_one_out(game, [units[j] for j in step.candidates], step.base)
    values[step.candidates] = scores
    return values, step, full


__all__ = [
    "Narrowed",
    "RemovalGame",
    "by_groups",
    "by_proxy",
    "hierarchical_loo",
    "leave_one_out",
    "top",
]
