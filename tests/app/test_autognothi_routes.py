"""AutoGnothi over HTTP: 409 before training, a train-autognothi job with progress, one-pass
word Shapley values from the stored artifact (same players as `shapley`, efficient), which
survives a restart; a review longer than any training sentence warns outside_training_range;
4xx for bad jobs; training needs the admin scope."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from models.registry import ModelRegistry
from tests.app.test_jobs import wait
from tests.app.training_jobs import app_for, assert_needs_admin, assert_refused

TINY = {"sentences": 24, "pairs": 4, "epochs": 2, "batch_size": 8, "held_out": 2}
JOB = {"kind": "train-autognothi", "model": "sentiment-minilm", "parameters": TINY}
TEXTS = ["The food was awful but the staff were very friendly.", "A lovely, quiet hotel!"]
URL = "/v2/models/sentiment-minilm/explain/autognothi"


def test_train_then_explain_in_one_pass(tmp_path: Path, registry: ModelRegistry) -> None:
    body = {"inputs": TEXTS}
    with app_for(tmp_path, registry) as client:
        r = client.post(URL, json=body)
        assert r.status_code == 409 and r.json()["code"] == "explainer_not_trained"
        assert '"kind": "train-autognothi"' in r.json()["error"]
        r = client.post("/v2/jobs", json=JOB)
        assert r.status_code == 202, r.text
        status = wait(client, r.json()["id"], timeout=300)
        assert status["status"] == "succeeded", status
        assert status["progress"]["done"] == status["progress"]["total"] == 1 + 2 + 1
        lines = client.get(f"/v2/jobs/{status['id']}/results").text.splitlines()
        records = [json.loads(x) for x in lines]
        assert [r.get("phase") for r in records[:3]] == ["targets", "side", "side"]
        artifact = status["summary"]["artifact"]
        assert records[-1]["artifact"] == artifact
        metrics = status["summary"]["metrics"]
        assert metrics["corpus"].startswith("vaderSentiment") and "held_out_pearson" in metrics

        out = client.post(URL, json=body).json()
        shap = client.post(
            "/v2/models/sentiment-minilm/explain/shapley",
            json={**body, "parameters": {"estimator": "exact"}, "budget": 1024},
        ).json()
        assert out["meta"]["parameters"]["artifact"] == artifact
        assert out["meta"]["parameters"]["training"]["epochs"] == 2
        assert out["meta"]["n_model_evals"] == len(TEXTS)  # one encoder row per text
        for ours, exact in zip(
            out["data"]["explanations"], shap["data"]["explanations"], strict=True
        ):
            assert len(ours["values"]) == len(exact["values"])
            assert ours.get("players") == exact.get("players")
            assert ours["output_index"] == exact["output_index"]
            assert ours["approximation_error"] < 1e-5
        pinned = {**body, "target": 0, "parameters": {"artifact": artifact}}
        before = client.post(URL, json=pinned).json()
        assert before["data"]["explanations"][0]["output_index"] == 0
        # The same configuration again reuses the stored artifact (and its history).
        again = wait(client, client.post("/v2/jobs", json=JOB).json()["id"], timeout=300)
        assert again["summary"]["artifact"] == artifact and again["progress"]["done"] == 4
        r = client.post(URL, json={**body, "parameters": {"artifact": "0123456789abcdef"}})
        assert r.status_code == 409
        r = client.post(URL, json={"inputs": ["..."]})
        assert r.status_code == 400, r.text
        # Three times the longest training sentence: answered, with the range warning.
        review = " ".join([TEXTS[0]] * 3)  # 30 words
        e = client.post(URL, json={"inputs": [review]}).json()["data"]["explanations"][0]
        assert len(e["values"]) == 30
        assert [w["code"] for w in e["warnings"]] == ["outside_training_range"]
        assert "30 words" in e["warnings"][0]["message"]
    # A restarted service answers from the stored artifact.
    with app_for(tmp_path, registry) as client:
        r = client.post(URL, json=pinned)
        assert r.status_code == 200 and r.json()["meta"]["cache"] == "miss"
        assert r.json()["data"] == before["data"]


@pytest.mark.parametrize(
    ("job", "status", "code"),
    [
        ({**JOB, "parameters": {"epochs": 0}}, 422, "validation_error"),
        ({**JOB, "parameters": {"bogus": 1}}, 422, "validation_error"),
        ({**JOB, "model": "breast-cancer-mlp"}, 400, "unsupported_model"),
        ({**JOB, "model": "nope"}, 404, "unknown_model"),
        ({**JOB, "inputs": ["only one"]}, 400, "invalid_input"),
        ({**JOB, "inputs": ["fine", 3]}, 400, "invalid_input"),
    ],
)
def test_bad_training_jobs_are_4xx(
    tmp_path: Path, registry: ModelRegistry, job: dict[str, Any], status: int, code: str
) -> None:
    assert_refused(tmp_path, registry, job, status, code)


def test_training_needs_the_admin_scope(tmp_path: Path, registry: ModelRegistry) -> None:
    assert_needs_admin(tmp_path, registry, JOB)
