"""Hierarchies of players (coalition structures) for Owen values.

A `Hierarchy` is a tree over the players 0..n-1 written as nested tuples: a leaf is an `int` (a
player index), a node is a tuple of at least 2 children (a leaf or a node). Every player appears
exactly once. The root is always a tuple; a game of one player has the root `(0,)`.

    ((0, 1), (2, 3))     two groups of two players
    (0, 1, 2, 3)         flat: one level, Owen values are Shapley values

Builders: `sequence(n)` (contiguous halves: the words of a text), `spatial(centres)` (halves along
the longer side of the players' bounding box: image patches, superpixels; shap's Image masker
halves the image the same way), `flat(n)`, and `from_linkage(Z)` for a scipy/shap linkage matrix
(the clustering shap's Partition masker takes). Owen (1977), "Values of games with a priori unions".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from explainers.explanation import OptionError

# nested tuples of player indices: a leaf is an int, a node a tuple of >= 2 children
Hierarchy = tuple


def flat(n: int) -> Hierarchy:
    """One level: every player a child of the root (Owen values = Shapley values)."""
    return tuple(range(int(n)))


def sequence(n: int) -> Hierarchy:
    """A balanced binary tree over 0..n-1 in order: contiguous halves (the words of a text)."""
    n = int(n)
    if n < 1:
        raise OptionError("a hierarchy needs at least one player")
    if n == 1:
        return (0,)
    return _halves(list(range(n)))


def _halves(players: list[int]) -> Any:
    if len(players) == 1:
        return players[0]
    mid = len(players) // 2  # the left half gets the floor, as shap's image split does
    return (_halves(players[:mid]), _halves(players[mid:]))


def spatial(centres: np.ndarray) -> Hierarchy:
    """A balanced binary tree over players at `centres` [n, 2] (row, col).

    Each node splits its players along the longer side of their bounding box (rows on a tie, as
    shap's Image masker) at the boundary between distinct coordinates closest to the median (the
    smaller half first), so a grid of patches is cut along grid lines and a 2^a x 2^b grid gives
    shap's tree over those cells. Players at the same point are split by index.
    """
    c = np.asarray(centres, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != 2 or len(c) < 1:
        raise OptionError(f"spatial needs centres of shape [n, 2], got {list(c.shape)}")
    if not np.isfinite(c).all():
        raise OptionError("spatial needs finite centres")
    if len(c) == 1:
        return (0,)
    return _split(np.arange(len(c)), c)


def _split(players: np.ndarray, c: np.ndarray) -> Any:
    n = len(players)
    if n == 1:
        return int(players[0])
    pts = c[players]
    extent = pts.max(axis=0) - pts.min(axis=0)
    axis = 0 if extent[0] >= extent[1] else 1
    if extent[axis] == 0:  # all at one point: split by index
        order = np.sort(players)
        left, right = order[: n // 2], order[n // 2 :]
    else:
        key = pts[:, axis]
        order = players[np.lexsort((players, pts[:, 1 - axis], key))]
        values = np.sort(key)
        # candidate cut positions: where the coordinate changes in sorted order
        cuts = np.flatnonzero(np.diff(values) > 0) + 1
        # closest to n/2; a tie goes to the smaller left side (floor, as shap's split)
        best = cuts[np.argmin(np.abs(cuts - n / 2) * 2 + (cuts > n / 2))]
        left, right = order[:best], order[best:]
    return (_split(left, c), _split(right, c))


def from_linkage(linkage: np.ndarray) -> Hierarchy:
    """The binary tree of a scipy/shap linkage matrix [n-1, >=2] (row i merges nodes into n+i)."""
    z = np.asarray(linkage)
    if z.ndim != 2 or z.shape[1] < 2:
        raise OptionError(f"a linkage matrix has shape [n-1, 4], got {list(z.shape)}")
    n = len(z) + 1
    if n == 1:
        return (0,)
    nodes: dict[int, Any] = {}

    def node(i: int) -> Any:
        return i if i < n else nodes[i]

    for row, (a, b) in enumerate(z[:, :2].astype(np.int64)):
        if not (0 <= a < n + row and 0 <= b < n + row):
            raise OptionError(f"linkage row {row} merges {a} and {b}, not earlier nodes")
        nodes[n + row] = (node(int(a)), node(int(b)))
    root = nodes[2 * n - 2]
    validate(root, n)
    return root


def leaves(h: Any) -> Iterator[int]:
    """The players under a node (or the leaf itself), left to right."""
    if isinstance(h, (int, np.integer)):
        yield int(h)
        return
    for child in h:
        yield from leaves(child)


def players_of(h: Any) -> list[int]:
    """The players under a node, left to right."""
    return list(leaves(h))


def depth(h: Any) -> int:
    """Levels of nodes above the deepest leaf (a flat hierarchy has depth 1)."""
    if isinstance(h, (int, np.integer)):
        return 0
    return 1 + max(depth(child) for child in h)


def validate(h: Any, n: int) -> Hierarchy:
    """Check that `h` is a hierarchy over exactly the players 0..n-1; return it with int leaves."""
    if not isinstance(h, (tuple, list)):
        raise OptionError("a hierarchy is a tuple of children (player indices or tuples)")
    if n == 1 and len(h) == 1 and _is_leaf(h[0]):
        if int(h[0]) != 0:
            raise OptionError("a hierarchy of one player is (0,)")
        return (0,)
    seen: list[int] = []
    out = _check(h, seen)
    if sorted(seen) != list(range(n)):
        counts = np.bincount(np.asarray([s for s in seen if s >= 0], dtype=np.int64), minlength=n)
        missing = [i for i in range(n) if i >= len(counts) or counts[i] == 0][:5]
        repeated = [i for i in range(len(counts)) if counts[i] > 1][:5]
        outside = [s for s in seen if not 0 <= s < n][:5]
        raise OptionError(
            f"a hierarchy must hold each of the {n} players exactly once "
            f"(missing {missing}, repeated {repeated}, out of range {outside})"
        )
    return out


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check(h: Any, seen: list[int]) -> Any:
    if _is_leaf(h):
        seen.append(int(h))
        return int(h)
    if not isinstance(h, (tuple, list)) or len(h) < 2:
        raise OptionError(f"a hierarchy node is a tuple of at least 2 children, got {h!r:.60}")
    return tuple(_check(child, seen) for child in h)


def internal_nodes(h: Any) -> int:
    """How many nodes (tuples) the hierarchy has."""
    if _is_leaf(h):
        return 0
    return 1 + sum(internal_nodes(child) for child in h)


def describe(h: Any) -> dict[str, int]:
    """Size facts for provenance: players, nodes, depth, widest node."""

    def widest(x: Any) -> int:
        return 0 if _is_leaf(x) else max(len(x), *(widest(c) for c in x))

    return {
        "players": len(players_of(h)),
        "nodes": internal_nodes(h),
        "depth": depth(h),
        "widest": widest(h),
    }


def as_hierarchy(h: Sequence[Any] | None, n: int) -> Hierarchy:
    """`h` validated over n players, or `sequence(n)` when None."""
    return sequence(n) if h is None else validate(h, n)
