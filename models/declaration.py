"""What a user declares about a model they register (checked later by a test forward pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.base import ModelError

FORMATS = ("torchscript", "onnx", "xgboost", "lightgbm", "remote", "huggingface")


class InvalidModelError(ModelError):
    """An upload or remote endpoint that does not behave as its declaration says."""


@dataclass(frozen=True)
class Declaration:
    """What the user states about a model; checked by a test forward pass."""

    name: str
    modality: str
    task: str
    input_shape: tuple[int, ...]
    output_names: tuple[str, ...]
    feature_names: tuple[str, ...]
    format: str = "torchscript"
    input_range: tuple[float, float] | None = None
    onnx_output: str | None = None
    remote_url: str | None = None
    remote_output: str | None = None
    uri: str | None = None  # huggingface: a checkpoint folder under MODEL_REPOSITORY (absolute)
    uri_digest: str | None = None  # its content hash when registered (models/adapters/hf.py)
    # remote: sealed credentials (models/adapters/remote.py seal_headers), apart from remote_url;
    # kept in the stored meta, never in an answer or a repr
    remote_auth: str | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "modality": self.modality,
            "task": self.task,
            "input_shape": list(self.input_shape),
            "output_names": list(self.output_names),
            "feature_names": list(self.feature_names),
            "format": self.format,
            "input_range": None if self.input_range is None else list(self.input_range),
            "onnx_output": self.onnx_output,
            "remote_url": self.remote_url,
            "remote_output": self.remote_output,
            "uri": self.uri,
            "uri_digest": self.uri_digest,
            **({"remote_auth": self.remote_auth} if self.remote_auth else {}),
        }

    @classmethod
    def from_dict(cls, meta: dict[str, Any]) -> Declaration:
        fmt = meta.get("format") or ("remote" if meta.get("remote_url") else "torchscript")
        low_high = meta.get("input_range")
        return cls(
            name=meta["name"],
            modality=meta["modality"],
            task=meta["task"],
            input_shape=tuple(meta["input_shape"]),
            output_names=tuple(meta["output_names"]),
            feature_names=tuple(meta["feature_names"]),
            format=fmt,
            input_range=None if low_high is None else (float(low_high[0]), float(low_high[1])),
            onnx_output=meta.get("onnx_output"),
            remote_url=meta.get("remote_url"),
            remote_output=meta.get("remote_output"),
            uri=meta.get("uri"),
            uri_digest=meta.get("uri_digest"),
            remote_auth=meta.get("remote_auth"),
        )


@dataclass(frozen=True)
class Facts:
    """Fields a model file states (None: not stated)."""

    modality: str | None = None
    task: str | None = None
    input_shape: tuple[int, ...] | None = None
    output_names: tuple[str, ...] | None = None
    feature_names: tuple[str, ...] | None = None
    onnx_output: str | None = None  # ONNX: the output tensor these facts describe
