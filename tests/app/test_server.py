"""The real server process (python -m app) over loopback, with Redis from REDIS_URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisServer, running_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def server(redis_server: RedisServer, model_dir: Path) -> Iterator[str]:
    with running_server({"REDIS_URL": redis_server.url, "MODEL_DIR": str(model_dir)}) as url:
        yield url


def test_real_server_over_loopback(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        assert http.get("/v2/health/live").status_code == 200
        ready = http.get("/v2/health/ready").json()
        assert ready["cache"] == {"backend": "redis", "ok": True}
        body = {"inputs": [[50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]], "seed": 3}
        first = http.post("/v2/models/diabetes-mlp/explain/shapley", json=body).json()
        second = http.post("/v2/models/diabetes-mlp/explain/shapley", json=body).json()
        assert first["meta"]["cache"] == "miss" and second["meta"]["cache"] == "hit"
        assert first["meta"]["exact"] is True
        assert first["data"] == second["data"]
        bad = http.post("/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [[1, 2]]})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"
