"""parameters.target_se and timeout_ms anytime answers through the explain route."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from models.base import Model
from models.registry import ModelRegistry

CANCER = "/v2/models/breast-cancer-mlp/explain/shapley"
NO_CACHE = {"Cache-Control": "no-cache"}


def _rows(registry: ModelRegistry, name: str, k: int) -> list[list[float]]:
    model = registry.get(name)
    assert model.background is not None
    return [[float(v) for v in row] for row in model.background[:k]]


@pytest.mark.parametrize("estimator", ["permutation", "kernel", "auto"])
def test_target_se_through_the_route(
    client: TestClient, registry: ModelRegistry, estimator: str
) -> None:
    body = {
        "inputs": _rows(registry, "breast-cancer-mlp", 2),
        "parameters": {"estimator": estimator, "target_se": 0.01},
        "seed": 3,
    }
    r = client.post(CANCER, json=body, headers=NO_CACHE)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta"]
    assert meta["parameters"]["target_se"] == 0.01
    each = [e["details"]["precision"] for e in out["data"]["explanations"]]
    for e, p in zip(out["data"]["explanations"], each, strict=True):
        assert p["reached"] is True and p["target_se"] == 0.01
        assert max(e["error_std"]) == pytest.approx(p["max_error_std"])
        assert p["max_error_std"] <= 0.01
        assert e["estimator"] in ("permutation", "kernel")
        if estimator != "auto":
            assert e["estimator"] == estimator
    assert meta["precision"] == {
        "target_se": 0.01,
        "reached": True,
        "max_error_std": max(p["max_error_std"] for p in each),
        "rounds": max(p["rounds"] for p in each),
    }
    assert meta["partial"] is False
    again = client.post(CANCER, json=body, headers=NO_CACHE).json()  # seeded: same answer
    assert again["data"]["explanations"][0]["values"] == out["data"]["explanations"][0]["values"]


def test_target_se_not_reached_within_the_budget(
    client: TestClient, registry: ModelRegistry
) -> None:
    body = {
        "inputs": _rows(registry, "breast-cancer-mlp", 1),
        "parameters": {"estimator": "kernel", "target_se": 1e-6},
        "budget": 20_000,
    }
    out = client.post(CANCER, json=body, headers=NO_CACHE).json()
    assert out["meta"]["precision"]["reached"] is False
    assert out["meta"]["precision"]["max_error_std"] > 1e-6
    assert out["meta"]["n_model_evals"] <= 20_000


def test_target_se_on_an_exact_answer(client: TestClient, registry: ModelRegistry) -> None:
    body = {"inputs": _rows(registry, "diabetes-mlp", 1), "parameters": {"target_se": 0.01}}
    r = client.post("/v2/models/diabetes-mlp/explain/shapley", json=body, headers=NO_CACHE)
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    assert meta["exact"] is True
    assert meta["precision"]["reached"] is True and meta["precision"]["max_error_std"] == 0.0


@pytest.mark.parametrize(
    "parameters",
    [
        {"target_se": 0},
        {"target_se": -0.1},
        {"target_se": "0.1"},
        {"target_se": 0.1, "index": "SII"},
    ],
)
def test_bad_target_se_is_a_4xx(
    client: TestClient, registry: ModelRegistry, parameters: dict[str, Any]
) -> None:
    body = {"inputs": _rows(registry, "breast-cancer-mlp", 1), "parameters": parameters}
    r = client.post(CANCER, json=body, headers=NO_CACHE)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["code"]


N = 16


class SlowMLP(torch.nn.Module):
    """A small fixed nonlinear model taking `delay` seconds per forward pass (a slow model)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(N, 8, generator=gen), requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.randn(8, 1, generator=gen), requires_grad=False)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tanh(x @ self.w1) @ self.w2  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def slow_client(
    tmp_path_factory: pytest.TempPathFactory, make_client: Callable[..., TestClient]
) -> TestClient:
    tmp = tmp_path_factory.mktemp("precision")
    registry = ModelRegistry(tmp / "models", builtins=())
    registry.register(
        Model(
            name="slow-mlp",
            modality="tabular",
            task="regression",
            input_shape=(N,),
            feature_names=tuple(f"x{i}" for i in range(N)),
            output_names=("y",),
            module=SlowMLP(0.04).eval(),
            background=np.zeros((1, N), dtype=np.float32),
            batch_size=256,
        )
    )
    return make_client(registry, model_dir=tmp / "models")


SLOW = "/v2/models/slow-mlp/explain/shapley"
ROW = [float(v) for v in np.linspace(-1.0, 1.0, N)]


@pytest.mark.parametrize("estimator", ["permutation", "kernel"])
def test_timeout_answers_with_the_anytime_estimate(slow_client: TestClient, estimator: str) -> None:
    """Each model call sleeps 40 ms: 60,000 coalitions cannot be done in 1.5 s; rounds can."""
    body = {
        "inputs": [ROW],
        "parameters": {"estimator": estimator, "masker": {"type": "baseline", "value": 0.0}},
        "budget": 60_000,
        "timeout_ms": 1500,
    }
    r = slow_client.post(SLOW, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta"]["partial"] is True and out["meta"]["cache"] == "bypass"
    e = out["data"]["explanations"][0]
    assert e["error_std"] is not None and len(e["error_std"]) == N
    assert e["estimator"] == estimator and e["exact"] is False
    assert 0 < out["meta"]["n_model_evals"] < 60_000
    assert e["approximation_error"] == pytest.approx(0.0, abs=1e-5)


def test_timeout_with_a_target_reports_both(slow_client: TestClient) -> None:
    body = {
        "inputs": [ROW],
        "parameters": {"masker": {"type": "baseline", "value": 0.0}, "target_se": 1e-6},
        "timeout_ms": 1500,
    }
    out = slow_client.post(SLOW, json=body).json()
    assert out["meta"]["partial"] is True
    assert out["meta"]["precision"]["reached"] is False


def test_timeout_before_any_round_is_a_504(slow_client: TestClient) -> None:
    body = {"inputs": [ROW], "parameters": {"estimator": "kernel"}, "timeout_ms": 1}
    r = slow_client.post(SLOW, json=body)
    assert r.status_code == 504
    assert r.json()["code"] == "timeout"
