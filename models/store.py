"""Registered models and their artifacts in SQL (SQLAlchemy; SQLite or PostgreSQL).

Every API process (and worker) that shares a DATABASE_URL sees the same models. A model is its
`meta` (a declaration plus "version", a content hash) and its files ("model", "background");
files are read from the database once per process and version, then from a local cache folder.
Artifacts (trained Salvage explainers) belong to a model version and are stored alongside.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Float, LargeBinary, String, Text, create_engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

MANIFEST = ".files.json"  # written last into a cached version folder: the folder is complete


class Base(DeclarativeBase):
    pass


class ModelRow(Base):
    __tablename__ = "registered_models"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))
    meta: Mapped[str] = mapped_column(Text)  # JSON, "version" included
    created_at: Mapped[float] = mapped_column(Float)


class FileRow(Base):
    __tablename__ = "registered_model_files"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)  # BYTEA on PostgreSQL, BLOB on SQLite


class ArtifactRow(Base):
    __tablename__ = "model_artifacts"

    kind: Mapped[str] = mapped_column(String(64), primary_key=True)  # e.g. "salvage"
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    meta: Mapped[str] = mapped_column(Text)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


def safe_name(name: str) -> str:
    """A folder name for `name`: itself when harmless, else a hash (never '..' or a slash)."""
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
        return name
    return "_" + hashlib.sha256(name.encode()).hexdigest()[:24]


class ModelStore:
    """Registered models, their files and artifacts; each write is one short transaction."""

    def __init__(self, database_url: str, cache_dir: Path) -> None:
        connect_args = {"timeout": 30} if database_url.startswith("sqlite") else {}
        self.engine = create_engine(database_url, pool_pre_ping=True, connect_args=connect_args)
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        Base.metadata.create_all(self.engine)
        self.cache_dir = cache_dir
        # Bumped by every write through this object: a reader's cached view of `current()`
        # older than a write made here is stale at once.
        self.generation = 0
        self._gen_lock = threading.Lock()

    def _bump(self) -> None:
        with self._gen_lock:
            self.generation += 1

    def _insert(self) -> Any:
        return postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert

    # -- models ---------------------------------------------------------------------------------

    def save(self, meta: dict[str, Any], files: dict[str, bytes]) -> None:
        """Store a model version, replacing the name's previous version and its artifacts."""
        name, version = meta["name"], meta["version"]
        row = {
            "name": name,
            "version": version,
            "meta": json.dumps(meta),
            "created_at": time.time(),
        }
        upsert = self._insert()(ModelRow).values(row)
        upsert = upsert.on_conflict_do_update(
            index_elements=[ModelRow.name],
            set_={k: upsert.excluded[k] for k in ("version", "meta", "created_at")},
        )
        with self.session.begin() as s:
            # The upsert first: it locks the name's row, so concurrent saves of one name run one
            # after the other and the file deletes below see every committed file.
            s.execute(upsert)
            s.execute(delete(FileRow).where(FileRow.name == name))
            s.execute(
                delete(ArtifactRow).where(ArtifactRow.model == name, ArtifactRow.version != version)
            )
            if files:
                s.execute(
                    self._insert()(FileRow).values(
                        [
                            {"name": name, "version": version, "key": k, "data": v}
                            for k, v in files.items()
                        ]
                    )
                )
        self._bump()

    def remove(self, name: str) -> bool:
        """Delete a model, its files and artifacts, and its local cache; False if unknown."""
        with self.session.begin() as s:
            result = s.execute(delete(ModelRow).where(ModelRow.name == name))
            s.execute(delete(FileRow).where(FileRow.name == name))
            s.execute(delete(ArtifactRow).where(ArtifactRow.model == name))
        self._bump()
        self._drop_cache(name)
        return bool(cast(CursorResult[Any], result).rowcount)

    def current(self) -> dict[str, str]:
        """Every stored model's name -> version (one query, no blobs)."""
        with self.session() as s:
            return {n: v for n, v in s.execute(select(ModelRow.name, ModelRow.version))}

    def metas(self, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Stored metas (with "version") by name, of `names` or of every model."""
        query = select(ModelRow.name, ModelRow.meta)
        if names is not None:
            query = query.where(ModelRow.name.in_(names))
        with self.session() as s:
            return {n: json.loads(m) for n, m in s.execute(query)}

    def load(self, name: str) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The current version's meta and files; files come from the local cache when this
        version was read before. Raises KeyError for an unknown name."""
        with self.session() as s:
            found = s.execute(select(ModelRow.meta).where(ModelRow.name == name)).scalar()
        if found is None:
            raise KeyError(name)
        meta: dict[str, Any] = json.loads(found)
        files = self._cached(name, meta["version"])
        if files is not None:
            return meta, files
        # One statement (one snapshot): the meta and the files of the same version, even while
        # another process replaces it.
        query = (
            select(ModelRow.meta, FileRow.key, FileRow.data)
            .outerjoin(
                FileRow, (FileRow.name == ModelRow.name) & (FileRow.version == ModelRow.version)
            )
            .where(ModelRow.name == name)
        )
        with self.session() as s:
            rows = s.execute(query).all()
        if not rows:
            raise KeyError(name)
        meta = json.loads(rows[0][0])
        files = {key: bytes(data) for _, key, data in rows if key is not None}
        self._write_cache(name, meta["version"], files)
        return meta, files

    # -- the local cache ------------------------------------------------------------------------

    def _version_dir(self, name: str, version: str) -> Path:
        return self.cache_dir / safe_name(name) / safe_name(version)

    def _cached(self, name: str, version: str) -> dict[str, bytes] | None:
        folder = self._version_dir(name, version)
        try:
            keys = json.loads((folder / MANIFEST).read_text())
            return {k: (folder / safe_name(k)).read_bytes() for k in keys}
        except (OSError, ValueError):  # absent, incomplete or removed meanwhile: read the DB
            return None

    def _write_cache(self, name: str, version: str, files: dict[str, bytes]) -> None:
        final = self._version_dir(name, version)
        tmp = final.parent / f".tmp-{safe_name(version)}-{os.getpid()}-{threading.get_ident()}"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            for key, blob in files.items():
                (tmp / safe_name(key)).write_bytes(blob)
            (tmp / MANIFEST).write_text(json.dumps(sorted(files)))
            if not final.exists():
                os.replace(tmp, final)
        except OSError:  # a read-only or full disk: answers still come from the database
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in final.parent.iterdir() if final.parent.is_dir() else []:
            if old.is_dir() and old.name != final.name and not old.name.startswith(".tmp-"):
                shutil.rmtree(old, ignore_errors=True)  # earlier versions of this name

    def _drop_cache(self, name: str) -> None:
        shutil.rmtree(self.cache_dir / safe_name(name), ignore_errors=True)

    # -- artifacts ------------------------------------------------------------------------------

    def put_artifact(
        self, kind: str, model: str, version: str, key: str, meta: dict[str, Any], data: bytes
    ) -> float:
        """Store (or replace) an artifact of a model version; returns its creation time."""
        created = float(meta.get("created_at", time.time()))
        row = {
            "kind": kind,
            "model": model,
            "version": version,
            "key": key,
            "meta": json.dumps(meta),
            "data": data,
            "created_at": created,
        }
        upsert = self._insert()(ArtifactRow).values(row)
        upsert = upsert.on_conflict_do_update(
            index_elements=[
                ArtifactRow.kind,
                ArtifactRow.model,
                ArtifactRow.version,
                ArtifactRow.key,
            ],
            set_={k: upsert.excluded[k] for k in ("meta", "data", "created_at")},
        )
        with self.session.begin() as s:
            s.execute(upsert)
        return created

    def artifacts(self, kind: str, model: str, version: str) -> dict[str, dict[str, Any]]:
        """Metas of a model version's artifacts of one kind, by key (no blobs)."""
        query = select(ArtifactRow.key, ArtifactRow.meta).where(
            ArtifactRow.kind == kind, ArtifactRow.model == model, ArtifactRow.version == version
        )
        with self.session() as s:
            return {k: json.loads(m) for k, m in s.execute(query)}

    def artifact_meta(self, kind: str, model: str, version: str, key: str) -> dict[str, Any] | None:
        with self.session() as s:
            found = s.execute(
                select(ArtifactRow.meta).where(*self._artifact(kind, model, version, key))
            ).scalar()
        return None if found is None else dict(json.loads(found))

    def get_artifact(
        self, kind: str, model: str, version: str, key: str
    ) -> tuple[dict[str, Any], bytes] | None:
        """An artifact's meta and bytes, or None."""
        query = select(ArtifactRow.meta, ArtifactRow.data).where(
            *self._artifact(kind, model, version, key)
        )
        with self.session() as s:
            found = s.execute(query).first()
        return None if found is None else (json.loads(found[0]), bytes(found[1]))

    @staticmethod
    def _artifact(kind: str, model: str, version: str, key: str) -> tuple[Any, ...]:
        return (
            ArtifactRow.kind == kind,
            ArtifactRow.model == model,
            ArtifactRow.version == version,
            ArtifactRow.key == key,
        )

    # -- upgrade from the folder layout ---------------------------------------------------------

    def import_folders(self, root: Path) -> list[str]:
        """Import models stored by earlier releases (root/<name>/meta.json plus
        root/<name>/<version>.<key>) that the database lacks; each folder's meta.json is then
        renamed so it is imported once. Returns the imported names."""
        imported = []
        stored = self.current()
        for meta_file in sorted(root.glob("*/meta.json")) if root.is_dir() else []:
            try:
                meta = json.loads(meta_file.read_text())
                prefix = meta["version"] + "."
                files = {
                    f.name.removeprefix(prefix): f.read_bytes()
                    for f in meta_file.parent.iterdir()
                    if f.is_file() and f.name.startswith(prefix)
                }
            except (OSError, ValueError, KeyError):
                continue  # unreadable: left where it is
            if "pt" in files:  # the earliest layout: <version>.pt
                files["model"] = files.pop("pt")
            if meta["name"] not in stored:
                self.save(meta, files)
                imported.append(meta["name"])
            meta_file.replace(meta_file.with_name("meta.json.imported"))
        return imported

    def close(self) -> None:
        self.engine.dispose()


__all__ = ["ModelStore", "safe_name"]
