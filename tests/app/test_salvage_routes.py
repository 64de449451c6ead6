"""Salvage over HTTP: 409 before training, a train-salvage job with progress, one-pass
explanations from the stored artifact, which survives a restart; 4xx for bad jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from models.builtin.trained import dataset_split
from models.registry import ModelRegistry
from tests.app.test_jobs import wait
from tests.app.training_jobs import app_for, assert_needs_admin, assert_refused

TINY = {"rows": 48, "surrogate_epochs": 1, "explainer_epochs": 2, "batch_size": 16, "pairs": 2}
JOB = {"kind": "train-salvage", "model": "digits-cnn", "parameters": TINY}


def image(i: int = 0) -> list[Any]:
    return list(dataset_split("digits-cnn").x_test[i].tolist())


def test_train_then_explain_in_one_pass(tmp_path: Path, registry: ModelRegistry) -> None:
    body = {"inputs": [image(0), image(1)]}
    with app_for(tmp_path, registry) as client:
        r = client.post("/v2/models/digits-cnn/explain/salvage", json=body)
        assert r.status_code == 409 and r.json()["code"] == "explainer_not_trained"
        assert '"kind": "train-salvage"' in r.json()["error"]
        r = client.post("/v2/jobs", json=JOB)
        assert r.status_code == 202
        status = wait(client, r.json()["id"], timeout=240)
        assert status["status"] == "succeeded", status
        assert status["progress"]["done"] == status["progress"]["total"] == 1 + 2 + 1
        records = [
            json.loads(x) for x in client.get(f"/v2/jobs/{status['id']}/results").text.splitlines()
        ]
        assert [r.get("phase") for r in records[:3]] == ["surrogate", "explainer", "explainer"]
        artifact = status["summary"]["artifact"]
        assert (
            records[-1]["artifact"] == artifact and status["summary"]["objective"] == "distribution"
        )

        out = client.post("/v2/models/digits-cnn/explain/salvage", json=body).json()
        assert out["meta"]["parameters"]["artifact"] == artifact
        assert out["meta"]["parameters"]["training"]["explainer_epochs"] == 2
        assert out["meta"]["n_model_evals"] == 2 and out["data"]["feature_names"][0] == "patch_0_0"
        for e in out["data"]["explanations"]:
            assert len(e["values"]) == 16 and e["approximation_error"] < 1e-4
            assert abs(sum(e["details"]["explainer_probabilities"]) - 1) < 1e-4
        # Other objectives are one request away; none is trained yet.
        r = client.post(
            "/v2/models/digits-cnn/explain/salvage",
            json={**body, "parameters": {"objective": "squared"}},
        )
        assert r.status_code == 409
        pinned = {**body, "target": 3, "parameters": {"artifact": artifact}}
        before = client.post("/v2/models/digits-cnn/explain/salvage", json=pinned).json()
        # The same configuration again reuses the stored artifact (and its history).
        again = wait(client, client.post("/v2/jobs", json=JOB).json()["id"], timeout=240)
        assert again["summary"]["artifact"] == artifact and again["progress"]["done"] == 4
    # A restarted service answers from the artifact on disk.
    with app_for(tmp_path, registry) as client:
        r = client.post("/v2/models/digits-cnn/explain/salvage", json=pinned)
        assert r.status_code == 200 and r.json()["meta"]["cache"] == "miss"
        assert r.json()["data"]["explanations"][0]["output_index"] == 3
        assert r.json()["data"] == before["data"]


@pytest.mark.parametrize(
    ("job", "status", "code"),
    [
        ({**JOB, "parameters": {"objective": "nope"}}, 422, "validation_error"),
        ({**JOB, "parameters": {"bogus": 1}}, 422, "validation_error"),
        ({**JOB, "model": "breast-cancer-mlp"}, 400, "unsupported_modality"),
        ({**JOB, "model": "nope"}, 404, "unknown_model"),
        ({**JOB, "inputs": [[1.0, 2.0]]}, 400, "invalid_input"),
    ],
)
def test_bad_training_jobs_are_4xx(
    tmp_path: Path, registry: ModelRegistry, job: dict[str, Any], status: int, code: str
) -> None:
    assert_refused(tmp_path, registry, job, status, code)


def test_training_needs_the_admin_scope(tmp_path: Path, registry: ModelRegistry) -> None:
    assert_needs_admin(tmp_path, registry, JOB)
