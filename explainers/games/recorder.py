"""The game type and the recorder that meters a game (memo, budget, deadline).

A game maps a boolean mask array [m, n] (True = player present) to values [m] or [m, k].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from explainers.games.deadlines import check_deadline
from explainers.games.errors import BudgetError, ExplainerError

Game = Callable[[np.ndarray], Any]  # bool [m, n] -> float [m] or [m, k]


def rows_per_coalition(game: Game) -> int:
    """Model rows one coalition costs (background rows); 1 for a plain callable."""
    return int(getattr(game, "rows_per_coalition", 1))


def all_masks(n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Masks of coalitions start..stop-1 in bit order: bit i of the index = player i. [m, n]"""
    idx = np.arange(start, (1 << n) if stop is None else stop, dtype=np.int64)
    return ((idx[:, None] >> np.arange(n, dtype=np.int64)) & 1).astype(bool)


class GameRecorder:
    """Evaluates a game within a budget, memoising coalitions and counting model rows.

    `budget` is in model evaluations (rows given to the model); one coalition costs
    `rows_per_coalition(game)` of them. Values are returned as float64 [m, k].
    `hierarchy`: the game's own grouping of its players (games/hierarchy.py), for Owen values;
    None when the game has none.
    """

    def __init__(self, game: Game, n_players: int, budget: int | None = None) -> None:
        self.game = game
        self.n_players = n_players
        self.cost = rows_per_coalition(game)
        self.budget = budget
        self.hierarchy: tuple[Any, ...] | None = getattr(game, "hierarchy", None)
        self.n_coalitions = 0
        self.n_outputs: int | None = None
        self.squeeze = False
        self._memo: dict[bytes, np.ndarray] = {}

    @property
    def n_evaluations(self) -> int:
        return self.n_coalitions * self.cost

    @property
    def remaining(self) -> int | None:
        """Coalitions still affordable (None = unlimited)."""
        if self.budget is None:
            return None
        return self.budget // self.cost - self.n_coalitions

    def _raw(self, masks: np.ndarray) -> np.ndarray:
        if masks.shape[0] == 0:
            return np.zeros((0, self.n_outputs or 1))
        check_deadline()
        rem = self.remaining
        if rem is not None and masks.shape[0] > rem:
            raise BudgetError(
                f"{masks.shape[0]} coalitions requested but only {rem} fit in the budget"
            )
        out = np.asarray(self.game(masks), dtype=np.float64)
        if out.ndim == 1:
            self.squeeze = True
            out = out[:, None]
        if out.shape[0] != masks.shape[0]:
            raise ExplainerError(f"game returned {out.shape[0]} values for {masks.shape[0]} masks")
        self.n_outputs = out.shape[1]
        self.n_coalitions += masks.shape[0]
        return out

    def evaluate_distinct(self, masks: np.ndarray) -> np.ndarray:
        """Evaluate masks known to be distinct and new, bypassing the memo. [m, k]"""
        return self._raw(np.asarray(masks, dtype=bool))

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        """Evaluate masks, paying only for coalitions not seen before. [m, k]"""
        masks = np.asarray(masks, dtype=bool)
        if masks.shape[0] == 0:
            return self._raw(masks)
        packed = np.packbits(masks, axis=1)
        uniq, first, inverse = np.unique(
            packed.view(f"V{packed.shape[1]}").ravel(), return_index=True, return_inverse=True
        )
        keys = uniq.tolist()
        todo = [i for i, key in enumerate(keys) if key not in self._memo]
        if todo:
            values = self._raw(masks[first[todo]])
            self._memo.update(zip((keys[i] for i in todo), values, strict=True))
        table = np.stack([self._memo[key] for key in keys])
        return table[inverse.ravel()]

    def shape_out(self, values: np.ndarray) -> np.ndarray:
        """Drop the output axis again when the game returned scalars."""
        return values[..., 0] if self.squeeze else values
