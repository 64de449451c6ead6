"""User-registered models: built from a stored declaration and files, never unpickled.

Formats: TorchScript (torch.jit.load), ONNX (onnxruntime), XGBoost JSON/UBJSON and LightGBM
text boosters (their own loaders), and remote Open Inference Protocol endpoints.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from models.adapters.remote import HOST_VALUE_BYTES, RemoteClient
from models.base import DEFAULT_MAX_BATCH_BYTES, Model, RankerModel, RowTooLargeError, TextModel
from models.declaration import FORMATS, Declaration, InvalidModelError
from models.device import place
from models.modality import Modality


def _model(decl: Declaration, module: torch.nn.Module | None, version: str, **extra: Any) -> Model:
    return Model(
        name=decl.name,
        modality=Modality(decl.modality),
        task=decl.task,
        input_shape=decl.input_shape,
        feature_names=decl.feature_names,
        output_names=decl.output_names,
        module=module,
        version=version,
        platform=decl.format,
        input_range=decl.input_range,
        **{"info": {"source": decl.format}, **extra},
    )


def _reason(exc: Exception) -> str:
    """One line for the user: TorchScript's interpreter puts a traceback of the module's own
    code before the error; a module of token ids is named for what it is."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    reason = lines[-1] if lines else type(exc).__name__
    if "'indices'" in reason and ("Long" in reason or "Int" in reason):
        reason += (
            " (the module reads integer token ids: registered modules take float rows or "
            "images; register a text model as a Hugging Face checkpoint, format huggingface)"
        )
    return reason[:500]


def check_forward(model: Model) -> Model:
    """A forward pass on two rows inside the input range, on the model's device, must give
    finite [2, k] outputs (the module or the black box itself: predict would broadcast a
    mismatch)."""
    if isinstance(model, TextModel | RankerModel):  # Hugging Face checkpoints: texts in
        from models.adapters.hf_models import check_texts

        return check_texts(model)
    low = 0.0 if model.input_range is None else model.input_range[0]
    try:
        if model.predict_fn is not None:
            out = np.asarray(
                model.predict_fn(np.full((2, *model.input_shape), low, model.input_dtype))
            )
        else:
            rows = torch.full((2, *model.input_shape), low, device=model.device)
            with torch.no_grad():
                out = model.torch_module()(rows).cpu().numpy()
    except Exception as exc:
        raise InvalidModelError(
            f"test forward pass on shape {[2, *model.input_shape]} failed: {_reason(exc)}"
        ) from None
    if out.shape != (2, model.n_outputs) or not np.all(np.isfinite(out)):
        raise InvalidModelError(
            f"test forward pass gave shape {list(out.shape)}; expected [2, {model.n_outputs}] "
            "finite outputs"
        )
    return model


def content_version(data: bytes, decl: Declaration) -> str:
    """A model version: hash of its file and of the declaration that gives it meaning."""
    h = hashlib.sha256(data)
    h.update(json.dumps({**decl.as_dict(), "name": None}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _torchscript(
    decl: Declaration, data: bytes, version: str, *, check_operators: bool = True
) -> Model:
    """A TorchScript archive: its zip members' sizes checked from the central directory, its
    source and pickles against the operator allow-list before `torch.jit.load` (which runs
    `__setstate__`), every method graph after it (models/adapters/torchscript_check.py).
    `check_operators=False` (library callers only, e.g. tests of the sandbox) skips the
    operator checks, never the size checks."""
    from models.adapters.archive import check_inflation, is_zip
    from models.adapters.torchscript_check import check_module, check_source

    if not is_zip(data):  # torch.jit.load also reads flatbuffer files: never offered
        raise InvalidModelError("not a TorchScript archive (torch.jit.save writes a zip)")
    check_inflation(data)
    if check_operators:
        check_source(data)
    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    except Exception as exc:
        raise InvalidModelError(f"not a TorchScript archive (torch.jit.save): {exc}") from None
    if check_operators:
        check_module(module)
    module.eval()
    return _model(decl, module, version)


def _remote(decl: Declaration, version: str) -> Model:
    """An OIP endpoint under the REMOTE_* settings: its stored credentials (`remote_auth`,
    apart from the URL) sent as headers, connections only to REMOTE_MODEL_HOSTS' hosts."""
    from models.adapters.remote import config, open_headers, with_remote_info
    from models.adapters.remote_http import HostPolicy

    url = decl.remote_url or ""
    if not url.startswith(("http://", "https://")):
        raise InvalidModelError("remote_url must be an http(s) URL of an OIP model")
    cfg = config()
    headers = open_headers(getattr(decl, "remote_auth", None))
    policy = HostPolicy(cfg.hosts)
    if decl.modality == "text":  # a BYTES tensor of strings: models/adapters/remote_text.py
        from models.adapters.remote_text import remote_text_model

        return remote_text_model(decl, version, cfg.call_timeout_s, headers, policy, cfg)
    client = RemoteClient(
        url,
        cfg.call_timeout_s,
        decl.remote_output,
        headers=headers,
        policy=policy,
        version_check_s=cfg.version_check_s,
    )
    row_bytes = HOST_VALUE_BYTES * int(np.prod(decl.input_shape)) + 4 * len(decl.output_names)
    model = _model(decl, None, version, predict_fn=client, row_bytes=row_bytes)
    return with_remote_info(model, client, cfg)


def _onnx(decl: Declaration, data: bytes, version: str) -> Model:
    from models.adapters.onnx import graph_row_bytes, onnx_predictor

    run, dtype = onnx_predictor(data, decl)
    row_bytes = graph_row_bytes(data, int(np.prod(decl.input_shape)))
    return _model(decl, None, version, predict_fn=run, input_dtype=dtype, row_bytes=row_bytes)


def _booster(decl: Declaration, data: bytes, version: str) -> Model:
    from models.adapters.trees import load_booster

    tree = load_booster(data, decl)
    return _model(
        decl,
        None,
        version,
        tree=tree,
        predict_fn=tree.predict,
        input_dtype="float64",  # boosters split on float64 thresholds
    )


def _huggingface(decl: Declaration, data: bytes, version: str) -> Model:
    from models.adapters.hf import build_hf  # transformers: only when a checkpoint is loaded

    return build_hf(decl, data, version)


def load_background(data: bytes, decl: Declaration) -> np.ndarray:
    """A stored background: .npy (never pickled) or CSV with a header of feature names."""
    size = int(np.prod(decl.input_shape))
    if data[:6] == b"\x93NUMPY":
        arr = _npy(data)
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidModelError("background must be a .npy array or a UTF-8 CSV") from None
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 2:
            raise InvalidModelError("background CSV needs a header and at least one row")
        header = [h.strip().strip('"') for h in lines[0].split(",")]
        if header != list(decl.feature_names):
            raise InvalidModelError(
                f"background CSV header must be the feature names {list(decl.feature_names)}"
            )
        try:
            arr = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]])
        except ValueError:
            raise InvalidModelError("background CSV rows must be numbers") from None
    if arr.dtype.kind not in "fiub" or arr.size == 0 or arr.size % size:
        raise InvalidModelError(f"background needs rows of {size} numbers")
    arr = arr.astype(np.float32).reshape(-1, *decl.input_shape)
    if not np.all(np.isfinite(arr)):
        raise InvalidModelError("background must be finite (no NaN or infinity)")
    return arr


def _npy(data: bytes) -> np.ndarray:
    """A .npy array, its header read first: a shape whose byte size is not the data present
    (a header claiming 10^12 floats), an object dtype or a bad header is refused before
    anything is allocated."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"format version {version} is not supported")
    except Exception as exc:  # numpy's header parser: ValueError, SyntaxError, TokenError
        raise InvalidModelError(f"background .npy: {str(exc)[:300]}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise InvalidModelError("background .npy: object arrays are never read (pickles)")
    count = 1
    for dim in shape:
        count *= int(dim)
    expected = count * dtype.itemsize
    present = len(data) - stream.tell()
    if expected != present:
        raise InvalidModelError(
            f"background .npy: the header's shape {list(shape)} of {dtype} is {expected} "
            f"bytes; the file holds {present} bytes of data"
        )
    try:
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell())
    except ValueError as exc:
        raise InvalidModelError(f"background .npy: {exc}") from None
    return arr.reshape(shape, order="F" if fortran else "C")


def build_model(meta: dict[str, Any], files: dict[str, bytes]) -> Model:
    """A Model from a stored declaration (`Declaration.as_dict()` plus "version") and its
    files: "model" (the uploaded file; absent for remote models), "background" (optional)."""
    decl = Declaration.from_dict(meta)
    data = files.get("model", b"")
    version = meta.get("version") or content_version(data, decl)
    builders = {
        "torchscript": lambda: _torchscript(decl, data, version),
        "onnx": lambda: _onnx(decl, data, version),
        "xgboost": lambda: _booster(decl, data, version),
        "lightgbm": lambda: _booster(decl, data, version),
        "remote": lambda: _remote(decl, version),
        "huggingface": lambda: _huggingface(decl, data, version),
    }
    if decl.format not in builders:
        raise InvalidModelError(f"format must be one of {list(FORMATS)}")
    model = builders[decl.format]()
    if "background" in files:
        bg = load_background(files["background"], decl)
        info = {"source": "registered", "rows": len(bg)}
        model = replace(model, background=bg, background_info=info, version=model.version)
    return model


def register(
    decl: Declaration,
    files: dict[str, bytes],
    device: torch.device | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> tuple[Model, dict[str, Any]]:
    """Build and check a new registration on `device` (default the CPU; a registry's
    `device`) under a memory budget per model call (a registry's `max_batch_bytes`): (the
    model, the meta to store with its files). A model one row of which does not fit in the
    budget is refused."""
    meta = decl.as_dict()
    data = files.get("model", b"")
    if decl.format == "remote":
        data = json.dumps([decl.remote_url]).encode()
    h = hashlib.sha256(data + files.get("background", b""))
    h.update(json.dumps({**meta, "name": None}, sort_keys=True).encode())
    meta["version"] = h.hexdigest()[:16]
    model = build_model(meta, files)
    try:
        model = place(check_forward(model), device or torch.device("cpu"), max_batch_bytes)
    except RuntimeError as exc:  # e.g. a TorchScript archive that pinned its tensors to the CPU
        raise InvalidModelError(f"the model cannot run on {device}: {exc}") from None
    try:
        model.rows_per_pass()
    except RowTooLargeError as exc:
        raise InvalidModelError(str(exc)) from None
    return check_forward(model), meta
