"""RGB images of real sizes over HTTP: TorchScript and ONNX CNNs registered as users bring them
(tests/image_models.py), default patches and blur, superpixels, lean parameters, the size limit
(3x512x512) and KernelSHAP at 4,096 players."""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from explainers.games import superpixels
from explainers.options import MAX_ECHO_NUMBERS
from tests import image_models as im


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register(
    client: TestClient, name: str, channels: int, size: int, width: int = 4, status: int = 201
) -> dict[str, Any]:
    module = im.torchscript_bytes(im.rgb_cnn(channels, size, width=width))
    r = client.post(
        "/v2/repository/models",
        data=im.image_form(name, channels, size),
        files={"file": (f"{name}.pt", module)},
    )
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


def explain(
    client: TestClient, name: str, body: dict[str, Any], status: int = 200
) -> tuple[dict[str, Any], int]:
    r = client.post(f"/v2/models/{name}/explain/shapley", json=body)
    assert r.status_code == status, r.text
    return r.json(), len(r.content)


def number_lists(value: Any) -> list[int]:
    """Lengths of every list of numbers anywhere in a JSON value."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in number_lists(v)]
    if isinstance(value, list):
        own = [len(value)] if value and all(isinstance(v, int | float) for v in value) else []
        return own + [n for v in value for n in number_lists(v)]
    return []


def image(channels: int, size: int, seed: int = 0) -> list[Any]:
    rounded: list[Any] = np.round(im.images(1, channels, size, seed)[0], 4).tolist()
    return rounded


def efficient(e: dict[str, Any]) -> bool:
    gap = abs(sum(e["values"]) + e["base_value"] - e["instance_output_value"])
    return gap <= max(e["approximation_error"], 1e-5) + 1e-6


@pytest.mark.parametrize(("size", "patch", "budget"), [(64, 4, None), (224, 14, 600)])
def test_rgb_defaults_patches_and_blur(
    client: TestClient, size: int, patch: int, budget: int | None
) -> None:
    name = f"rgb-{size}"
    register(client, name, 3, size)
    body, length = explain(client, name, {"inputs": [image(3, size)], "budget": budget})
    meta, data = body["meta"], body["data"]
    params = meta["parameters"]
    assert params["patch_size"] == patch and params["players"] == "patches"
    assert params["masker"]["type"] == "blur"
    assert params["masker"]["sigma"] == pytest.approx(max(1.0, 5 * size / 224), abs=1e-5)
    assert len(data["feature_names"]) == 256 == len(data["explanations"][0]["values"])
    assert data["feature_names"][:2] == ["patch_0_0", "patch_0_1"]
    assert efficient(data["explanations"][0])
    assert max(number_lists(params), default=0) <= MAX_ECHO_NUMBERS
    assert len(json.dumps(params)) < 1_000
    if size == 224:
        assert length < 100_000  # one 3x224x224 image (the instance is not echoed whole)


def test_zero_baseline_on_request_is_echoed_as_a_digest(client: TestClient) -> None:
    register(client, "rgb-48", 3, 48)
    x = image(3, 48, seed=2)
    zeros = {"type": "baseline", "value": 0}
    body, _ = explain(
        client, "rgb-48", {"inputs": [x], "budget": 600, "parameters": {"masker": zeros}}
    )
    masker = body["meta"]["parameters"]["masker"]
    assert masker["type"] == "baseline" and masker["source"] == "request"
    assert set(masker["value"]) == {"digest", "shape"} and masker["value"]["shape"] == [6912]
    asked = {"return_baseline": True, "patch_size": 24}
    body, _ = explain(client, "rgb-48", {"inputs": [x], "parameters": asked})
    e = body["data"]["explanations"][0]
    assert e["exact"] and len(e["values"]) == 4 and efficient(e)
    from scipy.ndimage import gaussian_filter

    sigma = body["meta"]["parameters"]["masker"]["sigma"]
    want = gaussian_filter(np.asarray(x, np.float64), (0, sigma, sigma), mode="nearest")
    np.testing.assert_allclose(np.asarray(e["details"]["baseline"]), want, atol=1e-5)


def test_superpixels_over_http(client: TestClient) -> None:
    register(client, "rgb-56", 3, 56)
    x = image(3, 56, seed=3)
    ask = {"inputs": [x], "budget": 256, "parameters": {"players": "superpixels"}}
    body, _ = explain(client, "rgb-56", ask)
    e = body["data"]["explanations"][0]
    grid = superpixels.decode(e["details"]["segments"])
    n = len(e["values"])
    assert grid.shape == (56, 56)
    np.testing.assert_array_equal(np.unique(grid), np.arange(n))
    assert body["data"]["feature_names"] == [f"superpixel_{i}" for i in range(n)]
    assert body["meta"]["parameters"]["n_segments"] == 100 and efficient(e)
    again, _ = explain(client, "rgb-56", ask)
    assert again["data"]["explanations"][0]["details"]["segments"] == e["details"]["segments"]
    bad = {"inputs": [x], "parameters": {"players": "superpixels", "patch_size": 4}}
    err, _ = explain(client, "rgb-56", bad, status=400)
    assert "patch_size applies" in err["error"]


def test_an_onnx_rgb_cnn_registers_and_answers(client: TestClient) -> None:
    net = im.rgb_cnn(3, 96, width=4)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.zeros(1, 3, 96, 96),), buf,  # type: ignore[arg-type]  # a file object works
            input_names=["x"], output_names=["p"], dynamic_axes={"x": {0: "n"}, "p": {0: "n"}},
            dynamo=False,
        )  # fmt: skip
    form = {**im.image_form("rgb-onnx", 3, 96), "format": "onnx"}
    r = client.post("/v2/repository/models", data=form, files={"file": ("m.onnx", buf.getvalue())})
    assert r.status_code == 201, r.text
    x = image(3, 96, seed=4)
    body, _ = explain(client, "rgb-onnx", {"inputs": [x], "budget": 600})
    e = body["data"]["explanations"][0]
    assert body["meta"]["parameters"]["patch_size"] == 6 and len(e["values"]) == 256
    with torch.no_grad():
        want = net(torch.tensor([x], dtype=torch.float32))[0, e["output_index"]].item()
    assert e["instance_output_value"] == pytest.approx(want, abs=1e-5) and efficient(e)


def test_the_size_limit_is_3x512x512(client: TestClient) -> None:
    err = register(client, "rgb-513", 3, 513, width=2, status=400)
    assert "786,432" in err["error"] and "789,507" in err["error"]
    register(client, "rgb-512", 3, 512, width=2)
    meta = client.get("/v2/models/rgb-512").json()
    assert meta["inputs"][0]["shape"] == [-1, 3, 512, 512]
    assert meta["feature_names"] == []  # 786,432 pixel names would be 8.5 MB of metadata
    assert len(client.get("/v2/models/rgb-512").content) < 100_000


class _Pooled(torch.nn.Module):
    """A cheap 3x128x128 classifier (16 px average pooling, a linear head, softmax): the model
    calls stay a small part of a 4,096-player answer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(3 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.avg_pool2d(x, 16).flatten(1)
        return torch.softmax(self.head(pooled * 4.0), dim=1)


def test_4096_patches_answer_with_kernelshap(client: TestClient) -> None:
    """3x128x128 at patch_size 2: 4,096 players, past where C(n, s) fits a float (a 500 before
    the size weights went to log space)."""
    files = {"file": ("m.pt", im.torchscript_bytes(_Pooled().eval()))}
    r = client.post("/v2/repository/models", data=im.image_form("rgb-128", 3, 128), files=files)
    assert r.status_code == 201, r.text
    ask = {
        "inputs": [image(3, 128, seed=5)],
        "budget": 8192,
        "timeout_ms": 300_000,  # a loaded 2-core machine: the fit alone takes 10-40 s
        "parameters": {"patch_size": 2},
    }
    body, _ = explain(client, "rgb-128", ask)
    e = body["data"]["explanations"][0]
    assert len(e["values"]) == 4096 and e["estimator"] == "kernel"
    assert np.all(np.isfinite(e["values"])) and efficient(e)
