"""Old import path of the masked-model game: see explainers/games/masked.py."""

from explainers.games.masked import MaskedModelGame, patch_groups

__all__ = ["MaskedModelGame", "patch_groups"]
