"""User-registered models: TorchScript uploads (never unpickled) and remote OIP endpoints,
persisted on disk so they survive restarts."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from models.base import Model, ModelError


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "modality": self.modality,
            "task": self.task,
            "input_shape": list(self.input_shape),
            "output_names": list(self.output_names),
            "feature_names": list(self.feature_names),
        }


def _model(decl: Declaration, module: torch.nn.Module, version: str, platform: str) -> Model:
    return Model(
        name=decl.name,
        modality=decl.modality,
        task=decl.task,
        input_shape=decl.input_shape,
        feature_names=decl.feature_names,
        output_names=decl.output_names,
        module=module,
        version=version,
        platform=platform,
        info={"source": platform},
    )


def _check(model: Model) -> Model:
    """A forward pass on two zero rows must give finite [2, k] outputs."""
    try:
        with torch.inference_mode():  # the module itself: predict would broadcast a mismatch
            out = model.module(torch.zeros((2, *model.input_shape))).numpy()
    except Exception as exc:
        raise InvalidModelError(
            f"test forward pass on shape {[2, *model.input_shape]} failed: {exc}"
        ) from None
    if out.shape != (2, model.n_outputs) or not np.all(np.isfinite(out)):
        raise InvalidModelError(
            f"test forward pass gave shape {list(out.shape)}; expected [2, {model.n_outputs}] "
            "finite outputs"
        )
    return model


def torchscript_model(decl: Declaration, data: bytes) -> Model:
    """Load a TorchScript archive (torch.jit.load: no pickle) and check it."""
    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    except Exception as exc:
        raise InvalidModelError(f"not a TorchScript archive (torch.jit.save): {exc}") from None
    module.eval()
    version = hashlib.sha256(data).hexdigest()[:16]
    return _check(_model(decl, module, version, "torchscript"))


class _RemoteModule(torch.nn.Module):
    """Forwards rows to an Open Inference Protocol endpoint (a black box: no gradients)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        body = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }
        try:
            r = httpx.post(f"{self.url}/infer", json=body, timeout=self.timeout_s)
            r.raise_for_status()
            out = r.json()["outputs"][0]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise InvalidModelError(f"remote model {self.url} failed: {exc}") from None
        return torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])


def remote_model(decl: Declaration, url: str, timeout_s: float = 30.0) -> Model:
    if not url.startswith(("http://", "https://")):
        raise InvalidModelError("remote_url must be an http(s) URL of an OIP model")
    version = hashlib.sha256(json.dumps([url, decl.as_dict()]).encode()).hexdigest()[:16]
    return _check(_model(decl, _RemoteModule(url, timeout_s), version, "remote"))


class UserModelStore:
    """root/<name>/meta.json plus root/<name>/<version>.pt for uploads."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, model: Model, decl: Declaration, data: bytes | None, url: str | None) -> None:
        folder = self.root / model.name
        folder.mkdir(parents=True, exist_ok=True)
        if data is not None:
            (folder / f"{model.version}.pt").write_bytes(data)
        meta = {**decl.as_dict(), "version": model.version, "remote_url": url}
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(folder / "meta.json")
        for old in folder.glob("*.pt"):
            if old.stem != model.version:
                old.unlink()

    def remove(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def load_all(self) -> tuple[list[Model], dict[str, str]]:
        """Every stored model, and the reasons the unreadable ones were skipped."""
        models, errors = [], {}
        for meta_file in sorted(self.root.glob("*/meta.json")):
            try:
                models.append(self._load(meta_file))
            except Exception as exc:
                errors[meta_file.parent.name] = f"{type(exc).__name__}: {exc}"
        return models, errors

    def _load(self, meta_file: Path) -> Model:
        meta = json.loads(meta_file.read_text())
        decl = Declaration(
            meta["name"],
            meta["modality"],
            meta["task"],
            tuple(meta["input_shape"]),
            tuple(meta["output_names"]),
            tuple(meta["feature_names"]),
        )
        if meta["remote_url"]:
            version = hashlib.sha256(
                json.dumps([meta["remote_url"], decl.as_dict()]).encode()
            ).hexdigest()[:16]
            return _model(decl, _RemoteModule(meta["remote_url"], 30.0), version, "remote")
        data = (meta_file.parent / f"{meta['version']}.pt").read_bytes()
        module = torch.jit.load(io.BytesIO(data), map_location="cpu").eval()
        return _model(decl, module, meta["version"], "torchscript")
