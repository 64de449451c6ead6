"""The model store on SQLite and PostgreSQL: versions replace each other atomically, files are
read from the database once per process, artifacts are shared; registries in two "processes"
(two stores on one database) see each other's models; Salvage artifacts travel through it."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sqlalchemy import event, select

from explainers.amortized.salvage import inference as salvage_inference
from explainers.amortized.salvage import train as salvage
from explainers.amortized.salvage.explainer import SalvageOptions, SalvageStore, explain
from explainers.context import Artifacts, RunContext
from models.adapters.user import Declaration, register
from models.base import Model, ModelNotReadyError, UnknownModelError
from models.builtin.trained import dataset_split, load_digits_cnn
from models.registry import ModelRegistry
from models.store import FileRow, ModelStore
from tests.app.test_jobs_celery import postgres_url  # noqa: F401 (a fixture)

W = [1.0, -2.0, 0.5, 3.0]


def scripted(weights: list[float]) -> bytes:
    layer = torch.nn.Linear(4, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weights]))
        layer.bias.fill_(0.25)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(layer), buf)
    return buf.getvalue()


def registration(name: str, weights: list[float], background: bytes | None = None) -> Any:
    """(meta, files) as the repository route stores them."""
    decl = Declaration(name, "tabular", "regression", (4,), ("score",), ("a", "b", "c", "d"))
    files = {"model": scripted(weights)}
    if background is not None:
        files["background"] = background
    _, meta = register(decl, files)
    return meta, files


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'models.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture()
def stores(url: str, tmp_path: Path) -> Iterator[tuple[ModelStore, ModelStore]]:
    """Two stores on one database with their own cache folders, as two processes have."""
    a, b = ModelStore(url, tmp_path / "cache-a"), ModelStore(url, tmp_path / "cache-b")
    yield a, b
    a.close()
    b.close()


def file_reads(store: ModelStore) -> list[str]:
    """Statements that read model files, recorded from now on."""
    seen: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (
            statement.lstrip().upper().startswith("SELECT")
            and "registered_model_files" in statement
        ):
            seen.append(statement)

    return seen


def test_save_replace_remove(stores: tuple[ModelStore, ModelStore]) -> None:
    a, b = stores
    assert a.current() == {}
    meta1, files1 = registration("lin", W, b"a,b,c,d\n1,2,3,4\n")
    a.save(meta1, files1)
    assert b.current() == {"lin": meta1["version"]}
    meta, files = b.load("lin")
    assert meta == meta1 and files == files1
    assert b.metas() == {"lin": meta1} and b.metas(["other"]) == {}
    # A new version replaces the old one and its files, in one transaction.
    meta2, files2 = registration("lin", [2.0, 0.0, 0.0, 0.0])
    assert meta2["version"] != meta1["version"]
    b.save(meta2, files2)
    assert a.current() == {"lin": meta2["version"]}
    meta, files = a.load("lin")
    assert meta == meta2 and files == files2  # no background any more
    a.save({**meta1, "name": "other"}, files1)
    remote = {**meta1, "name": "remote", "format": "remote", "remote_url": "http://h/v2/models/m"}
    a.save(remote, {})  # a remote model has no files
    assert b.load("remote") == (remote, {}) and b.load("remote") == (remote, {})
    assert set(b.current()) == {"lin", "other", "remote"}
    assert a.remove("remote")
    assert a.remove("lin") is True and a.remove("lin") is False
    assert b.current() == {"other": meta1["version"]}
    with pytest.raises(KeyError):
        b.load("lin")


def test_concurrent_saves_leave_one_whole_version(url: str, tmp_path: Path) -> None:
    """Processes registering one name at once: the last save wins whole, no stray files."""
    regs = [registration("lin", [float(i), 1.0, 0.0, 0.0], b"a,b,c,d\n1,2,3,4\n") for i in range(6)]
    stores = [ModelStore(url, tmp_path / f"cache-{i}") for i in range(3)]

    def save_all(k: int) -> None:
        for meta, files in regs[k::3]:
            stores[k].save(meta, files)

    threads = [threading.Thread(target=save_all, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    version = stores[0].current()["lin"]
    meta, files = stores[1].load("lin")
    assert meta["version"] == version
    assert any(meta == m and files == f for m, f in regs)
    with stores[0].session() as s:
        rows = s.execute(select(FileRow.version, FileRow.key)).all()
    assert sorted(rows) == [(version, "background"), (version, "model")]
    for store in stores:
        store.close()


def test_files_are_read_from_the_database_once(
    stores: tuple[ModelStore, ModelStore], tmp_path: Path
) -> None:
    a, b = stores
    meta1, files1 = registration("lin", W, b"a,b,c,d\n1,2,3,4\n")
    a.save(meta1, files1)
    reads = file_reads(b)
    for _ in range(3):
        assert b.load("lin") == (meta1, files1)
    assert len(reads) == 1
    folder = tmp_path / "cache-b" / "lin" / meta1["version"]
    assert (folder / "model").read_bytes() == files1["model"]
    # A damaged cache folder is read from the database again.
    (folder / ".files.json").unlink()
    assert b.load("lin") == (meta1, files1) and len(reads) == 2
    # A new version: read once, and the cached files of the earlier version are dropped.
    meta2, files2 = registration("lin", [2.0, 0.0, 0.0, 0.0])
    a.save(meta2, files2)
    assert b.load("lin") == (meta2, files2) and b.load("lin") == (meta2, files2)
    assert len(reads) == 3
    assert [p.name for p in (tmp_path / "cache-b" / "lin").iterdir()] == [meta2["version"]]
    # Removing a model drops the cache of the process that removed it.
    assert b.remove("lin") and not (tmp_path / "cache-b" / "lin").exists()


def test_artifacts(stores: tuple[ModelStore, ModelStore]) -> None:
    a, b = stores
    meta1, files1 = registration("lin", W)
    a.save(meta1, files1)
    v1 = meta1["version"]
    assert b.get_artifact("salvage", "lin", v1, "x") is None
    a.put_artifact("salvage", "lin", v1, "x", {"created_at": 1.5, "k": 1}, b"\x00\x01")
    a.put_artifact("salvage", "lin", v1, "y", {"created_at": 2.5}, b"y")
    a.put_artifact("salvage", "digits-cnn", "v", "x", {"created_at": 3.0}, b"builtin")
    assert b.get_artifact("salvage", "lin", v1, "x") == ({"created_at": 1.5, "k": 1}, b"\x00\x01")
    assert set(b.artifacts("salvage", "lin", v1)) == {"x", "y"}
    assert b.artifacts("other-kind", "lin", v1) == {}
    assert b.artifact_meta("salvage", "lin", v1, "y") == {"created_at": 2.5}
    b.put_artifact("salvage", "lin", v1, "x", {"created_at": 4.0}, b"newer")  # replaces
    assert a.get_artifact("salvage", "lin", v1, "x") == ({"created_at": 4.0}, b"newer")
    # A new version of the model drops the artifacts of the version it replaces ...
    meta2, files2 = registration("lin", [2.0, 0.0, 0.0, 0.0])
    a.save(meta2, files2)
    assert b.artifacts("salvage", "lin", v1) == {}
    b.put_artifact("salvage", "lin", meta2["version"], "x", {"created_at": 5.0}, b"v2")
    # ... and removing it drops all of them; other models' artifacts stay.
    a.remove("lin")
    assert b.artifacts("salvage", "lin", meta2["version"]) == {}
    assert b.get_artifact("salvage", "digits-cnn", "v", "x") == ({"created_at": 3.0}, b"builtin")


def test_folder_layout_is_imported_once(url: str, tmp_path: Path) -> None:
    root = tmp_path / "user-models"
    meta, files = registration("old", W, b"a,b,c,d\n1,2,3,4\n")
    folder = root / "old"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / f"{meta['version']}.pt").write_bytes(files["model"])  # the earliest layout
    (folder / f"{meta['version']}.background").write_bytes(files["background"])
    (root / "junk").mkdir()
    (root / "junk" / "meta.json").write_text("not json")
    store = ModelStore(url, root)
    assert store.import_folders(root) == ["old"]
    assert store.load("old") == (meta, files)
    assert not (folder / "meta.json").exists() and (folder / "meta.json.imported").exists()
    store.remove("old")  # removed by some process: a restart does not bring it back
    assert store.import_folders(root) == [] and store.current() == {}
    assert store.import_folders(tmp_path / "missing") == []
    store.close()


def test_registries_share_models(stores: tuple[ModelStore, ModelStore], tmp_path: Path) -> None:
    a, b = stores
    one = ModelRegistry(tmp_path, builtins=(), store=a, refresh_s=60.0)
    two = ModelRegistry(tmp_path, builtins=(), store=b, refresh_s=0.0)
    meta1, files1 = registration("lin", W, b"a,b,c,d\n1,2,3,4\n3,4,5,6\n")
    a.save(meta1, files1)  # as the repository route does: save, then register
    model1, _ = register(Declaration.from_dict(meta1), files1)
    one.register(model1)
    assert one.get("lin") is model1
    # The other process lists it without building it, then builds it on first use.
    assert two.names() == ["lin"]
    assert two.peek("lin") == (None, "tabular", None) and not two.loaded("lin")
    assert two.status() == {"lin": {"loaded": False, "error": None, "background": True}}
    built = two.get("lin")
    assert built.version == meta1["version"] and two.get("lin") is built
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(built.predict(x), model1.predict(x), rtol=1e-6)
    np.testing.assert_allclose(built.background, [[1, 2, 3, 4], [3, 4, 5, 6]])
    # A new version stored by the second process: the first one answers from its view of the
    # store until refresh_s has passed, then rebuilds.
    meta2, files2 = registration("lin", [2.0, 0.0, 0.0, 0.0])
    b.save(meta2, files2)
    assert two.get("lin").version == meta2["version"]
    assert one.get("lin") is model1  # within refresh_s the old view may answer
    one._synced = None  # refresh_s elapsed
    assert one.get("lin").version == meta2["version"]
    # Removed by the second process: the first forgets it.
    two.unregister("lin")
    b.remove("lin")
    with pytest.raises(UnknownModelError):
        two.get("lin")
    one._synced = None
    assert one.names() == [] and not one.loaded("lin")
    with pytest.raises(UnknownModelError):
        one.peek("lin")
    with pytest.raises(UnknownModelError):
        one.unregister("lin")


def test_listing_queries_the_store_at_most_once_per_refresh(
    stores: tuple[ModelStore, ModelStore], tmp_path: Path
) -> None:
    a, _ = stores
    registry = ModelRegistry(tmp_path, builtins=(), store=a, refresh_s=60.0)
    a.save(*registration("lin", W))
    queries: list[str] = []

    @event.listens_for(a.engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        queries.append(statement)

    for _ in range(20):
        assert registry.names() == ["lin"] and registry.status()["lin"]["loaded"] is False
    assert len(queries) == 2  # current(), then the metas of the names it had not seen
    a.save(*registration("other", W))  # a write through this store: seen at once
    assert registry.names() == ["lin", "other"]


def test_a_broken_stored_model_reports_its_error(
    stores: tuple[ModelStore, ModelStore], tmp_path: Path
) -> None:
    a, b = stores
    meta, files = registration("lin", W)
    a.save({**meta, "name": "broken", "version": "0bad"}, {"model": b"not a torchscript archive"})
    a.save(meta, files)
    registry = ModelRegistry(tmp_path, builtins=(), store=b, refresh_s=0.0)
    assert registry.names() == ["broken", "lin"]
    with pytest.raises(ModelNotReadyError, match="TorchScript"):
        registry.get("broken")
    status = registry.status()
    assert status["broken"]["loaded"] is False and "TorchScript" in str(status["broken"]["error"])
    assert registry.peek("broken")[2] == status["broken"]["error"]
    assert registry.get("lin").version == meta["version"]
    # Fixed by a new registration: the error belongs to the old version and goes with it.
    a.save({**meta, "name": "broken"}, files)
    assert registry.status()["broken"]["error"] is None
    assert registry.get("broken").version == meta["version"]


def test_local_models_stay_and_stores_can_be_swapped(
    stores: tuple[ModelStore, ModelStore], tmp_path: Path
) -> None:
    a, _ = stores
    meta, files = registration("stored", W)
    a.save(meta, files)
    model, _ = register(Declaration.from_dict({**meta, "name": "local"}), files)
    registry = ModelRegistry(tmp_path, builtins=())
    registry.register(model)  # no store: process-local, as before
    registry.use_store(a)
    assert registry.names() == ["local", "stored"]
    assert registry.get("local") is model
    assert registry.status()["local"] == {"loaded": True, "error": None}
    registry.use_store(None)
    assert registry.names() == ["local"]
    registry.unregister("local")
    assert registry.names() == []


def test_salvage_artifacts_travel_through_the_store(
    stores: tuple[ModelStore, ModelStore], tmp_path: Path, model_dir: Path
) -> None:
    a, b = stores
    digits = load_digits_cnn(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny = {"rows": 48, "surrogate_epochs": 1, "explainer_epochs": 2, "batch_size": 16}
        trained = salvage.train(digits, salvage.SalvageTrainOptions(**tiny, pairs=2))
    finally:
        torch.set_num_threads(threads)
    assert trained is not None
    info = SalvageStore(tmp_path / "salvage-1", a).save(digits, trained)  # trained on one
    artifacts = Artifacts(tmp_path / "app-2", b)  # explained by another process's app
    other = SalvageStore.within(artifacts)
    assert [i.id for i in other.list(digits.name, digits.version)] == [info.id]
    assert other.info(digits.name, digits.version, info.id) == info
    opts = SalvageOptions().pinned(other, digits)
    x = dataset_split("digits-cnn").x_test[:2]
    result = explain(digits, x, options=opts, target=3, context=RunContext(artifacts=artifacts))
    expected = salvage_inference.amortized(trained, x)
    np.testing.assert_allclose(result.explanations[1].values, expected.values[1, :, 3], atol=1e-6)
    cached = other.root / digits.name / digits.version / info.id
    assert json.loads((cached / "meta.json").read_text())["created_at"] == info.created_at
    # Artifacts that an earlier release kept on disk only are uploaded when first listed.
    old = Model(**{**digits.__dict__, "version": "earlier"})
    SalvageStore(tmp_path / "salvage-1").save(old, trained)
    assert b.artifacts("salvage", digits.name, "earlier") == {}
    assert [i.id for i in SalvageStore(tmp_path / "salvage-1", a).list(digits.name, "earlier")] == [
        info.id
    ]
    assert set(b.artifacts("salvage", digits.name, "earlier")) == {info.id}
