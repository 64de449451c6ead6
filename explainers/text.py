"""Old import path of the text game: see explainers/games/text.py."""

from explainers.games.text import (
    ABSENCES,
    PLAYERS,
    WORD,
    TextGame,
    text_games,
    token_spans,
    word_spans,
)

__all__ = ["ABSENCES", "PLAYERS", "WORD", "TextGame", "text_games", "token_spans", "word_spans"]
