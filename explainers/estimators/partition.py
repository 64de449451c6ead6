"""Owen values of a game with a hierarchy of players: the method of shap's PartitionExplainer.

Owen (1977), "Values of games with a priori unions"; Lundberg et al. (shap's Partition
explainer). The value of a node's players given a context C (the coalition outside the node) is
v(C ∪ node) − v(C); a node splits it among its children as the Shapley values of the game whose
players are the children, played on top of C. A visit of a node of k children evaluates its
2^k − 2 new coalitions (2 for a binary node: C ∪ left, C ∪ right), and each internal child is
then visited once per subset T of its siblings, with context C ∪ T and weight |T|!(k−|T|−1)!/k!.
At a leaf, the weighted marginal contributions sum to the player's Owen value. A flat hierarchy
gives Shapley values; an additive game gives the same values for every hierarchy.

The hierarchy is `game.hierarchy` (through the recorder; see explainers/games/hierarchy.py:
`spatial` halves for image patches, `sequence` halves for words), else `sequence(n)`:
contiguous halves of the players in order.

Exact: when the budget pays for every visit (`exact_cost(h)` coalitions, all distinct: about
2n²/3 for a balanced binary tree of n players; 2^n for a flat one), the values are the exact Owen
values and `exact` is true; the visits of one level are one game call.
Under a smaller budget, shap's strategy: visits are expanded best first (the largest
weight × max |v(C ∪ node) − v(C)| over the outputs), in rounds of at most a quarter of the
remaining budget (one game call each); a visit left unexpanded splits its weighted contribution
evenly among the node's players (shap's `lower_credit`). Every value then still adds up to
v(all) − v(none) (efficiency holds exactly), the values of the expanded groups are exact sums of
Owen values, and within an unexpanded group the split is uniform: a deterministic
approximation whose error has no sampling law, so `error_std` is None and the caveat
`partition_truncated` says how coarse the answer is. Resolving the hierarchy to groups of about
g players costs about 2(n/g)²/3 coalitions, whatever the model. At a deadline, the pending
visits are spread in the same way (an anytime answer, `partial`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cache
from itertools import count
from typing import Any

import numpy as np

from explainers.estimators.base import Estimate, Target
from explainers.estimators.mobius import mobius_transform, shapley_from_mobius
from explainers.estimators.rounds import Slicer
from explainers.explanation import Caveat, OptionError
from explainers.games import BudgetError, DeadlineExceeded, GameRecorder
from explainers.games.hierarchy import Hierarchy, as_hierarchy

MAX_WIDTH = 16  # children of one node: a visit evaluates 2^k coalitions
ROUND_MIN = 64  # truncated: coalitions of a round, at least (else a quarter of what is left)
ROUND_SPLIT = 4
_TABLE_WIDTH = 10  # up to this width the Shapley map of a node's table is a precomputed matrix


def min_coalitions(n: int) -> int:
    """v(none), v(all) and the root's split of a binary hierarchy."""
    return 2 if n == 1 else 4


@dataclass(frozen=True)
class _Tree:
    """The hierarchy as arrays: node j's children are players (< n) or nodes (n + id)."""

    n: int
    children: tuple[tuple[int, ...], ...]  # per node
    members: np.ndarray  # bool [nodes, n]: the players under each node
    sizes: np.ndarray  # [nodes]


def _tree(h: Hierarchy, n: int) -> _Tree:
    children: list[tuple[int, ...]] = []
    rows: list[np.ndarray] = []

    def add(node: Any) -> int:
        if isinstance(node, int):
            return node
        j = len(children)
        children.append(())
        rows.append(np.zeros(n, dtype=bool))
        kids = tuple(add(child) for child in node)
        children[j] = kids
        for kid in kids:
            if kid < n:
                rows[j][kid] = True
            else:
                rows[j] |= rows[kid - n]
        return n + j

    add(h)
    members = np.stack(rows)
    return _Tree(n, tuple(children), members, members.sum(axis=1))


def exact_cost(h: Hierarchy, n: int | None = None) -> int:
    """Coalitions that exact Owen values of hierarchy `h` take (v(none) and v(all) included)."""
    n = len(list(_leaves(h))) if n is None else n
    if n == 1:
        return 2

    def cost(node: Any, visits: int) -> int:
        if isinstance(node, int):
            return 0
        k = len(node)
        own = visits * ((1 << k) - 2)
        return own + sum(cost(child, visits << (k - 1)) for child in node)

    return 2 + cost(h, 1)


def _leaves(h: Any) -> Any:
    if isinstance(h, int):
        yield h
    else:
        for child in h:
            yield from _leaves(child)


@cache
def _subsets(k: int) -> np.ndarray:
    """Bit masks of the 2^k subsets of k children. bool [2^k, k]"""
    idx = np.arange(1 << k)
    return ((idx[:, None] >> np.arange(k)) & 1).astype(bool)


@cache
def _shapley_map(k: int) -> np.ndarray:
    """The linear map from a table over the 2^k subsets to its Shapley values. [k, 2^k]"""
    subsets = _subsets(k)
    sizes = subsets.sum(axis=1)
    w = np.array(
        [math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)]
    )
    out = np.zeros((k, 1 << k))
    for j in range(k):
        without = np.flatnonzero(~subsets[:, j])
        out[j, without | (1 << j)] += w[sizes[without]]
        out[j, without] -= w[sizes[without]]
    return out


def _weights(k: int) -> np.ndarray:
    """Shapley weight of a sibling subset of size s among k children. [k]"""
    return np.array(
        [math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)]
    )


@dataclass
class _Visit:
    node: int  # node id (not n + id)
    context: np.ndarray  # bool [n]: the players present outside the node
    f00: np.ndarray  # v(context) [K]
    f11: np.ndarray  # v(context ∪ node) [K]
    weight: float


def partition(
    recorder: GameRecorder, rng: np.random.Generator, target: Target | None = None
) -> Estimate:
    """Owen values of the recorded game over `recorder.hierarchy` (default `sequence(n)`)."""
    del rng  # deterministic: ties in priority go by the order the visits were made
    if target is not None:
        raise OptionError(
            "target_se applies to sampled estimators; partition is deterministic (exact when "
            "the budget covers the hierarchy, else a fixed refinement): send a budget instead"
        )
    n = recorder.n_players
    h = as_hierarchy(recorder.hierarchy, n)
    widest = _widest(h)
    if widest > MAX_WIDTH:
        raise OptionError(
            f"a node of the hierarchy has {widest} children; partition splits nodes of at most "
            f"{MAX_WIDTH} (2^k coalitions each)"
        )
    root_cost = 2 if n == 1 else 1 << len(h)  # v(none), v(all) and the root's split
    if recorder.remaining is not None and recorder.remaining < root_cost:
        raise BudgetError(
            f"the budget pays for {recorder.remaining} coalitions; v(none), v(all) and "
            f"splitting the hierarchy's root take {root_cost}"
        )
    ends = recorder(np.stack([np.zeros(n, dtype=bool), np.ones(n, dtype=bool)]))  # [2, K]
    f0, f1 = ends[0], ends[1]
    values = np.zeros((n, ends.shape[1]))
    full_cost = exact_cost(h, n)
    if n == 1:
        values[0] = f1 - f0
        return _estimate(recorder, values, f0, f1, True, False, ())
    tree = _tree(h, n)
    remaining = recorder.remaining
    exact_mode = remaining is None or remaining >= full_cost - 2
    slicer = Slicer(recorder, distinct=False)
    order = count()
    heap: list[tuple[float, int, _Visit]] = []

    def push(visit: _Visit) -> None:
        priority = -float(np.max(np.abs(visit.f11 - visit.f00))) * visit.weight
        heapq.heappush(heap, (priority, next(order), visit))

    push(_Visit(0, np.zeros(n, dtype=bool), f0, f1, 1.0))
    unaffordable: list[_Visit] = []
    partial = False
    while heap:
        batch = _take(heap, tree, recorder.remaining, exact_mode, unaffordable)
        if not batch:
            break
        try:
            _expand(batch, tree, slicer, values, push)
        except DeadlineExceeded:
            partial = True
            unaffordable.extend(batch)
            break
    left = unaffordable + [item[2] for item in heap]
    for visit in left:  # shap's lower_credit: an unexpanded node's share, evenly to its players
        share = visit.weight * (visit.f11 - visit.f00) / tree.sizes[visit.node]
        values[tree.members[visit.node]] += share
    caveats: tuple[Caveat, ...] = ()
    if left:
        largest = int(max(tree.sizes[v.node] for v in left))
        why = "the time limit passed" if partial else "the budget ran out"
        caveats = (
            Caveat(
                "partition_truncated",
                f"{why} before the hierarchy was resolved: {len(left)} visits of groups of up "
                f"to {largest} players split their credit evenly among their players; exact "
                f"Owen values of this hierarchy take {full_cost} coalitions (the budget in "
                f"model evaluations is that times {recorder.cost})",
            ),
        )
    return _estimate(recorder, values, f0, f1, not left, partial, caveats)


def _widest(h: Any) -> int:
    if isinstance(h, int):
        return 0
    return max(len(h), *(_widest(child) for child in h))


def _take(
    heap: list[tuple[float, int, _Visit]],
    tree: _Tree,
    remaining: int | None,
    exact_mode: bool,
    unaffordable: list[_Visit],
) -> list[_Visit]:
    """The next round's visits: every pending one when the exact cost fits (a level), else the
    best first within a round's share of the remaining coalitions."""
    if exact_mode or remaining is None:
        everything = [item[2] for item in heap]
        heap.clear()
        return everything
    cap = min(remaining, max(ROUND_MIN, remaining // ROUND_SPLIT))
    batch: list[_Visit] = []
    spent = 0
    while heap:
        visit = heap[0][2]
        cost = (1 << len(tree.children[visit.node])) - 2
        if cost > remaining:  # never affordable again: spread at the end
            heapq.heappop(heap)
            unaffordable.append(visit)
            continue
        if batch and spent + cost > cap:
            break
        heapq.heappop(heap)
        batch.append(visit)
        spent += cost
    return batch


def _expand(
    batch: list[_Visit],
    tree: _Tree,
    slicer: Slicer,
    values: np.ndarray,
    push: Any,
) -> None:
    """Evaluate the new coalitions of every visit in one game call; credit leaf children with
    their weighted Shapley shares and queue a visit per internal child and sibling subset."""
    n = tree.n
    unions: list[np.ndarray] = []
    for visit in batch:
        kids = tree.children[visit.node]
        rows = np.stack([_member_row(tree, kid) for kid in kids])  # [k, n]
        union = (_subsets(len(kids)).astype(np.uint8) @ rows.astype(np.uint8)) > 0
        unions.append(union | visit.context)  # [2^k, n]
    masks = np.concatenate([u[1:-1] for u in unions])
    out = slicer(masks)  # [sum of 2^k - 2, K]
    start = 0
    for visit, union in zip(batch, unions, strict=True):
        kids = tree.children[visit.node]
        k = len(kids)
        stop = start + (1 << k) - 2
        table = np.concatenate([visit.f00[None], out[start:stop], visit.f11[None]])  # [2^k, K]
        start = stop
        if k <= _TABLE_WIDTH:
            shares = _shapley_map(k) @ table  # [k, K]
        else:
            shares = shapley_from_mobius(mobius_transform(table))
        weights = _weights(k)
        subsets = _subsets(k)
        sizes = subsets.sum(axis=1)
        for j, kid in enumerate(kids):
            if kid < n:
                values[kid] += visit.weight * shares[j]
                continue
            for t in np.flatnonzero(~subsets[:, j]):
                with_j = t | (1 << j)
                push(
                    _Visit(
                        kid - n,
                        union[t],
                        table[t],
                        table[with_j],
                        visit.weight * float(weights[sizes[t]]),
                    )
                )


def _member_row(tree: _Tree, kid: int) -> np.ndarray:
    if kid < tree.n:
        row = np.zeros(tree.n, dtype=bool)
        row[kid] = True
        return row
    return tree.members[kid - tree.n]


def _estimate(
    recorder: GameRecorder,
    values: np.ndarray,
    f0: np.ndarray,
    f1: np.ndarray,
    exact: bool,
    partial: bool,
    caveats: tuple[Caveat, ...],
) -> Estimate:
    return Estimate(
        values=recorder.shape_out(values),
        base_value=recorder.shape_out(f0),
        full_value=recorder.shape_out(f1),
        exact=exact,
        n_evaluations=recorder.n_evaluations,
        n_coalitions=recorder.n_coalitions,
        estimator="partition",
        partial=partial,
        index="Owen",
        warnings=caveats,
    )
