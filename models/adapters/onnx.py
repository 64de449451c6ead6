"""ONNX models run by onnxruntime on the CPU provider: a black box for model-agnostic explainers.

Covers scikit-learn pipelines converted by skl2onnx, PyTorch exports and boosters converted by
onnxmltools. The explained output is the first float tensor of shape [N, k] (or [N]) unless the
registration names one (`onnx_output`; skl2onnx classifiers: `probabilities`). A ZipMap output
(skl2onnx's default: a sequence of maps) is served from the float [N, k] tensor the ZipMap reads.

External data: onnxruntime reads a tensor stored with `data_location=EXTERNAL` from the file its
`location` names, relative to the working directory for a model given as bytes. A single-file
upload with any external tensor is refused (`check_external_data`); inside an unpacked archive
(models/adapters/onnx_text.py) a location must resolve to a regular file inside the archive's
folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import ModelError

if TYPE_CHECKING:
    from models.declaration import Declaration

_FLOATS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}
_INPUTS = {**_FLOATS, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnnxModelError(ModelError):
    """The ONNX file cannot serve the declared model."""


def _tensors(graph: Any, where: str) -> Iterator[tuple[str, Any]]:
    """(where, tensor) for every tensor of a graph: initializers, sparse initializers and node
    attributes, subgraphs (If/Loop/Scan bodies) included."""
    for t in graph.initializer:
        yield f"{where}initializer {t.name!r}", t
    for sp in graph.sparse_initializer:
        yield f"{where}sparse initializer {sp.values.name!r}", sp.values
        yield f"{where}sparse initializer {sp.values.name!r} indices", sp.indices
    for node in graph.node:
        yield from _attribute_tensors(node, where)


def _attribute_tensors(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    label = f"{where}node {node.name or node.op_type!r} attribute"
    for attr in node.attribute:
        here = f"{label} {attr.name!r}"
        if attr.HasField("t"):
            yield here, attr.t
        yield from ((here, t) for t in attr.tensors)
        for sp in ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(
            attr.sparse_tensors
        ):
            yield here, sp.values
            yield here, sp.indices
        if attr.HasField("g"):
            yield from _tensors(attr.g, f"{here}: ")
        for g in attr.graphs:
            yield from _tensors(g, f"{here}: ")


def _all_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    yield from _tensors(model.graph, "")
    for fn in model.functions:
        for node in fn.node:
            yield from _attribute_tensors(node, f"function {fn.name!r} ")


def _location(tensor: Any) -> str | None:
    """The external file a tensor names, or None when its data is inside the model."""
    import onnx

    external = tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data)
    if not external:
        return None
    entries = {e.key: e.value for e in tensor.external_data}
    return entries.get("location", "")


def check_external_data(model: Any, root: Path | None = None) -> None:
    """Refuse tensors stored outside the model (`data_location=EXTERNAL`): always when `root`
    is None (a single-file upload: onnxruntime would read a file of the server's); else
    unless the location is a relative path without `..` that resolves, links followed, to a
    regular file inside `root` (the unpacked archive's folder). OnnxModelError naming it."""
    for where, tensor in _all_tensors(model):
        location = _location(tensor)
        if location is None:
            continue
        if root is None:
            raise OnnxModelError(
                f"{where} is stored as external data ({location!r}): a single-file ONNX upload "
                "must hold its tensors (onnx.save_model(..., save_as_external_data=False)); "
                "external data is read only from inside an uploaded archive"
            )
        _check_inside(where, location, root)


def _check_inside(where: str, location: str, root: Path) -> None:
    rel = PurePosixPath(location)
    bad = (
        not location
        or "\\" in location
        or "\x00" in location
        or ":" in location
        or rel.is_absolute()
        or ".." in rel.parts
    )
    base = root.resolve()
    target = (base / location).resolve() if not bad else base
    if bad or not target.is_relative_to(base) or target == base or not target.is_file():
        raise OnnxModelError(
            f"{where} names external data {location!r}: external data must be a file inside "
            "the uploaded archive (a relative path, no '..', no links out of it)"
        )


def parse_checked(data: bytes) -> Any:
    """The ModelProto of a single-file upload, external data refused (OnnxModelError)."""
    import onnx

    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:
        raise OnnxModelError(
            f"not a model this service can read (TorchScript, ONNX, XGBoost JSON/UBJSON or "
            f"LightGBM text; pickles are never accepted): onnx says {exc}"
        ) from None
    check_external_data(model)
    return model


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


def _expose_zipmap_inputs(data: bytes) -> bytes:
    """The graph with each ZipMap node's float [N, k] input also a graph output (onnxruntime
    only fetches graph outputs); the bytes unchanged when there is none or they do not parse."""
    if b"ZipMap" not in data:
        return data
    import onnx

    try:
        model = onnx.load_model_from_string(data)
    except Exception:
        return data  # onnxruntime reports what is wrong with the file
    outputs = {o.name for o in model.graph.output}
    added = [n.input[0] for n in model.graph.node if n.op_type == "ZipMap"]
    added = [name for name in dict.fromkeys(added) if name not in outputs]
    for name in added:
        info = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [None, None])
        model.graph.output.append(info)
    return model.SerializeToString() if added else data


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
    parse_checked(data)  # before onnxruntime sees the bytes
    try:
        graph = _expose_zipmap_inputs(data)
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise OnnxModelError(
            f"not a model this service can read (TorchScript, ONNX, XGBoost JSON/UBJSON or "
            f"LightGBM text; pickles are never accepted): onnxruntime says {exc}"
        ) from None
    inputs = session.get_inputs()
    token_inputs = [i.name for i in inputs if i.name in _TOKEN_INPUTS]
    if token_inputs:  # a transformer export: rows of numbers would be cast to token ids
        raise OnnxModelError(
            f"the ONNX graph reads token ids ({token_inputs}): a text model, not rows of "
            "numbers; register it as format huggingface: a .tar.gz/.zip of a folder with this "
            "model.onnx beside its tokenizer.json (and config.json with id2label), or the "
            "checkpoint itself (config.json, model.safetensors, tokenizer files)"
        )
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


_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 16: 2}


def graph_row_bytes(data: bytes, n_features: int) -> int:
    """A bound on onnxruntime's working memory per row: the bytes per row of every tensor
    of the graph that has the batch dimension (its inputs, outputs and intermediate values,
    shapes from onnx's shape inference), as if none were freed or reused; a tensor of unknown
    shape counts as one float64 input row. 0 when the graph does not parse."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(onnx.load_model_from_string(data))
    except Exception:
        return 0
    graph = model.graph
    constant = {i.name for i in graph.initializer}
    total = 0
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.name in constant or not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim) if tensor.HasField("shape") else []
        known = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if not known or (known[0] is not None and known[0] <= 1 and len(known) == 1):
            continue  # a scalar or a constant-sized value: no batch dimension
        if any(k is None for k in known[1:]):
            total += 8 * n_features
            continue
        batch = known[0] if known[0] else 1  # a fixed batch: its share of one row
        size = int(np.prod([k for k in known[1:] if k is not None] or [1]))
        total += -(-size * _ELEMENT_BYTES.get(tensor.elem_type, 8) // batch)
    return total
