"""Batch audits: in-process queue, restart, cancel, idempotency and 4xx (SQLite store)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.conftest import RedisServer

ROWS = [[10.0 + 0.1 * i] * 30 for i in range(40)]
AUDIT = {"model": "breast-cancer-mlp", "inputs": ROWS, "budget": 8000, "chunk_size": 7}


# Not make_client: an unstarted client per call: the tests stop an app and start another on the same
# job database (restarts); make_client's clients stay started until the module ends
def app_for(db: str, registry: ModelRegistry, model_dir: Path, **kw: Any) -> TestClient:
    settings = Settings(model_dir=model_dir, database_url=db, **{"redis_url": None, **kw})
    return TestClient(create_app(settings, registry))


def wait(client: TestClient, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            return dict(status)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {status}")


def lines(client: TestClient, job_id: str, offset: int = 0) -> list[dict[str, Any]]:
    r = client.get(f"/v2/jobs/{job_id}/results", params={"offset": offset})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


@pytest.fixture()
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


def test_audit_runs_to_completion(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    with app_for(db, registry, model_dir) as client:
        r = client.post("/v2/jobs", json=AUDIT)
        assert r.status_code == 202 and r.headers["location"] == f"/v2/jobs/{r.json()['id']}"
        status = wait(client, r.json()["id"])
        assert status["status"] == "succeeded"
        assert status["progress"]["done"] == status["progress"]["total"] == 40
        results = lines(client, status["id"])
        assert [x["index"] for x in results] == list(range(40))
        assert all(len(x["explanation"]["values"]) == 30 for x in results)
        assert [x["index"] for x in lines(client, status["id"], offset=33)] == list(range(33, 40))
        summary = status["summary"]
        assert summary["instances"] == 40 and summary["errors"] == 0
        assert len(summary["mean_abs_value"]) == 30 and len(summary["top_features"]) == 3
        assert 0 <= summary["top1_agreement"] <= 1 and summary["per_class"]
        # 80 coalitions of 30 features x 100 background rows: noise, and the summary says so.
        assert summary["warnings"]["noisy_estimate"] == 40
        boot = summary["top_features_bootstrap"]
        assert boot["resamples"] == 200 and 0 <= boot["same_top_k"] <= 1
        assert set(summary["top_features"]) <= set(boot["in_top_k"])
        # The same rows again: every instance comes from the shared cache.
        again = wait(client, client.post("/v2/jobs", json=AUDIT).json()["id"])
        assert again["summary"]["cache_hits"] == 40
        assert lines(client, again["id"])[5]["explanation"] == results[5]["explanation"]
        listed = client.get("/v2/jobs", params={"limit": 5}).json()
        assert {j["id"] for j in listed} >= {status["id"], again["id"]}


def test_idempotency_key(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    with app_for(db, registry, model_dir) as client:
        headers = {"Idempotency-Key": "audit-42"}
        first = client.post("/v2/jobs", json=AUDIT, headers=headers)
        second = client.post("/v2/jobs", json=AUDIT, headers=headers)
        assert first.json()["id"] == second.json()["id"]
        assert second.headers["idempotent-replayed"] == "true"
        wait(client, first.json()["id"])
        assert len(lines(client, first.json()["id"])) == 40  # not computed twice


def test_cancel(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    with app_for(db, registry, model_dir, job_workers=1) as client:
        big = {**AUDIT, "inputs": ROWS * 10, "chunk_size": 20, "budget": 30000}
        job_id = client.post("/v2/jobs", json=big).json()["id"]
        r = client.delete(f"/v2/jobs/{job_id}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        time.sleep(1.0)
        status = client.get(f"/v2/jobs/{job_id}").json()
        assert status["status"] == "cancelled" and status["progress"]["done"] < 400
        assert client.delete("/v2/jobs/nope").status_code == 404


def test_restart_resumes_in_process_jobs(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    big = {**AUDIT, "inputs": ROWS * 5, "chunk_size": 10, "budget": 30000}
    with app_for(db, registry, model_dir, job_workers=1) as client:
        job_id = client.post("/v2/jobs", json=big).json()["id"]
        while client.get(f"/v2/jobs/{job_id}").json()["progress"]["done"] == 0:
            time.sleep(0.05)
    # The first app is gone mid-job; a new one on the same database finishes it.
    with app_for(db, registry, model_dir) as client:
        status = wait(client, job_id)
        assert status["status"] == "succeeded"
        assert [x["index"] for x in lines(client, job_id)] == list(range(200))


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({**AUDIT, "model": "nope"}, 404, "unknown_model"),
        ({**AUDIT, "explainer": "nope"}, 404, "unknown_explainer"),
        ({**AUDIT, "inputs": [[1.0] * 3]}, 400, "invalid_input"),
        ({**AUDIT, "parameters": {"bogus": 1}}, 422, "validation_error"),
        ({**AUDIT, "inputs": []}, 422, "validation_error"),
        ({**AUDIT, "kind": "mystery"}, 422, "validation_error"),
    ],
)
def test_bad_jobs_are_4xx(
    db: str,
    registry: ModelRegistry,
    model_dir: Path,
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    with app_for(db, registry, model_dir) as client:
        r = client.post("/v2/jobs", json=body)
        assert r.status_code == status, r.text
        assert r.json()["code"] == code
        assert client.get("/v2/jobs/unknown").status_code == 404


def test_learned_baseline_job_and_ref(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    with app_for(db, registry, model_dir) as client:
        body = {
            "kind": "learn-baseline",
            "model": "diabetes-mlp",
            "parameters": {"rows": 4, "iterations": 15, "sample_num": 8, "lr": 0.1},
        }
        job_id = client.post("/v2/jobs", json=body).json()["id"]
        status = wait(client, job_id)
        assert status["status"] == "succeeded", status
        objective = status["summary"]["objective"]
        assert objective["training"][-1] < objective["training"][0]
        learned = lines(client, job_id)[0]
        lower, upper = np.array(learned["lower"]), np.array(learned["upper"])
        baseline = np.array(learned["baseline"])
        assert np.all(baseline >= lower - 1e-4) and np.all(baseline <= upper + 1e-4)
        row = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
        masker = {"type": "baseline", "ref": job_id}
        r = client.post(
            "/v2/models/diabetes-mlp/explain/shapley",
            json={"inputs": [row], "parameters": {"masker": masker}},
        )
        assert r.status_code == 200, r.text
        echoed = r.json()["meta"]["parameters"]["masker"]
        np.testing.assert_allclose(echoed["value"], baseline, rtol=1e-5)
        bad = client.post(
            "/v2/models/breast-cancer-mlp/explain/shapley",
            json={"inputs": [[1.0] * 30], "parameters": {"masker": masker}},
        )
        assert bad.status_code == 404 and bad.json()["code"] == "unknown_baseline"
        wrong = client.post("/v2/jobs", json={**body, "parameters": {"lr": -1}})
        assert wrong.status_code == 422
        image = client.post("/v2/jobs", json={**body, "model": "digits-cnn"})
        assert image.status_code == 400
        # labels: one true class per explicand, for classifiers only.
        cancer = {"kind": "learn-baseline", "model": "breast-cancer-mlp",
                  "parameters": {"rows": 3, "iterations": 3, "sample_num": 4}}  # fmt: skip
        for labels in ([0, 1], [0, 1, 2]):  # wrong count; class out of range
            bad_labels = {**cancer, "parameters": {**cancer["parameters"], "labels": labels}}
            assert client.post("/v2/jobs", json=bad_labels).status_code == 422
        on_regressor = {**body, "parameters": {**body["parameters"], "labels": [0, 0, 0, 0]}}
        assert client.post("/v2/jobs", json=on_regressor).status_code == 422
        good = {**cancer, "parameters": {**cancer["parameters"], "labels": [0, 1, 1]}}
        labelled = wait(client, client.post("/v2/jobs", json=good).json()["id"])
        assert labelled["status"] == "succeeded", labelled
        assert labelled["summary"]["target"] == "labels"


def test_upload_csv_and_jsonl(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    model = registry.get("diabetes-mlp")
    assert model.reference is not None
    header = ",".join(model.feature_names)
    csv_text = header + "\n" + "\n".join(",".join(map(str, r)) for r in model.reference[:6])
    jsonl = "\n".join(json.dumps(r.tolist()) for r in model.reference[:4])
    job = json.dumps({"model": "diabetes-mlp", "seed": 3})
    with app_for(db, registry, model_dir) as client:
        for name, content, n in [("rows.csv", csv_text, 6), ("rows.jsonl", jsonl, 4)]:
            r = client.post(
                "/v2/jobs/upload", data={"job": job}, files={"file": (name, content.encode())}
            )
            assert r.status_code == 202, r.text
            status = wait(client, r.json()["id"])
            assert status["status"] == "succeeded" and status["progress"]["total"] == n
        bad = client.post(
            "/v2/jobs/upload", data={"job": job}, files={"file": ("rows.csv", b"age,sex\n1,x\n")}
        )
        assert bad.status_code == 400
        assert (
            client.post(
                "/v2/jobs/upload", data={"job": "{nope"}, files={"file": ("r.jsonl", b"[1]")}
            ).status_code
            == 422
        )


def test_text_audit(db: str, registry: ModelRegistry, model_dir: Path) -> None:
    texts = ["the movie was terrible", "a wonderful, moving film", "boring and slow"]
    with app_for(db, registry, model_dir) as client:
        r = client.post("/v2/jobs", json={"model": "sentiment-minilm", "inputs": texts})
        assert r.status_code == 202, r.text
        status = wait(client, r.json()["id"])
        assert status["status"] == "succeeded", status
        assert sum(c["instances"] for c in status["summary"]["per_class"].values()) == 3
        players = lines(client, status["id"])[0]["explanation"]["players"]
        assert [p["text"] for p in players] == ["the", "movie", "was", "terrible"]


def test_top_k_bootstrap_tells_stable_from_noise() -> None:
    from app.jobs.runner import top_k_bootstrap

    rng = np.random.default_rng(0)
    clear = np.abs(rng.normal(size=(50, 4))) * [10.0, 1.0, 1.0, 1.0]  # feature a dominates
    out = top_k_bootstrap(clear, ["a", "b", "c", "d"], k=1)
    assert out["same_top_k"] == 1.0 and out["in_top_k"] == {"a": 1.0}
    ties = np.abs(rng.normal(size=(50, 4)))  # no feature stands out
    out = top_k_bootstrap(ties, ["a", "b", "c", "d"], k=1)
    assert out["same_top_k"] < 0.9 and len(out["in_top_k"]) >= 2
    assert sum(out["in_top_k"].values()) == pytest.approx(1.0)


def test_no_results_after_a_cancel(db: str) -> None:
    """A chunk that passed its last cancel check writes nothing once the job is cancelled."""
    from app.jobs.store import JobStore

    store = JobStore(db)
    job, _ = store.create("audit", "diabetes-mlp", {"inputs": [[0.0]] * 4}, 4, 2)
    store.mark_running(job.id)
    assert store.add_results(job.id, {0: {"x": 1}}) == 1
    store.finish(job.id, "cancelled")
    assert store.add_results(job.id, {1: {"x": 2}, 2: {"x": 3}}) == 1
    assert store.stored_indices(job.id, range(4)) == {0}


def test_audit_caches_answers_before_storing_their_results(
    db: str,
    registry: ModelRegistry,
    model_dir: Path,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker killed between the two writes must not leave stored results that no later run
    caches (a redelivered chunk skips stored instances): each result write finds its answers
    in Redis already."""
    import redis

    from app.jobs.store import JobStore

    client_redis = redis.Redis.from_url(redis_server.url)
    seen: list[tuple[int, int]] = []  # (results stored so far incl. this write, cached answers)
    stored = 0
    original = JobStore.add_results

    def add_results(self: JobStore, job_id: str, results: dict[int, Any]) -> int:
        nonlocal stored
        stored += len(results)
        seen.append((stored, len(client_redis.keys("attr:v1:*"))))
        return original(self, job_id, results)

    monkeypatch.setattr(JobStore, "add_results", add_results)
    audit = {**AUDIT, "inputs": ROWS[:24], "chunk_size": 12, "seed": 21}  # writes at 10 and 12
    cached = {"redis_url": redis_server.url, "job_queue": "inprocess"}
    with app_for(db, registry, model_dir, **cached) as client:
        first = wait(client, client.post("/v2/jobs", json=audit).json()["id"])
    assert first["status"] == "succeeded" and first["summary"]["cache_hits"] == 0
    assert len(seen) >= 4 and seen[-1][0] == 24
    assert all(answers >= results for results, answers in seen), seen


def test_audit_uses_one_cache_round_trip_per_chunk_each_way(
    db: str, registry: ModelRegistry, model_dir: Path, redis_server: RedisServer
) -> None:
    """First run: a chunk's computed answers enter Redis in one MULTI/EXEC (no lone SETs);
    re-run: one MGET per chunk and every instance a hit."""
    import redis

    def calls() -> dict[str, int]:
        stats = redis.Redis.from_url(redis_server.url).info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    audit = {**AUDIT, "inputs": ROWS[:14], "seed": 20}  # 2 chunks of 7, nothing cached
    cached = {"redis_url": redis_server.url, "job_queue": "inprocess"}
    with app_for(db, registry, model_dir, **cached) as client:
        before = calls()
        first = wait(client, client.post("/v2/jobs", json=audit).json()["id"])
        middle = calls()
        again = wait(client, client.post("/v2/jobs", json=audit).json()["id"])
        after = calls()
    assert first["status"] == "succeeded" and first["summary"]["cache_hits"] == 0
    assert again["summary"]["cache_hits"] == 14

    def delta(a: dict[str, int], b: dict[str, int], k: str) -> int:
        return b.get(k, 0) - a.get(k, 0)

    assert [delta(before, middle, k) for k in ("mget", "exec", "set", "get")] == [2, 2, 14, 0]
    assert [delta(middle, after, k) for k in ("mget", "exec", "set", "get")] == [2, 0, 0, 0]
