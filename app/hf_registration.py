"""The declaration of a Hugging Face checkpoint registration: an uploaded archive or a `uri`
folder under MODEL_REPOSITORY (models/adapters/hf.py reads and checks it; nothing is stored
here)."""

from __future__ import annotations

import json
from pathlib import Path

from app.errors import InvalidInput, PayloadTooLarge
from models.adapters.archive import ArchiveTooLargeError, check_sizes
from models.adapters.checkpoint import archive_checkpoint, folder_checkpoint
from models.adapters.hf import declare, folder_digest, resolve_uri
from models.base import ModelError
from models.declaration import Declaration


def _strings(field: str, raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise InvalidInput(f"{field} must be a JSON list of strings") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{field} must be a JSON list of strings")
    return tuple(value)


def hf_declaration(
    name: str,
    data: bytes | None,
    uri: str | None,
    repository: Path | None,
    *,
    modality: str | None = None,
    task: str | None = None,
    output_names: str | None = None,
    input_shape: str | None = None,
    feature_names: str | None = None,
) -> Declaration:
    """Check the checkpoint (archive bytes, or the `uri` folder) and declare it; 400 for a
    refused checkpoint, 413 for an archive that unpacks beyond the limits."""
    try:
        if uri is not None:
            path = resolve_uri(repository, uri)
            ck = folder_checkpoint(path, repository.resolve() if repository else None)
            where, digest = str(path), folder_digest(path)
        else:
            check_sizes(data or b"")
            ck, where, digest = archive_checkpoint(data or b""), None, None
        return declare(
            name,
            ck,
            modality=modality,
            task=task,
            output_names=_strings("output_names", output_names),
            input_shape=(1,) if input_shape and input_shape.strip() != "[]" else None,
            feature_names=_strings("feature_names", feature_names),
            uri=where,
            uri_digest=digest,
        )
    except ArchiveTooLargeError as exc:
        raise PayloadTooLarge(str(exc), code="archive_too_large") from None
    except ModelError as exc:
        raise InvalidInput(str(exc), code="invalid_model") from None
