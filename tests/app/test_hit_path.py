"""The cache-hit path: stored bytes answered with the request's id spliced in, the lean Redis
GET (db selection, a restarted server, an outage), recent hits kept in the process, the
remembered keys of repeated bodies, and the batched look-ups audits use."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from app.cache import CacheUnavailable, LeanGet, LocalHits, MemoryCache, RedisCache, hit_answer
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.conftest import RedisServer, free_port

BODY = {"inputs": [[50.0, 1.0, 25.0, 90.0, 180.0, 100.0, 50.0, 4.0, 4.5, 90.0]], "budget": 3000}
URL = "/v2/models/diabetes-mlp/explain/shapley"


def test_hit_answer_splices_id_and_flag_into_the_stored_bytes() -> None:
    stored = {
        "model_name": 'odd "id": "" name',  # escaped inside the string: never a match
        "model_version": "v1",
        "id": "",
        "meta": {"explainer": "shapley", "seed": 0, "cache": "miss", "parameters": {"id": ""}},
        "data": {"note": '"cache": "miss"'},
    }
    blob = json.dumps(stored).encode()
    out = json.loads(hit_answer(blob, 'req "1"') or b"")
    assert out["id"] == 'req "1"' and out["meta"]["cache"] == "hit"
    assert out["model_name"] == stored["model_name"] and out["data"] == stored["data"]
    assert out["meta"]["parameters"] == {"id": ""}
    assert hit_answer(json.dumps({"id": ""}).encode(), "x") is None  # other layouts: decoded


def test_local_hits_expire_and_stay_bounded() -> None:
    hits = LocalHits(entries=2, ttl_s=0.2)
    hits.put("a", b"1")
    hits.put("b", b"2")
    hits.put("c", b"3")
    assert hits.get("a") is None and hits.get("c") == b"3"  # oldest out
    time.sleep(0.25)
    assert hits.get("c") is None  # expired
    assert LocalHits(entries=0, ttl_s=1).get("a") is None
    off = LocalHits(entries=0, ttl_s=1)
    off.put("a", b"1")
    assert off.get("a") is None


def test_lean_get_selects_the_db_and_survives_a_restart(redis_server: RedisServer) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).set("k", b"v" * 5000)
    getter = LeanGet(url, timeout_s=0.5)

    async def run() -> None:
        assert await getter.get("k") == b"v" * 5000
        assert await getter.get("missing") is None
        assert len(getter._idle) == 1  # one connection, reused
        redis_server.stop()
        with pytest.raises((CacheUnavailable, OSError)):
            await getter.get("k")
        redis_server.start()  # empty again (no persistence): a fresh connection answers
        redis.Redis.from_url(url).set("k", b"w")
        assert await getter.get("k") == b"w"

    asyncio.run(run())


def test_aget_of_an_unreachable_redis_is_unavailable() -> None:
    cache = RedisCache(f"redis://127.0.0.1:{free_port()}/1", 60, 0.2)
    with pytest.raises(CacheUnavailable):
        asyncio.run(cache.aget("k"))
    assert cache.last_error


def test_get_many_and_set_many(redis_server: RedisServer) -> None:
    for cache in (RedisCache(redis_server.url, 60, 0.5), MemoryCache(10)):
        cache.set_many({"a": "1", "b": "2"})
        assert cache.get_many(["a", "x", "b"]) == ["1", None, "2"]
        assert cache.get_many([]) == []
    assert 0 < redis.Redis.from_url(redis_server.url).ttl("a") <= 60


def test_repeated_bodies_hit_with_their_own_ids(
    redis_server: RedisServer, registry: ModelRegistry, model_dir: Path
) -> None:
    # Not make_client: an app per test on the test's own Redis server (stopped at the test's
    # end, the app with it); make_client's clients stay started until the module ends
    settings = Settings(model_dir=model_dir, redis_url=redis_server.url, cache_local_entries=0)
    with TestClient(create_app(settings, registry)) as client:
        first = client.post(URL, json=BODY, headers={"X-Request-ID": "one"})
        assert first.json()["meta"]["cache"] == "miss" and first.json()["id"] == "one"
        for rid in ("two", "three"):
            r = client.post(URL, json=BODY, headers={"X-Request-ID": rid})
            assert r.headers["x-cache"] == "HIT" and r.headers["x-request-id"] == rid
            assert r.json()["id"] == rid and r.json()["meta"]["cache"] == "hit"
            assert r.json()["data"] == first.json()["data"]
        r = client.post(URL, json={**BODY, "id": "mine"})
        assert r.json()["id"] == "mine" and r.json()["meta"]["cache"] == "hit"
        # the remembered key answers a miss once the entry is gone: computed again, stored
        redis.Redis.from_url(redis_server.url).flushdb()
        r = client.post(URL, json=BODY, headers={"X-Request-ID": "four"})
        assert r.json()["meta"]["cache"] == "miss" and r.json()["id"] == "four"
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "hit"
        # invalid bodies are still refused, remembered or not
        assert client.post(URL, json={**BODY, "budget": -1}).status_code == 422
        metrics = client.get("/metrics").text
        assert 'explain_cache_requests_total{result="hit"} 4.0' in metrics
        assert 'explain_cache_requests_total{result="miss"} 2.0' in metrics


def test_local_hits_answer_while_redis_is_down(
    redis_server: RedisServer, registry: ModelRegistry, model_dir: Path
) -> None:
    settings = Settings(
        model_dir=model_dir,
        redis_url=redis_server.url,
        cache_timeout_s=0.3,
        cache_local_entries=16,
    )
    with TestClient(create_app(settings, registry)) as client:
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "miss"
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "hit"  # from Redis
        redis_server.stop()
        assert client.post(URL, json=BODY).json()["meta"]["cache"] == "hit"  # kept locally
        other = client.post(URL, json={**BODY, "seed": 5})
        assert other.status_code == 200 and other.json()["meta"]["cache"] == "bypass"
