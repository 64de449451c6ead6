"""The client and CLI take numpy arrays and DataFrames (columns checked against the model's
features), give several targets back as shap's multi-output layout, and raise only XaiError."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from models.registry import ModelRegistry
from xai import Client, JobTimeout, XaiError

ROOT = Path(__file__).resolve().parents[1]
BREAST = "breast-cancer-mlp"


@pytest.fixture(scope="module")
def app_client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


class Counting:
    """The explain and job requests a client sent (seen by an httpx request hook)."""

    def __init__(self, http: TestClient) -> None:
        self.sent: list[str] = []
        http.event_hooks["request"] = [self.hook]

    def hook(self, request: Any) -> None:
        if request.method == "POST":
            self.sent.append(str(request.url.path))


@pytest.fixture()
def client(app_client: TestClient) -> Iterator[tuple[Client, Counting]]:
    counting = Counting(app_client)
    yield Client(http=app_client), counting  # type: ignore[arg-type]  # an httpx2.Client
    app_client.event_hooks["request"] = []


@pytest.fixture(scope="module")
def data(app_client: TestClient, model_dir: Path) -> dict[str, Any]:
    names = app_client.get(f"/v2/models/{BREAST}").json()["feature_names"]
    model = ModelRegistry(model_dir).get(BREAST)
    assert model.reference is not None
    rows = np.asarray(model.reference[:3], dtype=np.float64)
    background = np.asarray(model.reference[10:15], dtype=np.float64)
    return {"names": names, "rows": rows, "background": background}


def fields(data: dict[str, Any]) -> dict[str, Any]:
    return {"background": data["background"].tolist(), "budget": 5 * 400, "seed": 2}


def test_arrays_and_frames_equal_lists(
    client: tuple[Client, Counting], data: dict[str, Any]
) -> None:
    c, _ = client
    names, rows = data["names"], data["rows"]
    as_lists = c.explain(BREAST, rows.tolist(), target=1, **fields(data))
    as_array = c.explain(BREAST, rows, target=np.int64(1), **{**fields(data), "background":
                                                               data["background"]})  # fmt: skip
    shuffled = pd.DataFrame(rows, columns=names)[names[::-1]]
    as_frame = c.explain(BREAST, shuffled, target=1, **{
        **fields(data), "background": pd.DataFrame(data["background"], columns=names)
    })  # fmt: skip
    for other in (as_array, as_frame):
        np.testing.assert_allclose(other.values, as_lists.values, rtol=1e-12)
        assert [e["data"] for e in other.explanations] == rows.tolist()
    one = c.explain(BREAST, pd.DataFrame(rows, columns=names).iloc[0], target=1, **fields(data))
    np.testing.assert_allclose(one.values, as_lists.values[:1], rtol=1e-12)
    scalars = c.explain(BREAST, [[np.float32(v) for v in rows[0]]], target=1, **fields(data))
    assert scalars.values.shape == (1, 30)


def test_images_as_arrays(client: tuple[Client, Counting], app_client: TestClient) -> None:
    c, counting = client
    images = np.asarray(
        app_client.get("/v2/models/digits-cnn/examples", params={"n": 2}).json()["instances"]
    )  # [2, 1, 8, 8]
    params = {"patch_size": 4}
    got = c.explain("digits-cnn", images, parameters=params)
    same = c.explain("digits-cnn", images.tolist(), parameters=params)
    np.testing.assert_allclose(got.values, same.values, rtol=1e-12)
    before = len(counting.sent)
    with pytest.raises(XaiError, match=r"shape \[2, 8, 8\].*\[m, 1, 8, 8\]"):
        c.explain("digits-cnn", images[:, 0])
    assert len(counting.sent) == before  # refused before anything was sent


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop(columns=["mean radius"]), r"missing \['mean radius'\]"),
        (lambda f: f.assign(extra=1.0), r"unknown \['extra'\]"),
        (lambda f: f.assign(**{"mean radius": "big"}), r"\['mean radius'\] are not numbers"),
        (lambda f: f.assign(**{"mean radius": np.nan}), "finite"),
    ],
)
def test_wrong_frames_are_refused_before_sending(
    client: tuple[Client, Counting], data: dict[str, Any], change: Any, message: str
) -> None:
    c, counting = client
    frame = change(pd.DataFrame(data["rows"], columns=data["names"]))
    with pytest.raises(XaiError, match=message):
        c.explain(BREAST, frame)
    with pytest.raises(XaiError, match=message):
        c.audit(BREAST, frame, progress=False)
    assert counting.sent == []


@pytest.mark.parametrize(
    ("inputs", "extra", "message"),
    [
        ([[float("nan")] * 30], {}, "NaN or infinity at inputs"),
        ([[{1, 2}]], {}, "cannot be sent as JSON"),
        (42, {}, "expected a list of instances"),
        ([[1.0] * 30], {"target": True}, "not a bool"),
        ([[1.0] * 30], {"target": 1.5}, "got float"),
        (np.zeros(30), {}, r"shape \[30\]"),
    ],
)
def test_bad_arguments_are_xai_errors(
    client: tuple[Client, Counting], inputs: Any, extra: dict[str, Any], message: str
) -> None:
    c, counting = client
    with pytest.raises(XaiError, match=message):
        c.explain(BREAST, inputs, **extra)
    assert counting.sent == []


def test_other_failures_are_xai_errors(
    client: tuple[Client, Counting], tmp_path: Path
) -> None:
    c, _ = client
    with pytest.raises(XaiError, match="model"):
        c.explain("../v2", [[1.0]])
    with pytest.raises(XaiError, match="cannot write"):
        c.plot("diabetes-mlp", [[0.0] * 10], path=tmp_path / "no" / "such" / "dir.png")
    job = c.submit({"kind": "audit", "model": BREAST, "inputs": [[10.0] * 30] * 50,
                    "budget": 30000})  # fmt: skip
    with pytest.raises(JobTimeout) as err:
        c.wait(job, timeout=0.0, poll=0.01)
    assert isinstance(err.value, XaiError)
    c.cancel(job)
    refused = Client("http://127.0.0.1:9", timeout=2)
    with pytest.raises(XaiError, match="cannot reach"):
        refused.models()
    with pytest.raises(XaiError):
        Client("not a url at all:://", timeout=2).models()


def test_several_targets_as_shap_and_frames(
    client: tuple[Client, Counting], data: dict[str, Any]
) -> None:
    c, _ = client
    names, rows = data["names"], data["rows"]
    every = c.explain(BREAST, pd.DataFrame(rows, columns=names), target="all", **fields(data))
    assert every.output_names == ["malignant", "benign"]
    assert every.values.shape == (3, 30, 2) and every.base_values.shape == (3, 2)
    for t in range(2):
        one = c.explain(BREAST, rows, target=t, **fields(data))
        np.testing.assert_allclose(every.values[:, :, t], one.values, rtol=1e-9, atol=1e-12)
    sx = every.to_shap()
    assert sx.values.shape == (3, 30, 2) and list(sx.output_names) == ["malignant", "benign"]
    np.testing.assert_allclose(sx.data, rows, rtol=1e-12)
    outputs = np.array([e["instance_output_value"] for e in every.explanations]).reshape(3, 2)
    np.testing.assert_allclose(sx.values.sum(axis=1) + sx.base_values, outputs, atol=1e-6)
    table = every.to_frame()
    assert list(table["index"]) == [0, 0, 1, 1, 2, 2]
    assert list(table["output"]) == ["malignant", "benign"] * 3
    per_row = every.values.transpose(0, 2, 1).reshape(6, 30)  # [instance * output, player]
    np.testing.assert_allclose(table[names].to_numpy(), per_row)
    np.testing.assert_allclose(table[[f"input.{n}" for n in names]], np.repeat(rows, 2, axis=0))
    listed = c.explain(BREAST, rows, target=("benign", 0), **fields(data))
    np.testing.assert_allclose(listed.values, every.values[:, :, ::-1], rtol=1e-9, atol=1e-12)


def test_audit_of_a_frame(client: tuple[Client, Counting], data: dict[str, Any]) -> None:
    c, _ = client
    names, rows = data["names"], data["rows"]
    frame = pd.DataFrame(rows, columns=names)[sorted(names)]
    result = c.audit(BREAST, frame, progress=False, target=1, **fields(data))
    assert result.status["status"] == "succeeded"
    np.testing.assert_allclose(result.to_shap().data, rows, rtol=1e-12)
    np.testing.assert_allclose(result.to_frame()[[f"input.{n}" for n in names]], rows)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xai", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_cli_reads_parquet_and_npy_and_several_targets(
    inprocess_server: str, data: dict[str, Any], tmp_path: Path
) -> None:
    names, rows = data["names"], data["rows"]
    parquet, npy = tmp_path / "rows.parquet", tmp_path / "rows.npy"
    pd.DataFrame(rows, columns=names)[names[::-1]].to_parquet(parquet)
    np.save(npy, rows)
    base = ["--url", inprocess_server, "explain", BREAST]
    opts = ["--target", "all", "--budget", "8000", "--json"]
    answers = []
    for path in (parquet, npy):
        done = cli(*base, str(path), *opts)
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    for answer in answers:
        got = [e["output_index"] for e in answer["data"]["explanations"]]
        assert got == [0, 1] * 3 and answer["meta"]["targets"]["budget"] == "shared"
    assert answers[0]["data"]["explanations"] == answers[1]["data"]["explanations"]
    listed = cli(*base, str(npy), "--target", "1,0", "--budget", "8000")
    assert listed.returncode == 0 and listed.stdout.count("[2] benign") == 1, listed.stdout
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    for path in (broken, tmp_path / "missing.csv"):
        bad = cli("--url", inprocess_server, "audit", BREAST, str(path), "--no-progress")
        assert bad.returncode == 2 and "xai: error:" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def test_unreachable_is_one_line() -> None:
    with pytest.raises(XaiError):
        Client(http=httpx.Client(base_url="http://127.0.0.1:9", timeout=1)).model("x")
