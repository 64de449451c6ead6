"""The model registry, the `Model` type and the built-in models.

Names load on first use (PEP 562), so `import models.lm_protocol` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.base import Model, ModelError, ModelNotReadyError, TextModel, UnknownModelError
    from models.catalog import BUILTINS, BuiltinModel
    from models.registry import ModelRegistry

_WHERE = {
    "BUILTINS": "models.catalog",
    "BuiltinModel": "models.catalog",
    "Model": "models.base",
    "ModelError": "models.base",
    "ModelNotReadyError": "models.base",
    "ModelRegistry": "models.registry",
    "TextModel": "models.base",
    "UnknownModelError": "models.base",
}

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
