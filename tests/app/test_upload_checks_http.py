"""Hostile uploads over HTTP are 400s that say what is wrong, and touch nothing on the host:
TorchScript file operators, an inflating archive, ONNX external data naming the server's
.git/config, a booster split index of 1e9, a truncated LightGBM file, a .npy background header
claiming 10^12 floats."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from tests import byom_models as bm
from tests.models.test_onnx_external import leaking_model
from tests.models.test_upload_checks import ReadsFile, Zeros, _npy, deflated, saved


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def form(name: str, n: int = 6, fmt: str | None = None, **extra: str) -> dict[str, str]:
    out = {
        "name": name, "modality": "tabular", "task": "regression",
        "input_shape": json.dumps([n]), "output_names": json.dumps(["y"] if n == 6 else
                                                                   [f"y{i}" for i in range(n)]),
        "feature_names": json.dumps([f"f{i}" for i in range(n)]), **extra,
    }  # fmt: skip
    if fmt:
        out["format"] = fmt
    return out


def refused(client: TestClient, data: dict[str, str], files: dict[str, Any]) -> str:
    r = client.post("/v2/repository/models", data=data, files=files)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_model"
    message: str = body["error"]
    name = data["name"]
    assert client.get(f"/v2/models/{name}").status_code == 404  # nothing registered
    return message


class Overwrites(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_file("/tmp/h2-upload-target.bin", True, 8)
        t.fill_(7.0)
        return x + t.sum()


def test_torchscript_file_operators_are_400_and_the_file_is_untouched(
    client: TestClient,
) -> None:
    target = Path("/tmp/h2-upload-target.bin")
    target.unlink(missing_ok=True)
    for module in (ReadsFile(), Overwrites()):
        data = saved(torch.jit.script(module))
        msg = refused(client, form("ts-file"), {"file": ("m.pt", data)})
        assert "TorchScript operator aten::from_file is not allowed" in msg
        assert "host files" in msg
    assert not target.exists()


def test_an_inflating_torchscript_archive_is_400_with_sizes(client: TestClient) -> None:
    bomb = deflated(saved(torch.jit.script(Zeros(16 << 20))))  # 64 MiB of zeros in ~65 KB
    msg = refused(client, form("ts-bomb"), {"file": ("m.pt", bomb)})
    assert "archive/data/0" in msg and "64.0 MiB" in msg and "KiB" in msg


def test_onnx_external_data_naming_git_config_is_400(client: TestClient) -> None:
    """The server's working directory has a .git/config: onnxruntime would read it."""
    assert (Path.cwd() / ".git").exists()
    n = 40
    data = leaking_model(".git/config", n)
    msg = refused(client, form("onnx-leak", n, "onnx"), {"file": ("m.onnx", data)})
    assert "external data" in msg and ".git/config" in msg


def test_a_booster_split_index_of_1e9_is_400(client: TestClient) -> None:
    model = bm.xgboost_model("xgb-evil")
    doc = json.loads(model.file or b"")
    doc["learner"]["gradient_booster"]["model"]["trees"][2]["split_indices"][0] = 10**9
    files = {"file": ("m.json", json.dumps(doc).encode())}
    msg = refused(client, {**model.form}, files)
    assert "split index 1000000000 is out of range" in msg


def test_a_truncated_lightgbm_file_is_400(client: TestClient) -> None:
    model = bm.lightgbm_model("lgb-cut")
    text = (model.file or b"").decode()
    cut = text[: text.index("end of trees") - 30].encode()
    msg = refused(client, {**model.form, "format": "lightgbm"}, {"file": ("m.txt", cut)})
    assert "truncated" in msg


def test_a_npy_background_claiming_a_trillion_floats_is_400(client: TestClient) -> None:
    model = bm.scripted_linear("lin-npy")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }"
    files = {**model.upload(), "background": ("bg.npy", _npy(header, b"\0" * 96))}
    msg = refused(client, model.form, files)
    assert "background .npy" in msg and "1000000" in msg
    good = io.BytesIO()
    np.save(good, model.background.astype(np.float32))
    files = {**model.upload(), "background": ("bg.npy", good.getvalue())}
    r = client.post("/v2/repository/models", data=model.form, files=files)
    assert r.status_code == 201, r.text


def _foreign_files() -> dict[str, tuple[bytes, str]]:
    """Real files of formats the service does not read, as their libraries save them."""
    import pickle

    import joblib
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression().fit(np.arange(12.0).reshape(6, 2), [0, 1] * 3)
    out: dict[str, tuple[bytes, str]] = {"pickle": (pickle.dumps(clf), "Python pickle")}
    for compress in (0, 3):
        buf = io.BytesIO()
        joblib.dump(clf, buf, compress=compress)
        out[f"joblib-{compress}"] = (buf.getvalue(), "joblib" if compress else "pickle")
    linear = torch.nn.Linear(6, 1)
    buf = io.BytesIO()
    torch.save(linear.state_dict(), buf)
    out["torch.save"] = (buf.getvalue(), "torch.save checkpoint")
    buf = io.BytesIO()
    torch.export.save(torch.export.export(linear, (torch.zeros(1, 6),)), buf)
    out["torch.export"] = (buf.getvalue(), "torch.export program")
    out["catboost"] = (b"CBM1" + bytes(64), "CatBoost model")
    out["keras"] = (b"\x89HDF\r\n\x1a\n" + bytes(64), "HDF5")
    return out


@pytest.mark.parametrize("kind", ["pickle", "joblib-0", "joblib-3", "torch.save", "torch.export",
                                  "catboost", "keras"])  # fmt: skip
@pytest.mark.parametrize("declared", [None, "onnx"])
def test_formats_we_do_not_read_are_named(
    client: TestClient, kind: str, declared: str | None
) -> None:
    """Issue 40's first step: a joblib file was answered with ONNX's parse error, a torch.save or
    torch.export file as a corrupt TorchScript one. Each is a 400 naming what it is (a pickle is
    never loaded, whatever format was declared) and how to export a model that can come in."""
    data, named = _foreign_files()[kind]
    r = client.post(
        "/v2/repository/models",
        data=form(f"foreign-{kind.replace('.', '-')}", fmt=declared),
        files={"file": ("model.bin", data)},
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "unsupported_format" and named in body["error"], body
    assert "TorchScript" in body["error"] and "skl2onnx" in body["error"]


def test_real_formats_are_not_taken_for_foreign_ones() -> None:
    """The files the service reads are none of those (their first bytes and members)."""
    from app.file_registration import foreign_format
    from models.adapters.archive import zip_names

    for data in (saved(torch.jit.script(torch.nn.Linear(6, 1))), bm.sklearn_onnx().file,
                 bm.xgboost_model().file, bm.lightgbm_model().file):  # fmt: skip
        assert data is not None
        names = zip_names(data) if data[:2] == b"PK" else []
        assert foreign_format(data, names) is None
