"""Black boxes (ONNX, boosters, remote OIP endpoints, BM25) have no torch module (issue 16):
`predict` calls their own function, they are never differentiable, and their version is the
content hash of their file and declaration, as before `module` became optional."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.adapters.remote import RemoteConfig, configure
from models.adapters.user import register
from models.base import Model, NoModuleError
from models.builtin.rankers import load_bm25
from models.declaration import Declaration
from tests import byom_models as bm

FIXTURES = {
    "onnx": lambda: bm.sklearn_onnx(),
    "onnx-image": lambda: bm.torch_onnx(),
    "xgboost": lambda: bm.xgboost_model(task="classification"),
    "lightgbm": lambda: bm.lightgbm_model(),
}
FORMAT = {"onnx-image": "onnx"}


def declaration(um: bm.UserModel, fmt: str, **extra: Any) -> Declaration:
    meta: dict[str, Any] = {
        k: json.loads(v) if k in ("input_shape", "output_names", "feature_names", "input_range")
        else v
        for k, v in um.form.items()
    }  # fmt: skip
    return Declaration.from_dict({**meta, "format": fmt, **extra})


def content_hash(data: bytes, decl: Declaration) -> str:
    """The registration version: file (and background) bytes plus the declaration."""
    h = hashlib.sha256(data)
    h.update(json.dumps({**decl.as_dict(), "name": None}, sort_keys=True).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("kind", sorted(FIXTURES))
def test_registered_black_boxes_have_no_module(kind: str) -> None:
    um = FIXTURES[kind]()
    assert um.file is not None
    decl = declaration(um, FORMAT.get(kind, kind))
    model, meta = register(decl, {"model": um.file})
    assert model.module is None and model.predict_fn is not None
    assert not model.differentiable and model.device == torch.device("cpu")
    assert model.version == meta["version"] == content_hash(um.file, decl)
    np.testing.assert_allclose(model.predict(um.rows), um.predict(um.rows), rtol=1e-5, atol=1e-6)
    with pytest.raises(NoModuleError, match="black box"):
        model.torch_module()
    again, _ = register(decl, {"model": um.file})
    assert again.version == model.version  # loading twice does not move the version


class _Sums(BaseHTTPRequestHandler):
    """A minimal OIP endpoint: row sums and row maxima as FP32 [m, 2]."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tensor = body["inputs"][0]
        rows = np.asarray(tensor["data"], np.float32).reshape(tensor["shape"])
        out = np.stack([rows.sum(axis=1), rows.max(axis=1)], axis=1)
        answer = {"outputs": [{"name": "y", "datatype": "FP32", "shape": list(out.shape),
                               "data": out.reshape(-1).tolist()}]}  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def oip_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sums)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    previous = configure(RemoteConfig(hosts="127.0.0.1"))  # REMOTE_MODEL_HOSTS: loopback
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v2/models/sums"
    finally:
        configure(previous)
        server.shutdown()
        server.server_close()


def test_remote_model_predicts_over_http_without_module(oip_url: str) -> None:
    decl = Declaration(
        "sums", "tabular", "regression", (3,), ("sum", "max"), ("a", "b", "c"),
        format="remote", remote_url=oip_url,
    )  # fmt: skip
    model, meta = register(decl, {})
    assert model.module is None and not model.differentiable
    assert model.info["device"] == "remote"
    assert model.version == meta["version"] == content_hash(json.dumps([oip_url]).encode(), decl)
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = model.predict(rows)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.stack([rows.sum(1), rows.max(1)], axis=1))


def test_bm25_has_no_module_and_keeps_its_config_version() -> None:
    ranker = load_bm25(Path("."))
    assert ranker.module is None and not ranker.differentiable
    assert len(ranker.version) == 16 and ranker.score("cats", ["cats sit", "dogs run"])[0] > 0


def test_differentiable_follows_the_module() -> None:
    fields: dict[str, Any] = dict(
        name="m", modality="tabular", task="regression", input_shape=(2,),
        feature_names=("a", "b"), output_names=("y",),
    )  # fmt: skip
    lin = torch.nn.Linear(2, 1).eval()
    torch_model = Model(**fields, module=lin)
    assert torch_model.differentiable and torch_model.torch_module() is lin
    box = Model(**fields, predict_fn=lambda r: r.sum(1, keepdims=True), version="v")
    assert not box.differentiable  # declared True by default; no module decides it
    np.testing.assert_array_equal(box.predict(np.ones((3, 2))), np.full((3, 1), 2.0))
    nothing = Model(**fields)
    assert not nothing.differentiable and nothing.version == hashlib.sha256().hexdigest()[:16]
    with pytest.raises(NoModuleError):
        nothing.predict(np.ones((1, 2)))
