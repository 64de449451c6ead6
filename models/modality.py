"""The one spelling of a model's modality (no heavy imports: games and estimators use it)."""

from __future__ import annotations

from enum import StrEnum


class Modality(StrEnum):
    """What a model takes and gives. A StrEnum, so a value is its string ("tabular") in JSON,
    in stored declarations and in every comparison."""

    TABULAR = "tabular"
    IMAGE = "image"
    TEXT = "text"  # a text classifier or regressor
    RANKER = "ranker"  # scores documents for a query
    ENCODER = "encoder"  # gives a representation (of texts or arrays)
    LM = "lm"  # a causal language model


__all__ = ["Modality"]
