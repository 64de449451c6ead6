"""Limits: timeout_ms (504 or a partial anytime estimate), queue bound (503), rate limit (429)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas import request_model
from app.service import Prepared
from app.settings import Settings
from explainers.estimators.permutation import permutation
from explainers.games import DeadlineExceeded, GameRecorder, deadline
from explainers.registry import get_explainer
from models.base import Model
from models.catalog import BuiltinModel
from models.registry import ModelRegistry

N = 12
WEIGHTS = np.linspace(-1.0, 1.0, N).astype(np.float32)


class SlowLinear(torch.nn.Module):
    """A linear model that takes `delay` seconds per forward pass (a slow real model)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(N, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(WEIGHTS)[None, :])
            self.linear.bias.zero_()
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.linear(x)  # type: ignore[no-any-return]


def slow_model(delay: float = 0.05) -> Model:
    names = tuple(f"x{i}" for i in range(N))
    return Model(
        name="slow-linear",
        modality="tabular",
        task="regression",
        input_shape=(N,),
        feature_names=names,
        output_names=("y",),
        module=SlowLinear(delay).eval(),
        background=np.zeros((1, N), dtype=np.float32),
        batch_size=64,
    )


def _slow_game(delay: float) -> object:
    def game(masks: np.ndarray) -> np.ndarray:
        time.sleep(delay)
        return masks.astype(np.float64) @ WEIGHTS.astype(np.float64)

    return game


def test_permutation_returns_the_anytime_estimate_at_the_deadline() -> None:
    recorder = GameRecorder(_slow_game(0.05), N, budget=4000)  # type: ignore[arg-type]
    with deadline(time.monotonic() + 0.12):
        est = permutation(recorder, np.random.default_rng(0))
    assert est.partial
    full = GameRecorder(_slow_game(0.0), N, budget=4000)  # type: ignore[arg-type]
    complete = permutation(full, np.random.default_rng(0))
    assert not complete.partial
    assert 0 < est.n_coalitions < complete.n_coalitions
    # A linear game: every permutation gives the exact values, so the partial one is exact too.
    np.testing.assert_allclose(est.values, WEIGHTS, atol=1e-6)


def test_expired_deadline_before_any_round_raises() -> None:
    recorder = GameRecorder(_slow_game(0.0), N, budget=4000)  # type: ignore[arg-type]
    with deadline(time.monotonic() - 1), pytest.raises(DeadlineExceeded):
        permutation(recorder, np.random.default_rng(0))


# Not make_client: an unstarted client per call with its own slow model, started and stopped inside
# a test (pending-explain and rate-limit state per app); make_client's clients stay started until
# the module ends
def _app(model_dir: Path, tmp: Path, **settings: object) -> TestClient:
    registry = ModelRegistry(model_dir, builtins=(BuiltinModel("diabetes-mlp", "tabular", _dm),))
    registry.register(slow_model())
    base = Settings(
        model_dir=model_dir,
        redis_url=None,
        database_url=f"sqlite:///{tmp / 'jobs.db'}",
        user_model_dir=tmp / "u",
        load_models_on_start=False,
    )
    return TestClient(create_app(base.model_copy(update=settings), registry))


def _dm(cache_dir: Path) -> Model:
    from models.builtin.trained import load_diabetes_mlp

    return load_diabetes_mlp(cache_dir)


@pytest.fixture(scope="module")
def client(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with _app(model_dir, tmp_path_factory.mktemp("limits")) as c:
        yield c


ROW = [float(v) for v in np.linspace(0.5, 1.5, N)]
SLOW = {"inputs": [ROW], "parameters": {"estimator": "permutation", "masker": {"type": "baseline",
        "value": 0.0}}, "budget": 3000}  # fmt: skip


def test_partial_answer_is_marked_and_never_cached(client: TestClient) -> None:
    svc = client.app.state.service  # type: ignore[attr-defined]
    req = request_model(get_explainer("shapley"))(**SLOW, timeout_ms=150)
    prepared = svc.prepare("slow-linear", "shapley", req, True)
    assert isinstance(prepared, Prepared) and prepared.deadline is not None
    out = svc.compute(prepared).response  # typed (app/schemas.py ExplainResponse)
    assert out.meta.partial is True
    assert out.meta.cache == "bypass"
    assert out.meta.n_model_evals < 3000
    np.testing.assert_allclose(out.data.explanations[0].values, WEIGHTS * np.array(ROW), atol=1e-5)
    again = svc.prepare("slow-linear", "shapley", req, True)
    assert isinstance(again, Prepared)  # the partial answer was not stored


def test_complete_answer_within_the_limit(client: TestClient) -> None:
    fast = {**SLOW, "budget": 200, "timeout_ms": 600_000}
    r = client.post("/v2/models/slow-linear/explain/shapley", json=fast)
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["partial"] is False
    assert r.json()["meta"]["cache"] == "miss"


def test_timeout_answers_504_when_nothing_is_ready(client: TestClient) -> None:
    body = {**SLOW, "parameters": {"estimator": "kernel"}, "timeout_ms": 1}
    r = client.post("/v2/models/slow-linear/explain/shapley", json=body)
    assert r.status_code == 504
    assert r.json()["code"] == "timeout"
    assert client.get("/v2/health/live").status_code == 200


def test_queue_bound_answers_503_with_retry_after(model_dir: Path, tmp_path: Path) -> None:
    with _app(model_dir, tmp_path, max_pending_explains=1) as c:
        state = c.app.state  # type: ignore[attr-defined]
        slow = threading.Thread(
            target=c.post,
            args=("/v2/models/slow-linear/explain/shapley",),
            kwargs={"json": SLOW, "headers": {"Cache-Control": "no-cache"}},
        )
        slow.start()  # about 2 s of model time: 47 forward passes of 0.05 s
        for _ in range(200):
            if state.pending_explains == 1:
                break
            time.sleep(0.01)
        assert state.pending_explains == 1
        r = c.post("/v2/models/slow-linear/explain/shapley", json={**SLOW, "budget": 200})
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "1"
        assert r.json()["code"] == "overloaded"
        slow.join()
        assert state.pending_explains == 0
        r = c.post("/v2/models/slow-linear/explain/shapley", json={**SLOW, "budget": 200})
        assert r.status_code == 200


def test_rate_limit_per_key(model_dir: Path, tmp_path: Path) -> None:
    with _app(model_dir, tmp_path, rate_limit="3/minute") as c:
        codes = [c.get("/v2/models").status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = c.get("/v2/models")
        assert r.json()["code"] == "rate_limited"
        assert int(r.headers["Retry-After"]) >= 1
        assert c.get("/v2/health/ready").status_code in (200, 503)  # health is never limited


class Overflowing(torch.nn.Module):
    """A real model whose output is infinite for large inputs (float32 overflow)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.sum(dim=1, keepdim=True) * 1e38) * 1e38


def test_non_finite_model_output_is_a_400_not_a_500(model_dir: Path, tmp_path: Path) -> None:
    with _app(model_dir, tmp_path) as c:
        registry = c.app.state.service.registry  # type: ignore[attr-defined]
        names = tuple(f"x{i}" for i in range(N))
        registry.register(
            Model(
                name="overflowing",
                modality="tabular",
                task="regression",
                input_shape=(N,),
                feature_names=names,
                output_names=("y",),
                module=Overflowing().eval(),
                background=np.zeros((1, N), dtype=np.float32),
            )
        )
        r = c.post("/v2/models/overflowing/explain/shapley", json={"inputs": [ROW]})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "non_finite_output"
