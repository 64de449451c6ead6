"""What a model file states about itself, read without running it: shapes, outputs, feature
names, task. Registration fills undeclared fields from these facts and refuses declarations
that contradict them.

- XGBoost (JSON/UBJSON): the stored feature names (set when trained on a pandas DataFrame), the
  number of features, the objective (task) and `num_class`. The file keeps no class labels
  (XGBClassifier trains on labels 0..k-1), so classifiers' outputs are named "0".."k-1" and a
  regressor's output "prediction".
- LightGBM text: the header's `feature_names=` (LightGBM's placeholder names Column_0, ... of
  models trained on arrays count as not stated), `num_class` and `objective=`, named as above.
- ONNX: the one graph input ([N, n] float: tabular, n features; [N, C, H, W] float: image) and
  the explained output: the first float [N, k] or [N] tensor, else the float tensor a ZipMap
  node reads (skl2onnx's default conversion). Class labels come from the classifier nodes
  (`classlabels_ints`, `classlabels_int64s`, `classlabels_strings`, ZipMap's) or the classes
  initializer skl2onnx indexes with ArgMax; an unlabelled output is named after its tensor.
- TorchScript and remote models state nothing reliable: an empty `Facts`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from models.declaration import Facts, InvalidModelError


def file_facts(fmt: str, data: bytes) -> Facts:
    """The facts `data` (a model file of format `fmt`) states; InvalidModelError when a file
    of that format cannot be read."""
    if fmt == "xgboost":
        return _xgboost(data)
    if fmt == "lightgbm":
        return _lightgbm(data)
    if fmt == "onnx":
        return _onnx(data)
    # --- Hugging Face checkpoints: read by models/adapters/hf.py ---
    if fmt == "huggingface":
        from models.adapters.checkpoint import hf_facts

        return hf_facts(data)
    return Facts()  # torchscript, remote: nothing stated


def _outputs(task: str, k: int) -> tuple[str, ...]:
    if task == "classification":
        return tuple(str(c) for c in range(k))
    return ("prediction",) if k <= 1 else tuple(f"prediction_{i}" for i in range(k))


def _xgboost(data: bytes) -> Facts:
    import xgboost as xgb

    from models.adapters.booster_check import xgboost_checked

    data = xgboost_checked(data)  # structure checked before the library reads it
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))
        config = json.loads(booster.save_config())["learner"]
    except Exception as exc:
        raise InvalidModelError(f"not an XGBoost model (JSON or UBJSON): {exc}") from None
    objective = str(config["objective"]["name"])
    params = config.get("learner_model_param", {})
    n_classes = int(params.get("num_class", "0") or 0)
    task = "classification" if objective.startswith(("binary:", "multi:")) else "regression"
    if task == "classification":
        k = 2 if objective.startswith("binary:") else n_classes
    else:
        k = int(params.get("num_target", "1") or 1)
    names = booster.feature_names
    return Facts(
        modality="tabular",
        task=task,
        input_shape=(booster.num_features(),),
        output_names=_outputs(task, k),
        feature_names=None if names is None else tuple(names),
    )


_LGB_PLACEHOLDER = re.compile(r"^Column_\d+$")
_LGB_CLASSIFIERS = ("binary", "multiclass", "softmax", "multiclassova", "multiclass_ova", "ova")


def _lightgbm(data: bytes) -> Facts:
    header: dict[str, str] = {}
    for line in data[:1_000_000].decode("utf-8", "replace").splitlines():
        if line.startswith("Tree="):
            break
        key, sep, value = line.partition("=")
        if sep:
            header[key.strip()] = value.strip()
    try:
        n_features = int(header["max_feature_idx"]) + 1
        n_classes = int(header.get("num_class", "1"))
    except (KeyError, ValueError):
        raise InvalidModelError(
            "not a LightGBM model (text format, Booster.save_model): no max_feature_idx line"
        ) from None
    objective = header.get("objective", "").split(" ")[0]
    task = "classification" if objective in _LGB_CLASSIFIERS else "regression"
    k = 2 if objective == "binary" else n_classes
    names = tuple(header.get("feature_names", "").split())
    stated = len(names) == n_features and not all(_LGB_PLACEHOLDER.match(n) for n in names)
    return Facts(
        modality="tabular",
        task=task,
        input_shape=(n_features,),
        output_names=_outputs(task, k),
        feature_names=names if stated else None,
    )


_FLOAT = (1, 10, 11)  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE
_NUMERIC = (*_FLOAT, 2, 3, 4, 5, 6, 7, 12, 13)  # and the integer types
_LABELS = ("classlabels_ints", "classlabels_int64s", "classlabels_strings")


def _dims(value_info: Any) -> list[int | None] | None:
    """A tensor's dims (None where symbolic); None when it is not a tensor or has no shape."""
    if value_info.type.WhichOneof("value") != "tensor_type":
        return None
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]


def _labels(graph: Any) -> tuple[str, ...] | None:
    """The class labels the graph states, when every place that states them agrees."""
    from onnx import helper, numpy_helper

    found: set[tuple[str, ...]] = set()
    argmax = {out for node in graph.node if node.op_type == "ArgMax" for out in node.output}
    initializers = {init.name: init for init in graph.initializer}
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in _LABELS:
                values = helper.get_attribute_value(attr)
                found.add(tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values))
        # skl2onnx's MLP-style classifiers: label = classes[argmax(probabilities)]
        if (
            node.op_type == "ArrayFeatureExtractor"
            and node.input[0] in initializers
            and node.input[1] in argmax
        ):
            values = numpy_helper.to_array(initializers[node.input[0]]).reshape(-1)
            found.add(tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values))
    found.discard(())
    return next(iter(found)) if len(found) == 1 else None


def _onnx(data: bytes) -> Facts:
    import onnx

    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:
        raise InvalidModelError(
            f"not a model this service can read (TorchScript, ONNX, XGBoost JSON/UBJSON or "
            f"LightGBM text; pickles are never accepted): onnx says {exc}"
        ) from None
    from models.adapters.onnx import check_external_data

    check_external_data(model)  # before numpy_helper reads any tensor (external data)
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    modality, shape = None, None
    if len(inputs) == 1:
        dims = _dims(inputs[0])
        elem = inputs[0].type.tensor_type.elem_type
        if dims and len(dims) >= 2 and elem in _NUMERIC and all(d for d in dims[1:]):
            shape = tuple(int(d) for d in dims[1:] if d)
            if elem in _FLOAT:
                modality = {2: "tabular", 4: "image"}.get(len(dims))
    # The explained output, chosen as models/adapters/onnx.py chooses it.
    candidates: list[tuple[str, list[int | None]]] = []
    for out in graph.output:
        dims = _dims(out)
        if dims is not None and out.type.tensor_type.elem_type in _FLOAT and len(dims) in (1, 2):
            candidates.append((out.name, dims))
    zipmaps = [n for n in graph.node if n.op_type == "ZipMap"]
    candidates += [(n.input[0], [None, None]) for n in zipmaps]
    labels = _labels(graph)
    if not candidates:
        return Facts(modality=modality, input_shape=shape)
    name, dims = candidates[0]
    k = 1 if len(dims) == 1 else dims[1]
    task, outputs = None, None
    if labels is not None and (k is None or k == len(labels)):
        task, outputs = "classification", labels
    elif zipmaps:
        task = "classification"
    if outputs is None and k is not None:
        outputs = (name,) if k == 1 else tuple(f"{name}_{i}" for i in range(k))
    return Facts(
        modality=modality, task=task, input_shape=shape, output_names=outputs, onnx_output=name
    )
