"""The response cache against a real Redis server: hits, bypass, outage, new versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.base import Model
from models.registry import ModelRegistry
from tests.conftest import RedisServer, free_port

BODY = {"inputs": [[50.0, 1.0, 25.0, 90.0, 180.0, 100.0, 50.0, 4.0, 4.5, 90.0]], "budget": 3000}
URL = "/v2/models/diabetes-mlp/explain/shapley"


def stable(body: dict[str, Any]) -> dict[str, Any]:
    """The payload without the per-request id and the cache flag."""
    meta = {k: v for k, v in body["meta"].items() if k != "cache"}
    return {**{k: v for k, v in body.items() if k != "id"}, "meta": meta}


def without_measured(data: dict[str, Any]) -> dict[str, Any]:
    """The data with details.auto reduced to the fit auto chose."""
    out = []
    for e in data["explanations"]:
        details = dict(e.get("details") or {})
        if "auto" in details:
            details["auto"] = details["auto"]["chosen"]
        out.append({**e, "details": details})
    return {**data, "explanations": out}


# Not make_client: an unstarted client per call: each test starts and stops apps on one Redis (a hit
# across apps, an outage); make_client's clients stay started until the module ends
def redis_app(url: str, registry: ModelRegistry, model_dir: Path) -> TestClient:
    settings = Settings(model_dir=model_dir, redis_url=url, cache_timeout_s=0.3)
    return TestClient(create_app(settings, registry))


def test_second_request_is_a_redis_hit(
    redis_server: RedisServer, registry: ModelRegistry, model_dir: Path
) -> None:
    with redis_app(redis_server.url, registry, model_dir) as client:
        first = client.post(URL, json=BODY)
        second = client.post(URL, json=BODY)
        assert first.json()["meta"]["cache"] == "miss"
        assert second.json()["meta"]["cache"] == "hit"
        assert second.headers["x-cache"] == "HIT"
        assert stable(first.json()) == stable(second.json())
        keys = redis.Redis.from_url(redis_server.url).keys("attr:v1:*")
        assert len(keys) == 1  # really stored in Redis
        bypass = client.post(URL, json=BODY, headers={"Cache-Control": "no-cache"})
        assert bypass.json()["meta"]["cache"] == "bypass"
        # Recomputed: the same values; details.auto's measured cost is this run's (the fit it
        # chose is the same: diabetes-mlp is far below gp's switch point)
        assert without_measured(bypass.json()["data"]) == without_measured(first.json()["data"])
        other_seed = client.post(URL, json={**BODY, "seed": 1})
        assert other_seed.json()["meta"]["cache"] == "miss"
        assert client.get("/v2/health/ready").json()["cache"] == {"backend": "redis", "ok": True}


def test_service_answers_with_redis_stopped(
    redis_server: RedisServer, registry: ModelRegistry, model_dir: Path
) -> None:
    with redis_app(redis_server.url, registry, model_dir) as client:
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "miss"
        redis_server.stop()
        down = client.post(URL, json=BODY)
        assert down.status_code == 200
        assert down.json()["meta"]["cache"] == "bypass"
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded" and ready.json()["cache"]["ok"] is False
        assert "explain_cache_up 0.0" in client.get("/metrics").text
        redis_server.start()  # same port: the cache works again, without a restart
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "miss"
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "hit"


def test_redis_never_reachable(registry: ModelRegistry, model_dir: Path) -> None:
    with redis_app(f"redis://127.0.0.1:{free_port()}/0", registry, model_dir) as client:
        r = client.post(URL, json=BODY)
        assert r.status_code == 200 and r.json()["meta"]["cache"] == "bypass"


def test_new_model_version_is_never_served_stale(
    redis_server: RedisServer, registry: ModelRegistry, model_dir: Path
) -> None:
    base = registry.get("diabetes-mlp")

    def user_model(scale: float) -> Model:
        import copy

        import torch

        module = copy.deepcopy(base.module)
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(scale)
        return Model(
            name="diabetes-user",
            modality="tabular",
            task="regression",
            input_shape=base.input_shape,
            feature_names=base.feature_names,
            output_names=base.output_names,
            module=module,
            background=base.background,
        )

    url = "/v2/models/diabetes-user/explain/shapley"
    with redis_app(redis_server.url, registry, model_dir) as client:
        v1 = registry.register(user_model(1.0))
        a = client.post(url, json=BODY).json()
        assert client.post(url, json=BODY).json()["meta"]["cache"] == "hit"
        v2 = registry.register(user_model(0.9))
        assert v2.version != v1.version
        b = client.post(url, json=BODY).json()
        assert b["meta"]["cache"] == "miss" and b["model_version"] == v2.version
        assert b["data"]["explanations"][0]["values"] != a["data"]["explanations"][0]["values"]


def test_a_hit_echoes_the_instance_as_this_request_sent_it(client: TestClient) -> None:
    """Rows as dicts and as lists give the same values, but each answer's `data` is its own."""
    names = client.get("/v2/models/diabetes-mlp").json()["feature_names"]
    row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
    as_list = client.post("/v2/models/diabetes-mlp/explain/shapley", json={"inputs": [row]})
    as_dict = client.post(
        "/v2/models/diabetes-mlp/explain/shapley",
        json={"inputs": [dict(zip(names, row, strict=True))]},
    )
    a, b = as_list.json()["data"]["explanations"][0], as_dict.json()["data"]["explanations"][0]
    assert a["data"] == row and b["data"] == dict(zip(names, row, strict=True))
    assert a["values"] == b["values"]
