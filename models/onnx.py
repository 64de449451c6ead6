"""ONNX models run by onnxruntime on the CPU provider: a black box for model-agnostic explainers.

Covers scikit-learn pipelines converted by skl2onnx, PyTorch exports and boosters converted by
onnxmltools. The explained output is the first float tensor of shape [N, k] (or [N]) unless the
registration names one (`onnx_output`; skl2onnx classifiers with zipmap=False: `probabilities`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from models.base import ModelError

if TYPE_CHECKING:
    from models.declaration import Declaration

_FLOATS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}
_INPUTS = {**_FLOATS, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


class OnnxModelError(ModelError):
    """The ONNX file cannot serve the declared model."""


def _pick_output(session: object, wanted: str | None) -> str:
    outputs = session.get_outputs()  # type: ignore[attr-defined]
    usable = [o.name for o in outputs if o.type in _FLOATS and len(o.shape or []) in (1, 2)]
    if wanted is not None:
        if wanted not in usable:
            raise OnnxModelError(
                f"onnx_output {wanted!r} is not a float tensor of shape [N, k] or [N]; "
                f"usable outputs: {usable} (skl2onnx classifiers: convert with zipmap=False)"
            )
        return wanted
    if not usable:
        described = [(o.name, o.type) for o in outputs]
        raise OnnxModelError(
            f"no float tensor output of shape [N, k] among {described} (skl2onnx classifiers: "
            "convert with options={'zipmap': False})"
        )
    return usable[0]


def onnx_predictor(
    data: bytes, decl: Declaration
) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    """An onnxruntime session (CPU provider): (the numpy function rows [m, *input_shape] ->
    [m, k], and the input dtype the graph reads). A black box: no torch module."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise OnnxModelError(
            f"not a model this service can read (TorchScript, ONNX, XGBoost JSON/UBJSON or "
            f"LightGBM text; pickles are never accepted): onnxruntime says {exc}"
        ) from None
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise OnnxModelError(
            f"the ONNX graph has {len(inputs)} inputs; one tensor input is supported "
            "(convert pipelines with a single concatenated float input)"
        )
    first = inputs[0]
    if first.type not in _INPUTS:
        raise OnnxModelError(f"input {first.name!r} has type {first.type}; expected float or int")
    dtype = _INPUTS[first.type]
    dims = list(first.shape)
    size = int(np.prod(decl.input_shape))
    static = dims[1:]
    if all(isinstance(d, int) for d in static) and int(np.prod(static or [1])) != size:
        raise OnnxModelError(
            f"the ONNX input {first.name!r} has shape {dims}; input_shape {list(decl.input_shape)}"
            f" has {size} values per row"
        )
    # The rows' shape as the graph wants it: its static dims, else the declared shape.
    row_shape = tuple(static) if all(isinstance(d, int) for d in static) else decl.input_shape
    fixed_batch = dims[0] if dims and isinstance(dims[0], int) and dims[0] > 0 else None
    output = _pick_output(session, decl.onnx_output)
    name = first.name

    def run(x: np.ndarray) -> np.ndarray:
        try:
            return _run(x)
        except Exception as exc:  # onnxruntime's own errors: the model failed on these rows
            raise OnnxModelError(f"onnxruntime failed: {exc}") from None

    def _run(x: np.ndarray) -> np.ndarray:
        rows = x.reshape((x.shape[0], *row_shape)).astype(dtype, copy=False)
        if fixed_batch is None:
            out = session.run([output], {name: rows})[0]
        else:  # exported with a fixed batch size: feed it that many rows at a time
            parts = []
            for start in range(0, rows.shape[0], fixed_batch):
                chunk = rows[start : start + fixed_batch]
                pad = fixed_batch - chunk.shape[0]
                if pad:
                    chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
                parts.append(session.run([output], {name: chunk})[0][: fixed_batch - pad])
            out = np.concatenate(parts)
        return np.asarray(out, dtype=np.float32).reshape(x.shape[0], -1)

    input_dtype = "float64" if dtype is np.float64 else "float32"
    return run, input_dtype
