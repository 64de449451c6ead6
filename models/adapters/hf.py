"""Hugging Face checkpoints (`format: huggingface`): a model folder as `save_pretrained` writes it.

Uploaded as a .tar.gz/.zip (unpacked safely into a private folder, models/adapters/archive.py) or
named by `uri` under the server's MODEL_REPOSITORY. Loaded by transformers from local files only,
from safetensors only (a pickle is refused before anything is read), never with remote code. The
kind follows `config.architectures` (models/adapters/checkpoint.py `kind`); the builders:
models/adapters/hf_models.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from models.adapters.archive import unpack
from models.adapters.checkpoint import (
    Checkpoint,
    folder_checkpoint,
    kind,
    outputs_of,
    root_prefix,
    task_of,
)
from models.declaration import Declaration, InvalidModelError

if TYPE_CHECKING:
    from models.base import Model


def resolve_uri(root: Path | None, uri: str) -> Path:
    """The checkpoint folder `uri` names under MODEL_REPOSITORY (relative, or absolute inside)."""
    if root is None:
        raise InvalidModelError(
            "uri needs the server's MODEL_REPOSITORY setting, which is unset: upload the folder "
            "as a .tar.gz or .zip file instead"
        )
    base = root.resolve()
    raw = uri.removeprefix("file://")
    path = (base / raw).resolve()
    if not path.is_relative_to(base) or path == base:
        raise InvalidModelError(f"uri {uri!r} must name a folder inside MODEL_REPOSITORY")
    if not path.is_dir():
        raise InvalidModelError(f"uri {uri!r}: no such folder in MODEL_REPOSITORY")
    return path


def folder_digest(path: Path) -> str:
    """Content hash of every file in a folder (names and bytes): a uri model's version."""
    h = hashlib.sha256()
    for name in sorted(_all(path)):
        h.update(name.encode() + b"\0")
        with (path / name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _all(path: Path) -> list[str]:
    return [
        (Path(folder) / n).relative_to(path).as_posix()
        for folder, _, names in os.walk(path)
        for n in names
    ]


@contextmanager
def private_folder() -> Iterator[Path]:
    """A fresh folder only this process can read (0700), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hf-model-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_hf(decl: Declaration, data: bytes, version: str) -> Model:
    """The model a checkpoint (archive bytes, or `decl.uri`) holds, as `decl` declares it."""
    if decl.uri:
        path = Path(decl.uri)
        if not path.is_dir():
            raise InvalidModelError(f"uri {decl.uri}: the folder is gone")
        if decl.uri_digest and folder_digest(path) != decl.uri_digest:
            raise InvalidModelError(
                f"uri {decl.uri}: the folder changed since it was registered; register again"
            )
        # registration checked the folder's links against MODEL_REPOSITORY; the digest says
        # these are the same bytes
        ck = folder_checkpoint(path, Path(path.anchor))
        return _load(decl, ck, path, version)
    with private_folder() as tmp:
        unpack(data, tmp)
        found = [PurePosixPath(p) for p in _all(tmp)]
        root = tmp.joinpath(*root_prefix(found).parts)
        ck = folder_checkpoint(root)
        return _load(decl, ck, root, version)


def _load(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> Model:
    """An ONNX text classifier (models/adapters/onnx_text.py), else transformers
    (models/adapters/hf_models.py)."""
    if ck.onnx:
        from models.adapters.onnx_text import onnx_text_classifier

        return onnx_text_classifier(decl, ck, root, version)
    from models.adapters.hf_models import load

    return load(decl, ck, root, version, kind(ck, decl.modality))


def declare(
    name: str,
    ck: Checkpoint,
    *,
    modality: str | None = None,
    task: str | None = None,
    output_names: tuple[str, ...] | None = None,
    input_shape: tuple[int, ...] | None = None,
    feature_names: tuple[str, ...] | None = None,
    uri: str | None = None,
    uri_digest: str | None = None,
) -> Declaration:
    """The declaration of a checkpoint: what config.json states, declared fields winning where
    they agree with it (InvalidModelError naming both where they do not)."""
    model_kind = kind(ck, modality)
    if input_shape or feature_names:
        raise InvalidModelError(
            f"a Hugging Face {model_kind} model reads text: leave out input_shape and "
            "feature_names (its players are the words or tokens of each input)"
        )
    stated_task = task_of(ck, model_kind)
    stated = outputs_of(ck, model_kind)
    if ck.onnx and not (ck.config.get("id2label") or ck.config.get("num_labels")):
        if not output_names:
            raise InvalidModelError(
                "the ONNX text classifier states no labels: send output_names (a JSON list, "
                "one per logit) or add config.json with id2label"
            )
        stated = output_names
        stated_task = "regression" if len(output_names) == 1 else "classification"
    if task and task != stated_task:
        where = "the checkpoint" if ck.onnx else "config.json"
        raise InvalidModelError(f"declared task {task!r}: {where} states a {stated_task} model")
    if output_names and len(output_names) != len(stated):
        raise InvalidModelError(
            f"declared output_names lists {len(output_names)} names; config.json has "
            f"{len(stated)} outputs {list(stated)[:8]}"
        )
    return Declaration(
        name,
        model_kind,
        stated_task,
        (),
        tuple(output_names or stated),
        (),
        format="huggingface",
        uri=uri,
        uri_digest=uri_digest,
    )
