"""Lean answers: an explanation echoes its instance (`data`) up to ECHO_LIMIT numbers; a larger
image answers `data: null` with its digest unless the request asks for `return_inputs`, and the
cache never serves one form for the other. RGB CNNs registered over HTTP (tests/image_models.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.schemas import ECHO_LIMIT
from tests import image_models as im


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register(client: TestClient, name: str, channels: int, size: int) -> None:
    module = im.torchscript_bytes(im.rgb_cnn(channels, size))
    r = client.post(
        "/v2/repository/models",
        data=im.image_form(name, channels, size),
        files={"file": (f"{name}.pt", module)},
    )
    assert r.status_code == 201, r.text


def explain(client: TestClient, name: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == 200, r.text
    return r.json(), len(r.content)


def sha(x: Any) -> str:
    return hashlib.sha256(np.asarray(x, dtype=np.float32).tobytes()).hexdigest()


def test_large_image_answers_its_digest_and_the_echo_when_asked(client: TestClient) -> None:
    register(client, "lean-64", 3, 64)
    x = im.images(1, 3, 64)[0].tolist()  # 12,288 numbers > ECHO_LIMIT
    body = {"inputs": [x], "budget": 64, "target": [0, 1], "parameters": {"patch_size": 16}}
    lean, lean_bytes = explain(client, "lean-64", body)
    assert lean["meta"]["cache"] == "miss"
    for e in lean["data"]["explanations"]:  # both targets of the one instance
        assert e["data"] is None
        assert e["data_digest"] == {"shape": [3, 64, 64], "size": 12288, "sha256": sha(x)}
    full, full_bytes = explain(client, "lean-64", {**body, "return_inputs": True})
    assert full["meta"]["cache"] == "miss"  # another answer: another cache entry
    for a, b in zip(lean["data"]["explanations"], full["data"]["explanations"], strict=True):
        assert b["data"] == x and "data_digest" not in b
        assert a["values"] == b["values"]  # the same explanation either way
    assert full_bytes - lean_bytes > 2 * 12288 * 8  # two echoes of about 9+ characters each
    again, _ = explain(client, "lean-64", body)
    assert again["meta"]["cache"] == "hit" and again["data"]["explanations"][0]["data"] is None
    again, _ = explain(client, "lean-64", {**body, "return_inputs": True})
    assert again["meta"]["cache"] == "hit" and again["data"]["explanations"][0]["data"] == x


def test_small_instances_are_echoed_as_sent(client: TestClient) -> None:
    register(client, "lean-32", 3, 32)  # 3x32x32 = 3,072 numbers <= ECHO_LIMIT
    assert 3 * 32 * 32 <= ECHO_LIMIT < 3 * 64 * 64
    x = im.images(1, 3, 32)[0].tolist()
    out, _ = explain(
        client, "lean-32", {"inputs": [x], "budget": 32, "parameters": {"patch_size": 8}}
    )
    e = out["data"]["explanations"][0]
    assert e["data"] == x and "data_digest" not in e
    row = [50, 1, 25.0, 90.0, 200, 100, 50, 4, 5.0, 90]
    tab, _ = explain(client, "diabetes-mlp", {"inputs": [row]})
    assert tab["data"]["explanations"][0]["data"] == row  # as sent: 50 stays 50


def test_explain_and_plot_draws_a_lean_image(client: TestClient) -> None:
    register(client, "lean-plot", 3, 64)
    x = im.images(1, 3, 64, seed=1)[0].tolist()
    body = {"inputs": [x], "budget": 32, "parameters": {"patch_size": 16}}
    r = client.post("/v2/models/lean-plot/explain/shapley/plot?format=vega-lite", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["hconcat"]) == 2  # the original beside the heatmap
    lean, _ = explain(client, "lean-plot", body)
    r = client.post("/v2/plots?format=png", json=lean)  # the answer alone has no image
    assert r.status_code == 400 and "return_inputs" in r.json()["error"]


def test_default_answer_for_a_224_image_is_under_100_kb(client: TestClient) -> None:
    register(client, "lean-224", 3, 224)
    x = im.images(1, 3, 224)[0]
    # the default players and masker at the smallest budget they take (about 15 s on one
    # quiet core: the time limit is raised so that a busy machine does not answer 504)
    body = {"inputs": [x.tolist()], "budget": 512, "timeout_ms": 600_000}
    lean, size = explain(client, "lean-224", body)
    assert size < 100_000, f"{size} bytes: {sorted(lean['meta']['parameters'])}"
    e = lean["data"]["explanations"][0]
    assert e["data"] is None and e["data_digest"]["sha256"] == sha(x)
    # the echo, asked for (four patches: exact in 16 evaluations)
    asked = {**body, "return_inputs": True, "parameters": {"patch_size": 112}}
    full, size = explain(client, "lean-224", asked)
    echo = np.asarray(full["data"]["explanations"][0]["data"], dtype=np.float32)
    np.testing.assert_array_equal(echo, x)  # JSON floats read back as the float32 sent
    assert size > 150_528 * 8
