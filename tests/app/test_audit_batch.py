"""Audits through the data plane's batch entry (app/batch.py): rows computed as one request and
cached under the key a request for each row alone has; failures that say so; inputs stored a
chunk a row; nothing lost when the SQLite job database reports itself full."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from app.batch import Rows, batchable, encode, split
from app.jobs.results import AuditResult, stored_json
from app.jobs.runner import final_status
from app.jobs.store import JobStore
from explainers.registry import get_explainer
from models.registry import ModelRegistry
from tests.app.test_jobs import app_for, lines, wait

CANCER = "breast-cancer-mlp"


@pytest.fixture()
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


def examples(client: TestClient, model: str, n: int) -> list[Any]:
    return list(client.get(f"/v2/models/{model}/examples?n={n}").json()["instances"])


def test_row_keys_are_the_keys_of_each_row_alone(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """A batch keys row i exactly as a one-instance request of row i (lists, objects, texts)."""
    with app_for(db, registry, model_dir) as client:
        svc = client.app.state.service  # type: ignore[attr-defined]
        spec = get_explainer("shapley")
        rows = examples(client, "diabetes-mlp", 4)
        names = client.get("/v2/models/diabetes-mlp").json()["feature_names"]
        rows[1] = dict(zip(names, rows[1], strict=True))  # an object row: another echo, key
        for model, instances in (
            ("diabetes-mlp", rows),
            ("sentiment-minilm", ["good", "a bad plot"]),
        ):
            batch = Rows(svc, model, spec, {"seed": 3, "budget": 64})
            keys = batch.prepare(instances).row_keys()
            alone = [  # as the synchronous route prepares a request of that row alone
                svc.prepare(model, "shapley", batch.body([x]), use_cache=True, lookup=False).key
                for x in instances
            ]
            assert keys == alone and len(set(keys)) == len(instances)
        # a text batch without a budget is not computed together: the default budget fits the
        # longest text, so a short text's answer would depend on the texts beside it
        texts = ["good", "a long and winding plot that never seems to end at all, sadly"]
        for fields, together in (({"budget": 64}, True), ({}, False)):
            p = Rows(svc, "sentiment-minilm", spec, fields).prepare(texts)
            assert batchable(p) is together, fields
        assert batchable(Rows(svc, "diabetes-mlp", spec, {}).prepare(rows))
        # each row's cache entry is the bytes its answer's own to_json gives, made of the
        # explanations' JSON encoded once
        p = Rows(svc, "diabetes-mlp", spec, {"seed": 3}).prepare(rows)
        for answer in split(svc.compute(p, encode=False).response, len(rows)):
            blob, texts = encode(answer)
            meta = answer.meta.model_copy(update={"cache": "miss"})
            assert blob == answer.model_copy(update={"meta": meta}).to_json()
            assert [json.loads(t) for t in texts] == json.loads(blob)["data"]["explanations"]
            # the stored result made of them is AuditResult.stored's object
            stored = AuditResult.of_answer(answer, "miss").stored()
            assert json.loads(stored_json(answer, "miss", texts)) == stored


def test_audit_rows_are_the_synchronous_answers_and_share_the_cache(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """An audit's rows equal synchronous requests of each row; the audit caches each row under
    its own key (a later request of one row is a hit), and a re-run audit is all hits."""
    with app_for(db, registry, model_dir) as client:
        rows = examples(client, CANCER, 12)
        body = {"model": CANCER, "inputs": rows, "budget": 8000, "chunk_size": 5}
        job = wait(client, client.post("/v2/jobs", json=body).json()["id"])
        assert job["status"] == "succeeded" and job["progress"]["done"] == 12
        stored = lines(client, job["id"])
        assert [r["index"] for r in stored] == list(range(12))
        for i in (0, 7, 11):
            r = client.post(
                f"/v2/models/{CANCER}/explain/shapley", json={"inputs": [rows[i]], "budget": 8000}
            )
            assert r.headers["x-cache"] == "HIT", i
            alone = r.json()["data"]["explanations"][0]
            got = stored[i]["explanation"]
            np.testing.assert_allclose(got["values"], alone["values"], rtol=1e-12)
            assert got["output_index"] == alone["output_index"] == 1  # the one default target
            assert r.json()["meta"]["n_instances"] == 1
        # computed afresh alone (no cache): the same values as the batch gave
        fresh = client.post(
            f"/v2/models/{CANCER}/explain/shapley",
            json={"inputs": [rows[3]], "budget": 8000},
            headers={"cache-control": "no-cache"},
        ).json()["data"]["explanations"][0]
        np.testing.assert_allclose(stored[3]["explanation"]["values"], fresh["values"], rtol=1e-9)
        again = wait(client, client.post("/v2/jobs", json=body).json()["id"])
        assert again["summary"]["cache_hits"] == 12
        assert {r["cache"] for r in lines(client, again["id"])} == {"hit"}


def test_a_synchronous_request_of_many_rows_shares_the_row_cache(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """A synchronous request of several rows goes through the batch entry: each row is looked
    up and cached under its one-row key, so a request that repeats some rows computes only the
    others, and its answer equals the rows computed together afresh."""
    with app_for(db, registry, model_dir) as client:
        url = f"/v2/models/{CANCER}/explain/shapley"
        rows = examples(client, CANCER, 6)
        svc = client.app.state.service  # type: ignore[attr-defined]
        spent = svc.metrics.model_evals.labels(CANCER, "shapley")
        first = client.post(url, json={"inputs": rows[:4], "budget": 8000})
        assert first.headers["x-cache"] == "MISS" and first.json()["meta"]["cache"] == "miss"
        one = client.post(url, json={"inputs": [rows[2]], "budget": 8000})
        assert one.headers["x-cache"] == "HIT"  # cached by the 4-row request, as its own row
        before = spent._value.get()
        mixed = client.post(url, json={"inputs": rows[2:6], "budget": 8000}).json()
        assert mixed["meta"]["cache"] == "miss" and mixed["meta"]["n_instances"] == 4
        news = mixed["data"]["explanations"][2:]  # only rows 4 and 5 were computed
        assert spent._value.get() - before == sum(e["n_model_evals"] for e in news) > 0
        fresh = client.post(
            url,
            json={"inputs": rows[2:6], "budget": 8000},
            headers={"cache-control": "no-cache"},
        ).json()
        assert fresh["meta"]["cache"] == "bypass"
        for got, want in zip(
            mixed["data"]["explanations"], fresh["data"]["explanations"], strict=True
        ):
            np.testing.assert_allclose(got["values"], want["values"], rtol=1e-9)
            assert got["output_index"] == want["output_index"] == 1
        assert mixed["meta"]["n_model_evals"] == fresh["meta"]["n_model_evals"]
        assert [e["values"] for e in mixed["data"]["explanations"][:2]] == [
            e["values"] for e in first.json()["data"]["explanations"][2:]
        ]  # rows 2 and 3 came from the cache: the first request's own answers
        again = client.post(url, json={"inputs": rows[:6], "budget": 8000})
        assert again.headers["x-cache"] == "HIT" and again.json()["meta"]["n_instances"] == 6
        assert again.json()["meta"]["cache"] == "hit"


def test_a_budget_below_the_minimum_is_refused_at_submission(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """docs/client.md's old example: every row would fail alike; 400 naming the budget, no job."""
    with app_for(db, registry, model_dir) as client:
        rows = examples(client, CANCER, 20)
        r = client.post("/v2/jobs", json={"model": CANCER, "inputs": rows, "budget": 4000})
        assert r.status_code == 400 and r.json()["code"] == "budget_too_small", r.text
        assert "6000" in r.json()["error"]
        assert client.get("/v2/jobs").json() == []


def test_some_rows_failing_end_succeeded_with_errors(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """Digits with pixels outside the model's 0-1 range fail alone; the others are answered in
    one batch. The job says how many failed and quotes the first."""
    with app_for(db, registry, model_dir) as client:
        digits = examples(client, "digits-cnn", 4)
        bad = (np.asarray(digits[1]) * 16).tolist()  # on the 0-16 scale
        body = {"model": "digits-cnn", "inputs": [digits[0], bad, digits[2], bad], "budget": 256}
        job = wait(client, client.post("/v2/jobs", json=body).json()["id"])
        assert job["status"] == "succeeded_with_errors", job
        assert job["error"].startswith("2 of 4 rows failed; first: row 1: ")
        assert "input_out_of_range" in job["error"]
        summary = job["summary"]
        assert summary["errors"] == 2 and summary["instances"] == 4
        assert [e["index"] for e in summary["first_errors"]] == [1, 3]
        got = lines(client, job["id"])
        assert [("explanation" in r, r.get("code")) for r in got] == [
            (True, None),
            (False, "input_out_of_range"),
            (True, None),
            (False, "input_out_of_range"),
        ]
        assert job["progress"]["done"] == 4


def test_final_status_from_the_rows_that_failed() -> None:
    first = [{"index": 0, "code": "non_finite_output", "error": "NaN"}]
    assert final_status({"errors": 0}, 3) == ("succeeded", None)
    assert final_status({"errors": 3, "first_errors": first}, 3) == (
        "failed",
        "all 3 rows failed; first: row 0: NaN (non_finite_output)",
    )
    status, error = final_status({"errors": 1, "first_errors": first}, 3)
    assert status == "succeeded_with_errors" and error is not None and error.startswith("1 of 3")


def test_inputs_are_stored_a_chunk_a_row_and_old_jobs_still_run(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    """The job's request holds no instances (a status read parses none); each chunk reads its
    own; a job stored the old way (instances in the request) still runs."""
    with app_for(db, registry, model_dir) as client:
        rows = examples(client, "diabetes-mlp", 11)
        job_id = client.post(
            "/v2/jobs", json={"model": "diabetes-mlp", "inputs": rows, "chunk_size": 4}
        ).json()["id"]
        wait(client, job_id)
        store: JobStore = client.app.state.jobs  # type: ignore[attr-defined]
        job = store.get(job_id)
        assert job is not None and "inputs" not in job.request
        assert store.inputs(job, range(4, 8)) == {i: rows[i] for i in range(4, 8)}
        assert store.inputs(job, range(8, 11)) == {i: rows[i] for i in range(8, 11)}
        assert store.status(job_id) == "succeeded"
        old, _ = store.create("audit", "diabetes-mlp", {**job.request, "inputs": rows[:5]}, 5, 2)
        queue = client.app.state.queue  # type: ignore[attr-defined]
        for chunk in range(old.n_chunks):
            queue.submit(old.id, chunk)
        done = wait(client, old.id)
        assert done["status"] == "succeeded" and done["progress"]["done"] == 5
        new_values = [r["explanation"]["values"] for r in lines(client, job_id)[:5]]
        old_values = [r["explanation"]["values"] for r in lines(client, old.id)]
        np.testing.assert_allclose(old_values, new_values, rtol=1e-12)


def test_a_full_job_database_loses_nothing(
    tmp_path: Path, registry: ModelRegistry, model_dir: Path
) -> None:
    """SQLite reports itself full (PRAGMA max_page_count, SQLITE_FULL): POST /v2/jobs answers
    503; a running audit's writes wait and retry (not chunk failures); once space returns the
    job finishes with every row stored exactly once and progress equal to what is stored."""
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    pages: list[int] = [1_000_000]
    with app_for(db, registry, model_dir, job_store_retry_s=0.5) as client:
        store: JobStore = client.app.state.jobs  # type: ignore[attr-defined]

        @event.listens_for(store.engine, "connect")
        def limit(dbapi: Any, _: Any) -> None:
            dbapi.execute(f"PRAGMA max_page_count = {pages[0]}")

        def resize(n: int) -> None:
            pages[0] = n
            store.engine.dispose()  # new connections: the new limit

        rows = examples(client, "diabetes-mlp", 30)
        with store.engine.connect() as conn:
            used = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0)
        resize(used)
        r = client.post("/v2/jobs", json={"model": "diabetes-mlp", "inputs": rows * 40})
        assert r.status_code == 503 and r.json()["code"] == "job_store_unavailable", r.text
        resize(used + 12)  # room for the job and some results, not all of them
        job_id = client.post(
            "/v2/jobs", json={"model": "diabetes-mlp", "inputs": rows * 4, "chunk_size": 20}
        ).json()["id"]
        time.sleep(3)  # the chunks run; their writes fail and are retried meanwhile
        status = client.get(f"/v2/jobs/{job_id}").json()
        assert status["status"] in ("queued", "running"), status
        assert status["progress"]["done"] < 120
        resize(1_000_000)
        done = wait(client, job_id)
        assert done["status"] == "succeeded", done
        got = lines(client, job_id)
        assert [r["index"] for r in got] == list(range(120))
        assert done["progress"]["done"] == 120
        assert json.dumps(got[0]).startswith('{"index": 0')


def upload(client: TestClient, job: dict[str, Any], name: str, data: bytes) -> Any:  # the response
    return client.post(
        "/v2/jobs/upload", data={"job": json.dumps(job)}, files={"file": (name, data)}
    )


def test_uploads_in_every_format_read_a_chunk_at_a_time(
    db: str, registry: ModelRegistry, model_dir: Path, tmp_path: Path
) -> None:
    """JSON lines over the inline body limit, CSV and Parquet give the same audit; each chunk's
    instances are stored as they are read."""
    import pandas as pd

    with app_for(db, registry, model_dir, max_body_bytes=64_000) as client:
        names = client.get("/v2/models/diabetes-mlp").json()["feature_names"]
        rows = examples(client, "diabetes-mlp", 40)
        many = rows * 60  # 2,400 rows: about 200 kB of JSON, over the 64 kB body limit
        frame = pd.DataFrame(many, columns=names)
        inline = client.post("/v2/jobs", json={"model": "diabetes-mlp", "inputs": many})
        assert inline.status_code == 413
        parquet = tmp_path / "rows.parquet"
        frame.to_parquet(parquet)
        sent = {
            "rows.jsonl": "".join(json.dumps(r) + "\n" for r in many).encode(),
            "rows.csv": frame.to_csv(index=False).encode(),
            "rows.parquet": parquet.read_bytes(),
        }
        job = {"model": "diabetes-mlp", "chunk_size": 500}
        values = {}
        for name, data in sent.items():
            r = upload(client, job, name, data)
            assert r.status_code == 202, r.text
            done = wait(client, r.json()["id"])
            assert done["status"] == "succeeded" and done["progress"]["done"] == 2400, done
            got = lines(client, done["id"])
            assert [x["index"] for x in got] == list(range(2400))
            values[name] = np.array([x["explanation"]["values"] for x in got])
        np.testing.assert_allclose(values["rows.csv"], values["rows.jsonl"], rtol=1e-6)
        np.testing.assert_allclose(values["rows.parquet"], values["rows.jsonl"], rtol=1e-6)
        np.testing.assert_allclose(values["rows.jsonl"][40:80], values["rows.jsonl"][:40])


def test_bad_uploads_are_refused_and_leave_nothing(
    db: str, registry: ModelRegistry, model_dir: Path
) -> None:
    with app_for(db, registry, model_dir) as client:
        rows = examples(client, "diabetes-mlp", 10)
        job = {"model": "diabetes-mlp", "chunk_size": 4}
        binary = upload(client, job, "rows.bin", bytes(range(256)) * 64)
        assert binary.status_code == 400 and binary.json()["code"] == "unsupported_upload"
        fake = upload(client, job, "rows.parquet", b"not parquet")
        assert fake.status_code == 400
        bad = [*rows[:9], [1.0, "x"]]  # the tenth instance, in the third chunk
        r = upload(client, job, "rows.jsonl", "".join(json.dumps(x) + "\n" for x in bad).encode())
        assert r.status_code == 400 and r.json()["error"].startswith("instances 8-9: "), r.text
        broken = upload(client, job, "rows.jsonl", b'[1, 2]\n{"a": \n')
        assert broken.status_code == 400 and "line 2" in broken.json()["error"]
        assert client.get("/v2/jobs").json() == []  # nothing kept
        empty = upload(client, job, "rows.jsonl", b"\n\n")
        assert empty.status_code == 400
