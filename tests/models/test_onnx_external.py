"""ONNX external data: refused in single-file uploads (onnxruntime would read the server's files
relative to its working directory), inside an archive only from files inside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from models.adapters.onnx import OnnxModelError, check_external_data, onnx_predictor
from models.declaration import Declaration, InvalidModelError
from tests.models import hf_fixtures as fx
from tests.models import onnx_text_fixtures as ofx

SECRET = b"[core]\n\trepositoryformatversion = 0\n"  # 40 bytes, like a .git/config


def leaking_model(location: str, n: int = len(SECRET), in_constant: bool = False) -> bytes:
    """y = x[:, :1] * 0 + sum(cast(secret))...: an initializer (or a Constant node's tensor)
    whose bytes onnxruntime reads from `location`."""
    secret = TensorProto()
    secret.name = "secret"
    secret.data_type = TensorProto.UINT8
    secret.dims.append(n)
    secret.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(n))):
        entry = secret.external_data.add()
        entry.key, entry.value = key, value
    nodes = [
        helper.make_node("Cast", ["secret"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["f", "axes"], ["row"]),
        helper.make_node("Add", ["x", "row"], ["y"]),
    ]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [0])]
    if in_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["secret"], value=secret))
    else:
        inits.append(secret)
    graph = helper.make_graph(
        nodes,
        "leak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def decl(n: int = len(SECRET)) -> Declaration:
    return Declaration(
        name="leak", format="onnx", modality="tabular", task="regression", input_shape=(n,),
        output_names=tuple(f"y{i}" for i in range(n)),
        feature_names=tuple(f"f{i}" for i in range(n)),
    )  # fmt: skip


def test_the_audit_reproduces_with_onnxruntime_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the check: onnxruntime reads the working directory's file into the output."""
    import onnxruntime as ort

    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    session = ort.InferenceSession(leaking_model(".git/config"), providers=["CPUExecutionProvider"])
    out = session.run(None, {"x": np.zeros((1, len(SECRET)), np.float32)})[0]
    assert bytes(out[0].astype(np.uint8)) == SECRET


@pytest.mark.parametrize("in_constant", [False, True])
@pytest.mark.parametrize("location", [".git/config", "/etc/hostname", "../x", "weights.data"])
def test_single_file_uploads_with_external_data_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str, in_constant: bool
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OnnxModelError, match="stored as external data") as e:
        onnx_predictor(leaking_model(location, in_constant=in_constant), decl())
    assert repr(location) in str(e.value)


def test_a_subgraph_tensor_is_found() -> None:
    inner = onnx.load_model_from_string(leaking_model(".git/config", in_constant=True))
    branch = helper.make_graph(list(inner.graph.node)[:1], "then", [], [
        helper.make_tensor_value_info("secret", TensorProto.UINT8, [None])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["secret"], then_branch=branch, else_branch=branch)
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("secret", TensorProto.UINT8, [None])
    graph = helper.make_graph([node], "g", [cond], [out])
    with pytest.raises(OnnxModelError, match=r"(then|else)_branch"):
        check_external_data(helper.make_model(graph))


def _external_copy(dest: Path) -> Path:
    """The ONNX text classifier folder with model.onnx's weights in weights.data beside it."""
    shutil.copytree(ofx.folder(), dest)
    model = onnx.load_model(str(dest / "model.onnx"))
    onnx.save_model(
        model, str(dest / "model.onnx"), save_as_external_data=True,
        all_tensors_to_one_file=True, location="weights.data", size_threshold=1024,
    )  # fmt: skip
    return dest


def _relocate(folder: Path, location: str) -> None:
    model = onnx.load_model(str(folder / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save_model(model, str(folder / "model.onnx"))


def test_archive_external_data_inside_loads_outside_is_refused(tmp_path: Path) -> None:
    from models.adapters.checkpoint import archive_checkpoint
    from models.adapters.hf import declare
    from models.adapters.user import register

    good = _external_copy(tmp_path / "good")
    data = fx.archive(good)
    model = register(declare("onnx-ext", archive_checkpoint(data)), {"model": data})[0]
    assert model.info["source"] == "onnx"
    outside = tmp_path / "outside.bin"
    shutil.copy(good / "weights.data", outside)
    for location in ("../outside.bin", str(outside), "sub/../../outside.bin"):
        bad = tmp_path / f"bad{abs(hash(location))}"
        shutil.copytree(good, bad)
        _relocate(bad, location)
        data = fx.archive(bad)
        with pytest.raises(InvalidModelError, match="external data must be a file inside"):
            register(declare("onnx-ext", archive_checkpoint(data)), {"model": data})
    link = tmp_path / "linked"
    shutil.copytree(good, link)
    (link / "weights.data").unlink()
    (link / "weights.data").symlink_to(outside)
    model_proto = onnx.load_model(str(link / "model.onnx"), load_external_data=False)
    with pytest.raises(OnnxModelError, match="no links out"):
        check_external_data(model_proto, link)
    check_external_data(model_proto, good)
