"""The generic store of trained artifacts (Salvage's, AutoGnothi's) and what a trainer hands it.

An artifact is the trained networks of one model version and training configuration: their
state dicts (`weights.pt`, loaded with `weights_only=True`) and a record (`meta.json`). With a
`ModelStore` the artifacts live in the database every process shares and
`root/<model>/<model version>/<config hash>/` is this process's cache of them; without one, that
folder holds them. Artifacts of other model versions are never used, so re-registering a model
invalidates them; they survive restarts. A family subclasses `ArtifactStore` with its kind and
how its networks become state dicts and back (explainers/amortized/salvage/explainer.py,
explainers/amortized/autognothi/explainer.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar, cast

import torch
from pydantic import BaseModel

from explainers.context import Artifacts, NotTrainedError, RunContext
from models.base import Model

if TYPE_CHECKING:
    from models.store import ModelStore


@dataclass(frozen=True)
class ArtifactInfo:
    """What `meta.json` records about an artifact."""

    id: str  # the training configuration's hash
    model_name: str
    model_version: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    history: tuple[dict[str, Any], ...]
    created_at: float
    data_id: str = "reference"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _info(raw: dict[str, Any]) -> ArtifactInfo:
    return ArtifactInfo(**{**raw, "history": tuple(raw["history"])})


class Trainable(Protocol):
    """What a store records of a trained artifact (Salvage's and AutoGnothi's `Trained`)."""

    @property
    def id(self) -> str: ...
    @property
    def options(self) -> BaseModel: ...
    @property
    def metrics(self) -> dict[str, Any]: ...
    @property
    def history(self) -> tuple[dict[str, Any], ...]: ...
    @property
    def data_id(self) -> str: ...


T = TypeVar("T", bound=Trainable)


class ArtifactStore(Generic[T]):
    """Trained artifacts of one kind in `db` (shared by every process) cached under `root`, or
    under `root` alone; folder writes are atomic (a folder rename). A subclass says how its
    networks become state dicts (`_state`) and back (`_build`)."""

    # Loaded networks of a subclass, shared by its stores in the process (artifacts never change
    # in place); each subclass has its own (`__init_subclass__`).
    _loaded: ClassVar[OrderedDict[tuple[str, float], Any]] = OrderedDict()
    _lock: ClassVar[threading.Lock] = threading.Lock()
    max_loaded = 8

    kind: ClassVar[str]  # the artifact kind in the model store
    label: ClassVar[str]  # the method's name in messages

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._loaded = OrderedDict()

    def __init__(self, root: Path, db: ModelStore | None = None) -> None:
        self.root = root
        self.db = db

    @classmethod
    def within(cls, artifacts: Artifacts) -> Self:
        """The artifacts of this kind in a run context's artifact store (`root/<kind>/`)."""
        return cls(artifacts.folder(cls.kind), artifacts.db)

    @classmethod
    def load_pinned(cls, model: Model, artifact: str | None, context: RunContext | None) -> T:
        """The trained artifact that pinned options name, from `context`'s store."""
        artifacts = (context or RunContext()).need_artifacts(cls.kind)
        if artifact is None:
            raise NotTrainedError(f"{cls.kind} options are not bound to a trained artifact")
        return cls.within(artifacts).load(model, artifact)

    def _state(self, trained: T) -> dict[str, Any]:
        """The tensors `weights.pt` holds (CPU tensors: an artifact loads on any device)."""
        raise NotImplementedError

    def _build(self, model: Model, info: ArtifactInfo, state: dict[str, Any]) -> T:
        """The trained networks of a record and its `weights.pt`."""
        raise NotImplementedError

    def _dir(self, model: str, version: str, artifact: str = "") -> Path:
        path = self.root / _safe(model) / _safe(version)
        return path / _safe(artifact) if artifact else path

    def save(self, model: Model, trained: T) -> ArtifactInfo:
        """Store a trained artifact for `model`'s current version; returns its record."""
        info = ArtifactInfo(
            trained.id,
            model.name,
            model.version,
            trained.options.model_dump(mode="json"),
            trained.metrics,
            trained.history,
            time.time(),
            trained.data_id,
        )
        buf = io.BytesIO()
        torch.save(self._state(trained), buf)
        meta = dict(info.__dict__)
        if self.db is not None:
            blob = buf.getvalue()
            self.db.put_artifact(self.kind, model.name, model.version, info.id, meta, blob)
        self._write_local(meta, buf.getvalue())
        return info

    def _write_local(self, meta: dict[str, Any], weights: bytes) -> None:
        final = self._dir(meta["model_name"], meta["model_version"], meta["id"])
        tmp = final.parent / f".tmp-{meta['id']}-{os.getpid()}-{threading.get_ident()}"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            (tmp / "weights.pt").write_bytes(weights)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            if final.exists():  # the same configuration again: keep the newer one
                shutil.rmtree(final)
            os.replace(tmp, final)
        except OSError:
            if self.db is None:
                raise
            # Only the cache: the database holds the artifact.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _local_info(self, model: str, version: str, artifact: str) -> ArtifactInfo | None:
        meta = self._dir(model, version, artifact) / "meta.json"
        try:
            return _info(json.loads(meta.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _local_list(self, model: str, version: str) -> list[ArtifactInfo]:
        folder = self._dir(model, version)
        found = [
            self._local_info(model, version, p.name)
            for p in (sorted(folder.iterdir()) if folder.is_dir() else [])
            if not p.name.startswith(".")
        ]
        return [i for i in found if i is not None]

    def info(self, model: str, version: str, artifact: str) -> ArtifactInfo | None:
        if self.db is None:
            return self._local_info(model, version, artifact)
        raw = self.db.artifact_meta(self.kind, model, version, artifact)
        return None if raw is None else _info(raw)

    def list(self, model: str, version: str) -> list[ArtifactInfo]:
        """Artifacts of one model version, newest first."""
        if self.db is None:
            found = self._local_list(model, version)
        else:
            found = [_info(raw) for raw in self.db.artifacts(self.kind, model, version).values()]
            known = {i.id for i in found}
            for local in self._local_list(model, version):
                if local.id not in known:  # stored by a release that kept them on disk only
                    weights = self._dir(model, version, local.id) / "weights.pt"
                    try:
                        data = weights.read_bytes()
                    except OSError:
                        continue
                    self.db.put_artifact(self.kind, model, version, local.id, local.__dict__, data)
                    found.append(local)
        return sorted(found, key=lambda i: -i.created_at)

    def _weights(self, info: ArtifactInfo) -> dict[str, Any]:
        """The state dicts: from the cache folder if it holds this very artifact, else from
        the database (then cached)."""
        path = self._dir(info.model_name, info.model_version, info.id) / "weights.pt"
        local = self._local_info(info.model_name, info.model_version, info.id)
        if self.db is None or (local is not None and local.created_at == info.created_at):
            try:
                return dict(torch.load(path, map_location="cpu", weights_only=True))
            except Exception:
                if self.db is None:
                    raise
                # A missing or damaged cache file: read the database again.
        found = self.db.get_artifact(self.kind, info.model_name, info.model_version, info.id)
        if found is None:
            raise NotTrainedError(f"no {self.label} artifact {info.id!r} for {info.model_name}")
        meta, data = found
        self._write_local(meta, data)
        return dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))

    def load(self, model: Model, artifact: str) -> T:
        """The trained networks of an artifact (kept in a small in-process LRU)."""
        info = self.info(model.name, model.version, artifact)
        if info is None:
            raise NotTrainedError(f"no {self.label} artifact {artifact!r} for {model.name}")
        key = (str(self._dir(model.name, model.version, artifact)), info.created_at)
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return cast(T, self._loaded[key])
        trained = self._build(model, info, self._weights(info))
        with self._lock:
            self._loaded[key] = trained
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        return trained


__all__ = ["ArtifactInfo", "ArtifactStore", "Trainable"]
