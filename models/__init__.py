"""Model registry, the `Model` type and the built-in models."""

from models.base import Model, ModelError, ModelNotReadyError, TextModel, UnknownModelError
from models.catalog import BUILTINS, BuiltinModel
from models.registry import ModelRegistry

__all__ = [
    "BUILTINS",
    "BuiltinModel",
    "Model",
    "ModelError",
    "ModelNotReadyError",
    "ModelRegistry",
    "TextModel",
    "UnknownModelError",
]
