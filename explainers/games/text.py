"""Text games: the players are a string's words or tokens; absent ones are deleted or masked.

v(S) = f(the text with the pieces outside S removed, or each replaced by a mask token), the
occlusion game of shap's Text masker and of Kokalj et al. (2021, "BERT meets Shapley").
Everything between pieces (spaces, and punctuation for word players) always stays.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from explainers.explanation import OptionError, Span
from explainers.games.hierarchy import Hierarchy, sequence

if TYPE_CHECKING:
    from models.base import TextModel

# A word: letters/digits, with inner apostrophes or hyphens (don't, well-made). Punctuation is
# not a player: it stays in every coalition's text.
WORD = re.compile(r"\w+(?:['’-]\w+)*")
_WORD_CHAR = re.compile(r"\w")

ABSENCES = ("delete", "mask")
PLAYERS = ("words", "tokens")


def word_spans(text: str) -> list[Span]:
    """The words of `text` with their character offsets."""
    return [Span(m.group(), m.start(), m.end()) for m in WORD.finditer(text)]


def token_spans(text: str, offsets: Sequence[tuple[int, int]]) -> list[Span]:
    """Spans of a tokenizer's tokens (character offsets, special tokens left out)."""
    return [Span(text[s:e], s, e) for s, e in offsets if e > s]


class TextGame:
    """v(S) = f(text with the pieces outside S deleted or masked). [m, k]

    `predict_texts` maps a list of strings to [m, k]; one coalition is one model row.
    Masking puts one `mask_token` in place of each absent piece. Deleting a piece also drops the
    whitespace before it (no double spaces), unless a word character follows the piece (a
    sub-word token), so that its neighbours stay apart. `hierarchy` (for the partition
    estimator's Owen values): contiguous halves of the pieces in reading order, `sequence(n)`.
    """

    rows_per_coalition = 1

    def __init__(
        self,
        predict_texts: Callable[[list[str]], np.ndarray],
        text: str,
        pieces: Sequence[Span],
        absence: str = "delete",
        mask_token: str = "[MASK]",
        max_rows: int = 4096,
    ) -> None:
        if absence not in ABSENCES:
            raise OptionError(f"absence must be one of {ABSENCES}, got {absence!r}")
        if not pieces:
            raise OptionError("a text game needs at least one piece")
        ends = [0, *(end for p in pieces for end in (p.start, p.end)), len(text)]
        if any(b < a for a, b in itertools.pairwise(ends)):
            raise OptionError("pieces must be in order, inside the text and not overlap")
        self.predict_texts = predict_texts
        self.text = text
        self.pieces = tuple(pieces)
        self.n_players = len(self.pieces)
        self.hierarchy: Hierarchy = sequence(self.n_players)
        self.absence = absence
        self.mask_token = mask_token
        self.max_rows = max_rows
        self._gaps = [text[a:b] for a, b in zip(ends[::2], ends[1::2], strict=True)]  # n + 1
        # Deleting piece i also drops the whitespace before it, unless a word character follows
        # the piece (a sub-word token glued to the next one): "was terrible." -> "was."
        self._eat_gap = [
            self._gaps[i].isspace() and not _WORD_CHAR.match(text, p.end)
            for i, p in enumerate(self.pieces)
        ]

    def compose(self, present: np.ndarray) -> str:
        """The text of one coalition (bool [n])."""
        parts: list[str] = []
        for i, piece in enumerate(self.pieces):
            if present[i]:
                parts += (self._gaps[i], piece.text)
            elif self.absence == "mask":
                parts += (self._gaps[i], self.mask_token)
            elif not self._eat_gap[i]:
                parts.append(self._gaps[i])
        parts.append(self._gaps[-1])
        out = "".join(parts)
        # Deleted leading words leave their trailing space: drop it unless the text had one.
        return out if self.text[:1].isspace() else out.lstrip()

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)  # [m, n]
        texts = [self.compose(row) for row in masks]
        # Different coalitions can give the same string (repeated words): predict it once. The
        # recorder still counts one evaluation per coalition, so the budget is an upper bound.
        unique = list(dict.fromkeys(texts))
        where = {t: i for i, t in enumerate(unique)}
        parts = [
            np.asarray(self.predict_texts(unique[s : s + self.max_rows]), dtype=np.float64)
            for s in range(0, len(unique), self.max_rows)
        ]
        values = np.concatenate(parts)  # [u, k]
        return values[[where[t] for t in texts]]  # [m, k]


def text_games(
    model: TextModel,
    texts: Sequence[str] | np.ndarray,
    players: str = "words",
    absence: str = "delete",
) -> list[TextGame]:
    """One game per text over its own words or tokens (OptionError for a text without any)."""
    if players not in PLAYERS:
        raise OptionError(f"players must be one of {PLAYERS}, got {players!r}")
    games = []
    for i, raw in enumerate(texts):
        text = str(raw)
        if players == "words":
            pieces = word_spans(text)
        else:
            pieces = token_spans(text, model.token_spans(text))
        if not pieces:
            raise OptionError(f"inputs[{i}] has no {players} to explain")
        games.append(TextGame(model.predict_texts, text, pieces, absence, model.mask_token))
    return games
