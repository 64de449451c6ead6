"""The model registry: built-in models loaded lazily, user models from the shared store.

User models live in a `ModelStore` (the database every API process shares): the registry lists
what the store holds (its answer cached for about a second), builds a model on first use,
rebuilds it when another process stored a new version and forgets it when one removed it.
Models passed to `register` while the store does not list their name stay local to the process.
Every torch model is moved to the registry's device when it enters, and its working memory
per row measured against the registry's memory budget per model call (MAX_BATCH_BYTES):
models/device.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from sqlalchemy.exc import SQLAlchemyError

from models.base import DEFAULT_MAX_BATCH_BYTES, Model, ModelNotReadyError, UnknownModelError
from models.catalog import BUILTINS, BuiltinModel
from models.device import place, prepare_probes, resolve_device

if TYPE_CHECKING:
    from models.store import ModelStore

log = logging.getLogger(__name__)

Build = Callable[[dict[str, Any], dict[str, bytes]], Model]


def _build_user_model(meta: dict[str, Any], files: dict[str, bytes]) -> Model:
    from models.sandbox import sandboxed_build as build_model  # in model worker processes

    return build_model(meta, files)


class ModelRegistry:
    """Thread-safe name -> Model map; built-ins train or load on first use, one lock per name."""

    def __init__(
        self,
        cache_dir: Path,
        builtins: Sequence[BuiltinModel] = BUILTINS,
        store: ModelStore | None = None,
        build: Build = _build_user_model,
        refresh_s: float = 1.0,
        device: str | torch.device = "cpu",
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        """`device`: where torch models compute, a DEVICE setting (auto | cpu | cuda | cuda:k)
        or a torch device; raises models.device.DeviceError when this machine has no such
        device. `max_batch_bytes`: the working memory of one model call (MAX_BATCH_BYTES)."""
        self._device = resolve_device(device) if isinstance(device, str) else device
        if max_batch_bytes < 1:
            raise ValueError("max_batch_bytes must be positive")
        self._max_batch_bytes = max_batch_bytes
        prepare_probes()  # models are measured in worker threads (models/device.py)
        names = [b.name for b in builtins]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate built-in model names: {duplicates}")
        self._cache_dir = cache_dir
        self._builtins = {b.name: b for b in builtins}
        self._load_locks = {name: threading.Lock() for name in names}
        self._lock = threading.Lock()  # guards the dicts below
        self._models: dict[str, Model] = {}
        self._errors: dict[str, str] = {}
        self._store = store
        self._build = build
        self._refresh_s = refresh_s  # how stale the view of the store may be (seconds)
        self._stored: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (version, meta)
        self._synced: tuple[float, int] | None = None  # (monotonic time, store generation)
        self._sync_lock = threading.Lock()
        self._user_locks: dict[str, threading.Lock] = {}

    @property
    def device(self) -> torch.device:
        """Where this registry's torch models compute."""
        return self._device

    @property
    def max_batch_bytes(self) -> int:
        """The working memory of one model call of this registry's models (bytes)."""
        return self._max_batch_bytes

    @property
    def store(self) -> ModelStore | None:
        """The store user models come from (None: registered models are process-local)."""
        return self._store

    def use_store(self, store: ModelStore | None) -> None:
        """Follow `store` from now on; models of the previous store are forgotten, models
        registered locally are kept."""
        with self._sync_lock, self._lock:
            for name in self._stored:
                self._models.pop(name, None)
                self._errors.pop(name, None)
            self._stored = {}
            self._synced = None
            self._store = store

    def _sync(self, force: bool = False) -> None:
        """Bring the view of the store up to date if it is older than `refresh_s` or than a
        write made through the store in this process. A store that cannot be reached keeps the
        last view (logged; tried again after `refresh_s`)."""
        store = self._store
        if store is None:
            return
        with self._sync_lock:
            now = time.monotonic()
            synced = self._synced
            if (
                not force
                and synced is not None
                and now - synced[0] < self._refresh_s
                and synced[1] == store.generation
            ):
                return
            generation = store.generation  # read first: a write during the queries is not lost
            with self._lock:
                known = {n: v for n, (v, _) in self._stored.items()}
            try:
                current = store.current()
                changed = [n for n, v in current.items() if known.get(n) != v]
                metas = store.metas(changed) if changed else {}
            except SQLAlchemyError as exc:
                log.warning("model store unreachable, listing what was stored before: %s", exc)
                self._synced = (now, generation)
                return
            with self._lock:
                stored: dict[str, tuple[str, dict[str, Any]]] = {}
                for name, version in current.items():
                    previous = self._stored.get(name)
                    if name in self._builtins:
                        continue  # never shadows a built-in
                    if previous is not None and previous[0] == version:
                        stored[name] = previous
                        continue
                    if name in metas and metas[name].get("version") == version:
                        stored[name] = (version, metas[name])
                    elif previous is not None:  # replaced between the two queries: next time
                        stored[name] = previous
                        continue
                    else:
                        continue
                    self._errors.pop(name, None)  # a new version: its own errors
                    model = self._models.get(name)
                    if model is not None and model.version != version:
                        del self._models[name]  # replaced by another process
                for name in self._stored.keys() - stored.keys():
                    self._models.pop(name, None)  # removed by another process
                    self._errors.pop(name, None)
                self._stored = stored
                self._synced = (now, generation)

    def builtin_names(self) -> set[str]:
        return set(self._builtins)

    def names(self) -> list[str]:
        """All model names, built-in and registered, sorted."""
        self._sync()
        with self._lock:
            return sorted(self._builtins.keys() | self._models.keys() | self._stored.keys())

    def owner(self, name: str) -> tuple[str | None, bool]:
        """(the key that registered `name`, whether it is shared with every key); (None, True)
        for built-ins and models registered without keys."""
        if name in self._builtins:
            return None, True
        self._sync()
        with self._lock:
            entry = self._stored.get(name)
        meta = {} if entry is None else entry[1]
        owner = meta.get("owner")
        return (owner if isinstance(owner, str) else None), bool(meta.get("shared", False))

    def known(self, name: str) -> bool:
        """Whether `name` is a built-in or a registered model (loaded or not)."""
        return name in self._builtins or name in self.names()

    def get(self, name: str) -> Model:
        """The model called `name`; a built-in is loaded (trained if needed) on first use, a
        stored user model is built on first use and again after it was replaced.

        Raises UnknownModelError for an unknown name and ModelNotReadyError when loading fails
        (the next call tries again).
        """
        if name not in self._builtins:
            return self._user(name)
        with self._lock:
            model = self._models.get(name)
        if model is not None:
            return model
        builtin = self._builtins[name]
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
                model = place(builtin.load(self._cache_dir), self._device, self._max_batch_bytes)
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

    def _current(self, name: str) -> tuple[Model | None, tuple[str, dict[str, Any]] | None]:
        """(the built model if it is the stored version or local, the store's entry)."""
        with self._lock:
            model = self._models.get(name)
            entry = self._stored.get(name)
        if model is not None and entry is not None and model.version != entry[0]:
            model = None
        return model, entry

    def _user(self, name: str) -> Model:
        self._sync()
        model, entry = self._current(name)
        if model is not None:
            return model
        if entry is None:
            raise UnknownModelError(name)
        with self._lock:
            lock = self._user_locks.setdefault(name, threading.Lock())
        with lock:  # one build per name at a time; the others wait for it
            model, entry = self._current(name)
            if model is not None:
                return model
            if entry is None or self._store is None:
                raise UnknownModelError(name)
            try:
                meta, files = self._store.load(name)
            except KeyError:  # removed meanwhile
                raise UnknownModelError(name) from None
            except SQLAlchemyError as exc:
                raise ModelNotReadyError(f"model {name!r}: the store is unreachable") from exc
            try:
                model = place(self._build(meta, files), self._device, self._max_batch_bytes)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._errors[name] = reason
                raise ModelNotReadyError(f"model {name!r} failed to load: {reason}") from exc
            with self._lock:
                self._stored[name] = (model.version, meta)  # may be newer than the last view
                self._models[name] = model
                self._errors.pop(name, None)
            return model

    def register(self, model: Model) -> Model:
        """Add a user model, or replace the one of the same name; built-in names are reserved.

        Called after the model was saved to the store; a model the store does not list stays
        local to this process. The model is moved to the registry's device, under its memory
        budget per model call."""
        if model.name in self._builtins:
            raise ValueError(f"{model.name!r} is a built-in model and cannot be replaced")
        model = place(model, self._device, self._max_batch_bytes)
        self._sync(force=True)
        with self._lock:
            self._models[model.name] = model
            self._errors.pop(model.name, None)
        return model

    def unregister(self, name: str) -> None:
        """Remove a user model (the caller removes it from the store)."""
        if name in self._builtins:
            raise ValueError(f"{name!r} is a built-in model and cannot be removed")
        self._sync(force=True)
        with self._lock:
            model = self._models.pop(name, None)
            entry = self._stored.pop(name, None)
            self._errors.pop(name, None)
        if model is None and entry is None:
            raise UnknownModelError(name)

    def load_all(self, include_background: bool = False) -> None:
        """Load every built-in (background ones last, when asked); failures are recorded in
        `status()` instead of raised. Stored user models are built on first use."""
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
        if name in self._builtins:
            with self._lock:
                return name in self._models
        return self._current(name)[0] is not None

    def peek(self, name: str) -> tuple[Model | None, str, str | None]:
        """(the model if loaded, its modality, its last load error) without loading anything."""
        builtin = self._builtins.get(name)
        if builtin is None:
            self._sync()
            model, entry = self._current(name)
            with self._lock:
                error = self._errors.get(name)
            if model is not None:
                return model, model.modality, error
            if entry is None:
                raise UnknownModelError(name)
            return None, str(entry[1].get("modality", "tabular")), error
        with self._lock:
            model = self._models.get(name)
            error = self._errors.get(name)
        return model, model.modality if model is not None else builtin.modality, error

    def status(self) -> dict[str, dict[str, object]]:
        """Per model: {"loaded": bool, "error": str | None} (the last load error, if any);
        background built-ins and stored user models (built on first use) add
        {"background": True}: readiness does not wait for them."""
        self._sync()
        with self._lock:
            names = sorted(self._builtins.keys() | self._models.keys() | self._stored.keys())
        out: dict[str, dict[str, object]] = {}
        for name in names:
            stored = name not in self._builtins and name in self._stored
            out[name] = {"loaded": self.loaded(name), "error": self._errors.get(name)}
            if stored or self.is_background(name):
                out[name]["background"] = True
        return out
