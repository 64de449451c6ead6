"""User models in sandboxed worker processes (issue 27).

TorchScript, ONNX, XGBoost and LightGBM uploads, Hugging Face checkpoints and ONNX text models
are loaded, checked and run in model worker processes (models/sandbox/worker.py: no network, an
empty root or the checkpoint's unpacked folder as root, rlimits, user nobody); the server holds
a stand-in `Model` whose callables go to the worker (models/sandbox/proxy.py, and for text
models models/sandbox/hf_proxy.py: embedding hook with VJPs, LM key/value caches by handle).
Remote models (no code is loaded) stay in the server process. MODEL_SANDBOX=off keeps every
user model in process (debugging).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import torch

from models.base import DEFAULT_MAX_BATCH_BYTES, Model, RowTooLargeError
from models.declaration import Declaration, Facts, InvalidModelError
from models.sandbox.pool import (
    ModelWorkerError,
    SandboxConfig,
    WorkerGroup,
    configure,
    current_config,
    shutdown,
)

SANDBOXED = ("torchscript", "onnx", "xgboost", "lightgbm", "huggingface")

__all__ = [
    "SANDBOXED",
    "ModelWorkerError",
    "SandboxConfig",
    "configure",
    "configure_from_settings",
    "current_config",
    "sandboxed_build",
    "sandboxed_facts",
    "sandboxed_register",
    "shutdown",
]


def configure_from_settings(settings: Any) -> None:
    """MODEL_SANDBOX and MODEL_WORKER_* of app.settings.Settings (and TORCH_THREADS)."""
    configure(
        SandboxConfig(
            enabled=str(settings.model_sandbox).lower() != "off",
            memory_mb=int(settings.model_worker_memory_mb),
            call_timeout_s=float(settings.model_worker_call_timeout_s),
            build_timeout_s=float(settings.model_worker_call_timeout_s),
            processes=int(settings.model_worker_processes),
            threads=int(settings.torch_threads),
            trusted_code=bool(getattr(settings, "trusted_model_code", False)),
            max_workers=max_workers(
                int(getattr(settings, "model_workers_memory_mb", 0)),
                int(settings.model_worker_memory_mb),
            ),
        )
    )


def max_workers(total_mb: int, each_mb: int) -> int:
    """Workers alive at once: MODEL_WORKERS_MEMORY_MB over each worker's address space
    (MODEL_WORKER_MEMORY_MB), at least 1; 0 (either unset): no cap. Not on by default: a
    worker's address-space limit (4 GiB) is far above what one holds (150-800 MB measured), so
    machine memory over it (6 here) would stop and restart the workers of a service that uses
    a few models at once."""
    if each_mb <= 0 or total_mb <= 0:
        return 0
    return max(1, total_mb // each_mb)


def sandboxed(fmt: str) -> bool:
    """Whether models of format `fmt` run in worker processes now."""
    return current_config().enabled and fmt in SANDBOXED


CODE_FORMATS = ("torchscript",)  # loading runs the file's code (__setstate__) in the process


def _refuse_code_in_process(fmt: str) -> None:
    """With MODEL_SANDBOX=off a TorchScript file would load (and run its code) in the server
    process: refused unless TRUSTED_MODEL_CODE says the models are trusted."""
    if fmt in CODE_FORMATS and not current_config().trusted_code:
        raise InvalidModelError(
            f"MODEL_SANDBOX=off loads {fmt} files in the server process, where their code runs "
            "with the server's rights: refused unless the operator sets TRUSTED_MODEL_CODE=true "
            "(or turns the sandbox on)"
        )


def _in_worker(
    decl: Declaration,
    meta: dict[str, Any],
    files: dict[str, bytes],
    check: bool,
    max_batch_bytes: int,
) -> Model:
    from models.adapters.user import load_background
    from models.sandbox.proxy import proxy_model

    group = WorkerGroup(meta, files.get("model", b""), max_batch_bytes, current_config())
    spec, arrays = group.build(check)
    if decl.format == "huggingface":
        from models.sandbox.hf_proxy import text_proxy_model

        return text_proxy_model(decl, str(meta["version"]), group, spec)
    model = proxy_model(decl, str(meta["version"]), group, spec, arrays)
    if "background" in files:
        bg = load_background(files["background"], decl)
        info = {"source": "registered", "rows": len(bg)}
        model = replace(model, background=bg, background_info=info, version=model.version)
    return model


def _strings(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidModelError(f"the model worker stated invalid {what}")
    return tuple(value)


def sandboxed_facts(fmt: str, data: bytes) -> Facts:
    """models.adapters.facts.file_facts, read in a worker for the sandboxed formats that load the
    file to read it (XGBoost's own loader, onnx's parser); LightGBM's header and TorchScript (which
    states nothing) are read here without loading anything."""
    from models.adapters.facts import file_facts

    if not sandboxed(fmt) or fmt not in ("xgboost", "onnx"):
        return file_facts(fmt, data)
    found = WorkerGroup({"name": "facts", "format": fmt}, data, 0, current_config()).facts()
    shape = found.get("input_shape")
    ok_shape = shape is None or (
        isinstance(shape, list)
        and len(shape) <= 8
        and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
    )
    text = {k: found.get(k) for k in ("modality", "task", "onnx_output")}
    if not ok_shape or not all(v is None or isinstance(v, str) for v in text.values()):
        raise InvalidModelError("the model worker stated invalid facts")
    return Facts(
        modality=text["modality"],
        task=text["task"],
        input_shape=None if shape is None else tuple(shape),
        output_names=_strings(found.get("output_names"), "output names"),
        feature_names=_strings(found.get("feature_names"), "feature names"),
        onnx_output=text["onnx_output"],
    )


def sandboxed_build(meta: dict[str, Any], files: dict[str, bytes]) -> Model:
    """models.adapters.user.build_model, in a worker for the sandboxed formats."""
    from models.adapters.user import build_model, content_version

    decl = Declaration.from_dict(meta)
    if not sandboxed(decl.format):
        _refuse_code_in_process(decl.format)
        return build_model(meta, files)
    data = files.get("model", b"")
    meta = {**meta, "version": meta.get("version") or content_version(data, decl)}
    return _in_worker(decl, meta, files, False, DEFAULT_MAX_BATCH_BYTES)


def sandboxed_register(
    decl: Declaration,
    files: dict[str, bytes],
    device: torch.device | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> tuple[Model, dict[str, Any]]:
    """models.adapters.user.register, in a fresh worker for the sandboxed formats: its loader,
    checks and test passes run there (a crash is an InvalidModelError naming the signal), then the
    test pass again through the stand-in."""
    from models.adapters.user import check_forward, register
    from models.device import place

    if not sandboxed(decl.format):
        _refuse_code_in_process(decl.format)
        return register(decl, files, device, max_batch_bytes)
    meta = decl.as_dict()
    data = files.get("model", b"")
    h = hashlib.sha256(data + files.get("background", b""))
    h.update(json.dumps({**meta, "name": None}, sort_keys=True).encode())
    meta["version"] = h.hexdigest()[:16]
    model = _in_worker(decl, meta, files, True, max_batch_bytes)
    model = place(check_forward(model), device or torch.device("cpu"), max_batch_bytes)
    try:
        model.rows_per_pass()
    except RowTooLargeError as exc:
        raise InvalidModelError(str(exc)) from None
    return model, meta
