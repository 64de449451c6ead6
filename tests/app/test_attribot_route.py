"""POST /v2/models/{lm}/explain/attribot through the ASGI app, and LM readiness."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from models.registry import ModelRegistry

pytestmark = pytest.mark.slow

URL = "/v2/models/gemma3-270m/explain/attribot"
CONTEXT = "Zorblat is the capital of Quenmoria. It has a harbour.\n\nBread is baked from flour."
QUERY = "What is the capital of Quenmoria?"


@pytest.fixture(scope="module")
def lm_client(registry: ModelRegistry, make_client: Callable[..., TestClient]) -> TestClient:
    registry.get("gemma3-270m")  # loaded here; the app does not load anything on start
    return make_client(registry)


def test_attribot_route_answers_spans_with_offsets(lm_client: TestClient) -> None:
    body = {
        "context": CONTEXT,
        "query": QUERY,
        "response": " Zorblat.",
        "parameters": {"granularity": "paragraph"},
    }
    r = lm_client.post(URL, json=body, headers={"Cache-Control": "no-cache"})
    assert r.status_code == 200, r.text
    out = r.json()
    meta, e = out["meta"], out["data"]["explanations"][0]
    assert meta["explainer"] == "attribot" and meta["additive"] is False
    assert meta["parameters"]["granularity"] == "paragraph" and meta["parameters"]["kv_cache"]
    assert meta["n_model_evals"] == 3 and meta["forward_passes"] == {"gemma3-270m": 3}
    spans = e["details"]["spans"]
    assert [s["text"] for s in spans] == CONTEXT.split("\n\n")
    assert all(CONTEXT[s["start"] : s["end"]] == s["text"] for s in spans)
    assert spans[0]["score"] > spans[1]["score"] and spans[0]["scored_by"] == "target loo"
    assert e["values"] == [s["score"] for s in spans]
    assert e["players"][0] == {"text": spans[0]["text"], "start": 0, "end": spans[0]["end"]}
    assert e["details"]["seconds"]["total"] > 0 and e["data"] is None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"context": CONTEXT, "query": QUERY, "parameters": {"nope": 1}}, 422, None),
        ({"context": CONTEXT, "query": QUERY, "inputs": ["x"]}, 422, None),
        ({"context": "", "query": QUERY, "response": " a"}, 400, "invalid_option"),
        (
            {"context": CONTEXT, "query": QUERY, "parameters": {"prompt_template": "{query}"}},
            400,
            "invalid_option",
        ),
        (
            {"context": CONTEXT, "query": QUERY, "parameters": {"proxy_model": "gpt-5"}},
            400,
            "invalid_option",
        ),
    ],
)
def test_attribot_route_refuses_bad_input(
    lm_client: TestClient, body: dict[str, object], status: int, code: str | None
) -> None:
    r = lm_client.post(URL, json=body)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["code"] == code


def test_lm_modality_listing_and_readiness(lm_client: TestClient) -> None:
    r = lm_client.post("/v2/models/gemma3-270m/explain/shapley", json={"inputs": ["a"]})
    assert r.status_code == 400 and r.json()["code"] == "unsupported_modality"
    meta = lm_client.get("/v2/models/gemma3-270m").json()
    assert meta["modality"] == "lm" and meta["explainers"] == ["attribot"]
    listing = {m["name"]: m for m in lm_client.get("/v2/models").json()}
    assert listing["gemma3-270m"]["state"] == "ready"
    ready = lm_client.get("/v2/health/ready")
    assert ready.status_code == 200  # LMs never hold readiness back
    assert ready.json()["models"]["gemma3-270m"] == {
        "loaded": True,
        "error": None,
        "background": True,
    }
    assert ready.json()["models"]["smollm2-135m"]["background"] is True
