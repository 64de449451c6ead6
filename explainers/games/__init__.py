"""Games: batched value functions over coalitions of players, v(bool[m, n]) -> float[m(, k)].

A game is a model, a masker (what "absent" means: `absence.py` builds every reference row) and a
target. Here: the recorder that meters a game, deadlines/cancel checks and the package's errors.
Games: `masked.py` (tabular and image features), `text.py` (words and tokens), `spans.py`
(context spans of a language model's prompt); `absence.py` (every reference row) and
`targets.py` (the explained scalar, e.g. COCOA's contrastive similarity). No torch at import.
"""

from explainers.games.deadlines import (
    check_deadline,
    deadline,
    has_deadline,
    stop_when,
)
from explainers.games.errors import (
    BudgetError,
    Cancelled,
    DeadlineExceeded,
    ExplainerError,
    NotDifferentiableError,
)
from explainers.games.recorder import Game, GameRecorder, all_masks, rows_per_coalition

__all__ = [
    "BudgetError",
    "Cancelled",
    "DeadlineExceeded",
    "ExplainerError",
    "Game",
    "GameRecorder",
    "NotDifferentiableError",
    "all_masks",
    "check_deadline",
    "deadline",
    "has_deadline",
    "rows_per_coalition",
    "stop_when",
]
