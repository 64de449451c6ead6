"""The model registry: built-in models loaded lazily, user models registered at runtime."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path

from models.base import Model, ModelNotReadyError, UnknownModelError
from models.builtin import BUILTINS, BuiltinModel


class ModelRegistry:
    """Thread-safe name -> Model map; built-ins train or load on first use, one lock per name."""

    def __init__(self, cache_dir: Path, builtins: Sequence[BuiltinModel] = BUILTINS) -> None:
        names = [b.name for b in builtins]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate built-in model names: {duplicates}")
        self._cache_dir = cache_dir
        self._builtins = {b.name: b for b in builtins}
        self._load_locks = {name: threading.Lock() for name in names}
        self._lock = threading.Lock()  # guards the two dicts below
        self._models: dict[str, Model] = {}
        self._errors: dict[str, str] = {}

    def builtin_names(self) -> set[str]:
        return set(self._builtins)

    def names(self) -> list[str]:
        """All model names, built-in and registered, sorted."""
        with self._lock:
            return sorted(self._builtins.keys() | self._models.keys())

    def get(self, name: str) -> Model:
        """The model called `name`; a built-in is loaded (trained if needed) on first use.

        Raises UnknownModelError for an unknown name and ModelNotReadyError when loading fails
        (the next call tries again).
        """
        with self._lock:
            model = self._models.get(name)
        if model is not None:
            return model
        builtin = self._builtins.get(name)
        if builtin is None:
            raise UnknownModelError(name)
        lock = self._load_locks[name]
        # A background model being loaded answers "not ready" at once instead of holding the
        # caller for the minutes its load can take.
        if not lock.acquire(blocking=not builtin.background):
            raise ModelNotReadyError(f"model {name!r} is loading; retry in a little while")
        try:
            with self._lock:
                model = self._models.get(name)
            if model is not None:
                return model
            try:
                model = builtin.load(self._cache_dir)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._errors[name] = reason
                raise ModelNotReadyError(f"model {name!r} failed to load: {reason}") from exc
            with self._lock:
                self._models[name] = model
                self._errors.pop(name, None)
            return model
        finally:
            lock.release()

    def register(self, model: Model) -> Model:
        """Add a user model, or replace the one of the same name; built-in names are reserved."""
        if model.name in self._builtins:
            raise ValueError(f"{model.name!r} is a built-in model and cannot be replaced")
        with self._lock:
            self._models[model.name] = model
        return model

    def unregister(self, name: str) -> None:
        """Remove a user model."""
        if name in self._builtins:
            raise ValueError(f"{name!r} is a built-in model and cannot be removed")
        with self._lock:
            if self._models.pop(name, None) is None:
                raise UnknownModelError(name)

    def load_all(self, include_background: bool = False) -> None:
        """Load every built-in (background ones last, when asked); failures are recorded in
        `status()` instead of raised."""
        names = [n for n, b in self._builtins.items() if not b.background]
        if include_background:
            names += [n for n, b in self._builtins.items() if b.background]
        for name in names:
            with contextlib.suppress(ModelNotReadyError):
                self.get(name)

    def is_background(self, name: str) -> bool:
        """Whether `name` is a built-in that loads in the background (readiness skips it)."""
        builtin = self._builtins.get(name)
        return builtin is not None and builtin.background

    def loaded(self, name: str) -> bool:
        """Whether `name` is loaded and ready (False for unknown names)."""
        with self._lock:
            return name in self._models

    def peek(self, name: str) -> tuple[Model | None, str, str | None]:
        """(the model if loaded, its modality, its last load error) without loading anything."""
        with self._lock:
            model = self._models.get(name)
            error = self._errors.get(name)
        builtin = self._builtins.get(name)
        if model is None and builtin is None:
            raise UnknownModelError(name)
        modality = model.modality if model is not None else builtin.modality  # type: ignore[union-attr]
        return model, modality, error

    def status(self) -> dict[str, dict[str, object]]:
        """Per model: {"loaded": bool, "error": str | None} (the last load error, if any);
        background built-ins add {"background": True}."""
        with self._lock:
            out: dict[str, dict[str, object]] = {
                name: {"loaded": name in self._models, "error": self._errors.get(name)}
                for name in sorted(self._builtins.keys() | self._models.keys())
            }
        for name, entry in out.items():
            if self.is_background(name):
                entry["background"] = True
        return out
