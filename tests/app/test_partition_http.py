"""Owen values over HTTP: `estimator: "partition"` on digits-cnn's patches."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from explainers.estimators.partition import exact_cost
from explainers.games.hierarchy import sequence
from models.registry import ModelRegistry
from tests.explainers.test_partition import owen_by_orders

URL = "/v2/models/digits-cnn/explain/shapley"


def post(client: TestClient, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post(URL, json=body, headers={"Cache-Control": "no-cache"})
    assert r.status_code == status, r.text
    return dict(r.json())


def test_partition_answers_exact_owen_values(client: TestClient, registry: ModelRegistry) -> None:
    """4 patches of 4x4 (a 2x2 grid: the spatial tree and sequence(4) are both ((0,1),(2,3))),
    zero baseline: equal to Owen values by enumeration of the same game through the model."""
    model = registry.get("digits-cnn")
    image = np.asarray(model.background[5], dtype=np.float32)  # type: ignore[index]
    body = post(
        client,
        {"inputs": [image.tolist()], "parameters": {"estimator": "partition", "patch_size": 4}},
    )
    (e,) = body["data"]["explanations"]
    assert e["estimator"] == "partition"
    assert body["meta"]["parameters"]["estimator"] == "partition"
    assert e["exact"] and e["error_std"] is None and e["warnings"] == []
    assert e["n_model_evals"] == exact_cost(sequence(4)) == 12
    assert e["approximation_error"] < 1e-5

    def game(masks: np.ndarray) -> np.ndarray:
        keep = masks.reshape(-1, 2, 1, 2, 1).repeat(4, axis=2).repeat(4, axis=4)  # patch grid
        rows = np.where(keep.reshape(-1, 1, 8, 8), image[None], np.float32(0))
        return model.predict(rows.astype(np.float32)).astype(np.float64)

    truth = owen_by_orders(game, 4, ((0, 1), (2, 3)))[:, e["output_index"]]
    np.testing.assert_allclose(e["values"], truth, atol=1e-5)


def test_partition_default_patches_and_a_truncating_budget(
    client: TestClient, registry: ModelRegistry
) -> None:
    image = registry.get("digits-cnn").background[0].tolist()  # type: ignore[index]
    whole = post(client, {"inputs": [image], "parameters": {"estimator": "partition"}})
    (e,) = whole["data"]["explanations"]
    n = len(e["values"])
    assert e["exact"] and e["n_model_evals"] == exact_cost(sequence(n))  # any balanced tree
    assert e["approximation_error"] < 1e-5
    short = post(
        client, {"inputs": [image], "budget": 20, "parameters": {"estimator": "partition"}}
    )
    (s,) = short["data"]["explanations"]
    assert not s["exact"] and s["n_model_evals"] <= 20 and s["error_std"] is None
    assert [w["code"] for w in s["warnings"]] == ["partition_truncated"]
    assert s["approximation_error"] < 1e-5  # still efficient


def test_partition_refusals_are_4xx(client: TestClient, registry: ModelRegistry) -> None:
    image = registry.get("digits-cnn").background[0].tolist()  # type: ignore[index]
    target = post(
        client,
        {"inputs": [image], "parameters": {"estimator": "partition", "target_se": 0.01}},
        400,
    )
    assert "target_se" in target["error"]
    small = client.post(
        URL, json={"inputs": [image], "budget": 3, "parameters": {"estimator": "partition"}}
    )
    assert 400 <= small.status_code < 500, small.text
    interactions = client.post(
        URL, json={"inputs": [image], "parameters": {"estimator": "partition", "index": "SII"}}
    )
    assert 400 <= interactions.status_code < 500, interactions.text
