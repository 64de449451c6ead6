"""The service hands its callers a typed answer (app/schemas.py ExplainResponse) and HTTP gets
its JSON, made once: a computed answer and its cache hit are the same bytes apart from the id
and meta.cache, in the key order API.md shows, and both validate against the declared schema."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from app.schemas import ExplainResponse, request_model
from app.service import ExplainService
from explainers.registry import get_explainer

ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
EXPLANATION_KEYS = [
    "output_index", "output_name", "data", "values", "base_value", "instance_output_value",
    "approximation_error", "error_std", "interactions", "players", "details", "warnings",
    "exact", "estimator", "n_model_evals",
]  # fmt: skip


def test_miss_and_hit_are_the_same_json(client: TestClient) -> None:
    body = {"inputs": [ROW], "seed": 123, "budget": 4000, "parameters": {"estimator": "kernel"}}
    url = "/v2/models/diabetes-mlp/explain/shapley"
    miss = client.post(url, json={**body, "id": "first"}, headers={"Cache-Control": "no-cache"})
    assert miss.status_code == 200 and miss.headers["x-cache"] == "BYPASS"
    first = client.post(url, json={**body, "id": "first"})
    hit = client.post(url, json={**body, "id": "second"})
    assert first.headers["x-cache"] == "MISS" and hit.headers["x-cache"] == "HIT"
    expected = first.content.replace(b'"id": "first"', b'"id": "second"').replace(
        b'"cache": "miss"', b'"cache": "hit"'
    )
    assert hit.content == expected
    answer = json.loads(hit.content)
    assert list(answer) == ["model_name", "model_version", "id", "meta", "data"]
    assert list(answer["data"]["explanations"][0]) == EXPLANATION_KEYS
    assert "precision" not in answer["meta"]  # meta keys an explainer did not give stay out
    typed = ExplainResponse.model_validate_json(hit.content)
    assert json.loads(typed.to_json()) == answer  # the declared schema carries every field


def test_service_answers_typed(client: TestClient) -> None:
    svc: ExplainService = client.app.state.service  # type: ignore[attr-defined]
    req = request_model(get_explainer("shapley"))(inputs=[ROW, ROW], seed=7, id="typed")
    outcome = svc.explain("diabetes-mlp", "shapley", req, use_cache=True)
    answer = outcome.response
    assert isinstance(answer, ExplainResponse) and answer.id == "typed"
    assert answer.meta.n_instances == 2 == len(answer.data.explanations)
    assert answer.data.explanations[0].values == answer.data.explanations[1].values
    assert json.loads(outcome.json) == answer.model_dump(exclude_unset=True)
    again = svc.explain("diabetes-mlp", "shapley", req, use_cache=True)
    assert again.cache == "hit" and again.response.meta.cache == "hit"
    assert again.response.data == answer.data
    assert json.loads(again.json)["meta"]["cache"] == "hit"
