"""Rankers and encoders over HTTP: listing, metadata, infer, RankSHAP and COCOA requests, clean
4xx for what does not apply, and batch audits of both through the real job system."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.builtin.rankers import bm25_scores
from models.builtin.trained import dataset_split
from models.registry import ModelRegistry
from tests.app.test_jobs import wait
from tests.conftest import RedisServer

QUERY = "solar electricity"
DOCS = [
    "solar panels convert sunlight into electricity",
    "the wind turbine makes electricity",
    "a recipe for bread with flour",
]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs."""


@pytest.fixture(scope="module")
def digits() -> dict[str, list[Any]]:
    split = dataset_split("digits-cnn")
    return {
        "corpus": split.x_train[split.y_train == 7][:30].tolist(),
        "foil": split.x_train[split.y_train != 7][:120].tolist(),
        "x": split.x_test[split.y_test == 7][:3].tolist(),
    }


def results(client: TestClient, job_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v2/jobs/{job_id}/results")
    assert r.status_code == 200
    return [json.loads(line) for line in r.text.splitlines()]


def test_listing_and_metadata(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v2/models").json()}
    for name, modality in [
        ("bm25", "ranker"),
        ("minilm-ranker", "ranker"),
        ("minilm-encoder", "encoder"),
        ("digits-encoder", "encoder"),
    ]:
        assert models[name]["modality"] == modality and models[name]["state"] == "ready"
    bm25 = client.get("/v2/models/bm25").json()
    assert bm25["inputs"] == [{"name": "documents", "datatype": "BYTES", "shape": [-1]}]
    assert bm25["explainers"] == ["rankshap"] and bm25["task"] == "ranking"
    enc = client.get("/v2/models/digits-encoder").json()
    assert enc["outputs"][0]["shape"] == [-1, 64] and enc["explainers"] == ["cocoa"]
    text = client.get("/v2/models/minilm-encoder").json()
    assert text["inputs"][0]["datatype"] == "BYTES" and text["outputs"][0]["shape"] == [-1, 384]
    catalog = {e["name"]: e for e in client.get("/v2/explainers").json()}
    assert catalog["rankshap"]["modalities"] == ["ranker"]
    assert catalog["cocoa"]["modalities"] == ["encoder"]
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v2/models/{model}/explain/rankshap" in paths
    assert "/v2/models/{model}/explain/cocoa" in paths


def test_infer(client: TestClient, registry: ModelRegistry) -> None:
    body = {
        "inputs": [{"name": "documents", "shape": [3], "datatype": "BYTES", "data": DOCS}],
        "parameters": {"query": QUERY},
    }
    r = client.post("/v2/models/bm25/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [3, 1]
    np.testing.assert_allclose(out["data"], bm25_scores([QUERY], [DOCS])[0], rtol=1e-6)
    no_query = client.post("/v2/models/bm25/infer", json={**body, "parameters": {}})
    assert no_query.status_code == 400 and "parameters.query" in no_query.json()["error"]
    numbers = {"inputs": [{"shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    assert client.post("/v2/models/minilm-ranker/infer", json=numbers).status_code == 400
    texts = {"inputs": [{"shape": [2], "datatype": "BYTES", "data": ["a cat", "a dog"]}]}
    r = client.post("/v2/models/minilm-encoder/infer", json=texts)
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 384]
    img = dataset_split("digits-cnn").x_test[:1]
    r = client.post(
        "/v2/models/digits-encoder/infer",
        json={
            "inputs": [{"shape": [1, 1, 8, 8], "datatype": "FP32", "data": img.ravel().tolist()}]
        },
    )
    assert r.status_code == 200
    expected = registry.get("digits-encoder").predict(img)[0]
    np.testing.assert_allclose(r.json()["outputs"][0]["data"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "explainer", "body"),
    [
        ("bm25", "shapley", {"inputs": ["a text"]}),
        ("minilm-encoder", "shapley", {"inputs": ["a text"]}),
        ("digits-encoder", "shapley", {"inputs": [[0.0] * 64]}),
        ("digits-cnn", "rankshap", {"query": "q", "documents": ["a", "b"]}),
        ("bm25", "cocoa", {"inputs": ["a"], "corpus": ["b"]}),
    ],
)
def test_explainers_that_do_not_apply_are_refused(
    client: TestClient, model: str, explainer: str, body: dict[str, Any]
) -> None:
    r = client.post(f"/v2/models/{model}/explain/{explainer}", json=body)
    assert r.status_code == 400 and r.json()["code"] == "unsupported_modality"


def test_rankshap_request(client: TestClient) -> None:
    body = {"query": QUERY, "documents": DOCS, "parameters": {"k": 2, "max_players": 6}}
    r = client.post("/v2/models/bm25/explain/rankshap", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    e = out["data"]["explanations"][0]
    assert out["data"]["feature_names"] == e["details"]["terms"]
    assert e["details"]["ranking"] == [0, 1, 2] and e["details"]["k"] == 2
    assert e["output_name"] == "ndcg@2"  # the explained scalar, not the ranker's score output
    assert e["exact"] and e["approximation_error"] < 1e-9
    assert sum(e["values"]) == pytest.approx(e["details"]["v_all"] - e["details"]["v_empty"])
    assert out["meta"]["parameters"]["k"] == 2 and out["meta"]["n_model_evals"] > 0
    assert e["details"]["fidelity"] is not None
    again = client.post("/v2/models/bm25/explain/rankshap", json=body)
    assert again.headers["x-cache"] == "HIT"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"query": QUERY, "documents": DOCS, "inputs": ["x"]}, 422),
        ({"query": QUERY, "documents": DOCS, "target": 0}, 400),
        ({"query": QUERY, "documents": DOCS, "parameters": {"absence": "mask"}}, 400),
        ({"query": "?!", "documents": DOCS, "parameters": {"players": "query"}}, 400),
        ({"query": QUERY, "documents": ["only one"]}, 422),
        ({"query": QUERY, "documents": ["d"] * 101}, 422),
        ({"query": QUERY, "documents": DOCS, "parameters": {"k": 0}}, 422),
        ({"query": QUERY, "documents": DOCS, "parameters": {"nope": 1}}, 422),
        ({"documents": DOCS}, 422),
        (
            {"query": QUERY, "documents": DOCS, "budget": 5, "parameters": {"estimator": "kernel"}},
            400,
        ),
    ],
)
def test_rankshap_bad_requests(client: TestClient, body: dict[str, Any], status: int) -> None:
    r = client.post("/v2/models/bm25/explain/rankshap", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) >= {"error", "code"}


def test_cocoa_request_and_embedding_cache(
    client: TestClient, digits: dict[str, list[Any]]
) -> None:
    body = {
        "inputs": digits["x"][:1],
        "corpus": digits["corpus"],
        "foil": digits["foil"],
        "parameters": {"patch_size": 4},
    }
    r = client.post("/v2/models/digits-encoder/explain/cocoa", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    e = out["data"]["explanations"][0]
    assert out["data"]["feature_names"] == ["patch_0_0", "patch_0_1", "patch_1_0", "patch_1_1"]
    assert e["exact"] and e["approximation_error"] < 1e-9
    assert e["instance_output_value"] == pytest.approx(e["details"]["contrastive_similarity"])
    assert e["output_name"] == "contrastive similarity"
    assert out["meta"]["foil"]["source"] == "request"
    # a new explicand with the same corpus and foil reuses their cached mean embeddings
    r2 = client.post(
        "/v2/models/digits-encoder/explain/cocoa", json={**body, "inputs": digits["x"][1:2]}
    )
    assert r2.status_code == 200
    assert r2.json()["meta"]["corpus"]["embedding_cache"] == "hit"
    assert r2.json()["meta"]["foil"]["embedding_cache"] == "hit"
    ig = client.post(
        "/v2/models/digits-encoder/explain/cocoa",
        json={**body, "parameters": {"method": "integrated_gradients", "steps": 16}},
    )
    assert ig.status_code == 200, ig.text
    assert len(ig.json()["data"]["explanations"][0]["values"]) == 64
    assert ig.json()["meta"]["additive"] is False


@pytest.mark.parametrize(
    ("model", "body", "status"),
    [
        ("digits-encoder", {"inputs": [[0.0] * 64], "corpus": [[1.0, 2.0]]}, 400),
        ("digits-encoder", {"inputs": [[0.0] * 64], "corpus": [[0.0] * 64], "foil": []}, 400),
        ("digits-encoder", {"inputs": [[0.0] * 64], "corpus": [[0.0] * 64], "target": 1}, 400),
        ("digits-encoder", {"inputs": [[0.0] * 64]}, 422),
        ("digits-encoder", {"inputs": [[0.0] * 64], "corpus": [[0.0] * 64], "foil": "all"}, 422),
        (
            "minilm-encoder",
            {
                "inputs": ["a cat"],
                "corpus": ["a dog"],
                "parameters": {"method": "integrated_gradients"},
            },
            400,
        ),
        ("minilm-encoder", {"inputs": ["a cat"], "corpus": [""]}, 400),
    ],
)
def test_cocoa_bad_requests(
    client: TestClient, model: str, body: dict[str, Any], status: int
) -> None:
    r = client.post(f"/v2/models/{model}/explain/cocoa", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) >= {"error", "code"}


def test_rankshap_and_cocoa_audits_through_the_job_system(
    client: TestClient, digits: dict[str, list[Any]]
) -> None:
    instances = [
        {"query": QUERY, "documents": DOCS},
        {"query": "bread flour", "documents": DOCS},
        {"query": "wind", "documents": ["wind", " "]},  # an empty document: an error row
    ]
    r = client.post(
        "/v2/jobs",
        json={
            "model": "bm25",
            "explainer": "rankshap",
            "inputs": instances,
            "parameters": {"k": 2, "max_players": 6},
        },
    )
    assert r.status_code == 202, r.text
    status = wait(client, r.json()["id"])
    assert status["status"] == "succeeded_with_errors" and status["summary"]["errors"] == 1
    assert status["error"].startswith("1 of 3 rows failed; first: row 2: ")
    rows = results(client, status["id"])
    assert set(rows[0]["explanation"]["details"]["terms"][:2]) == {"solar", "electricity"}
    assert set(rows[1]["explanation"]["details"]["terms"][:2]) == {"bread", "flour"}
    assert "empty" in rows[2]["error"]
    direct = client.post(
        "/v2/models/bm25/explain/rankshap",
        json={**instances[0], "parameters": {"k": 2, "max_players": 6}},
    )
    assert rows[0]["explanation"]["values"] == direct.json()["data"]["explanations"][0]["values"]

    r = client.post(
        "/v2/jobs",
        json={
            "model": "digits-encoder",
            "explainer": "cocoa",
            "inputs": digits["x"],
            "corpus": digits["corpus"],
            "foil": digits["foil"],
            "parameters": {"patch_size": 4},
        },
    )
    assert r.status_code == 202, r.text
    status = wait(client, r.json()["id"])
    assert status["status"] == "succeeded" and status["summary"]["errors"] == 0
    rows = results(client, status["id"])
    assert len(rows) == 3 and all(len(x["explanation"]["values"]) == 4 for x in rows)
    assert status["summary"]["feature_names"] == [
        "patch_0_0",
        "patch_0_1",
        "patch_1_0",
        "patch_1_1",
    ]
    bad = client.post(
        "/v2/jobs",
        json={
            "model": "digits-encoder",
            "explainer": "cocoa",
            "inputs": digits["x"],
            "foil": "auto",
        },
    )
    assert bad.status_code == 422


def test_cocoa_mean_embeddings_live_in_redis(
    registry: ModelRegistry,
    model_dir: Path,
    redis_server: RedisServer,
    digits: dict[str, list[Any]],
) -> None:
    settings = Settings(model_dir=model_dir, redis_url=redis_server.url, job_queue="inprocess")
    body = {"corpus": digits["corpus"], "foil": digits["foil"], "parameters": {"patch_size": 4}}
    # Not make_client: apps stopped and restarted on one Redis (a fresh process-level cache);
    # make_client's clients stay started until the module ends
    with TestClient(create_app(settings, registry)) as c:
        first = c.post(
            "/v2/models/digits-encoder/explain/cocoa", json={**body, "inputs": digits["x"][:1]}
        )
        assert first.status_code == 200, first.text
    keys = redis.Redis.from_url(redis_server.url).keys("cocoa:mean:*")
    assert len(keys) == 2  # the corpus mean and the foil mean
    with TestClient(create_app(settings, registry)) as c:  # a fresh process-level cache
        second = c.post(
            "/v2/models/digits-encoder/explain/cocoa", json={**body, "inputs": digits["x"][1:2]}
        )
    meta = second.json()["meta"]
    assert meta["corpus"]["embedding_cache"] == "hit" == meta["foil"]["embedding_cache"]


def test_two_apps_do_not_share_cocoa_embeddings(
    registry: ModelRegistry, model_dir: Path, digits: dict[str, list[Any]]
) -> None:
    """Each app's explainers get its own cache (the run context), not the newest app's."""
    settings = Settings(model_dir=model_dir, redis_url=None, job_queue="inprocess")
    body = {"corpus": digits["corpus"], "foil": digits["foil"], "parameters": {"patch_size": 4}}
    url = "/v2/models/digits-encoder/explain/cocoa"

    def embedding_cache(c: TestClient, row: int) -> tuple[str, str]:
        r = c.post(url, json={**body, "inputs": digits["x"][row : row + 1]})
        assert r.status_code == 200, r.text
        meta = r.json()["meta"]
        return meta["corpus"]["embedding_cache"], meta["foil"]["embedding_cache"]

    with (
        TestClient(create_app(settings, registry)) as first,
        TestClient(create_app(settings, registry)) as second,
    ):
        assert embedding_cache(first, 0) == ("miss", "miss")
        assert embedding_cache(second, 1) == ("miss", "miss")  # its own, empty cache
        assert embedding_cache(first, 2) == ("hit", "hit")
