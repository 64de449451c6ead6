"""Client input that gave 500s answers a 4xx JSON error: numbers past float range, JSON
nested 100k deep, integers past Python's 4,300-digit limit, lone surrogates in texts, ids,
model names and job ids. Against the app (TestClient, server errors as answers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from models.registry import ModelRegistry

TABULAR = "/v2/models/diabetes-mlp"
TEXT = "/v2/models/sentiment-minilm"
ROW = [0.01] * 10
SURROGATE = "\ud800"  # a lone surrogate: valid JSON ("\ud800"), not encodable as UTF-8


@pytest.fixture(scope="module")
def hostile(registry: ModelRegistry, make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(registry, raise_server_exceptions=False, max_body_bytes=4_000_000)


def raw(client: TestClient, path: str, text: str, **headers: str) -> httpx.Response:
    """POST a body exactly as written (json.dumps escapes surrogates as \\ud800)."""
    return client.post(
        path, content=text.encode(), headers={"Content-Type": "application/json", **headers}
    )


def client_error(r: httpx.Response) -> dict[str, Any]:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body: dict[str, Any] = r.json()
    assert body.get("error") or body.get("detail"), body
    return body


def deep(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


# --- numbers past float range -------------------------------------------------------------


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_feature_is_a_400(hostile: TestClient, digits: int) -> None:
    big = "9" * digits
    body = f'{{"inputs": [[{big}, 0, 0, 0, 0, 0, 0, 0, 0, 0]]}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))


def test_a_huge_integer_in_a_background_or_option_is_a_4xx(hostile: TestClient) -> None:
    big = "9" * 400
    body = f'{{"inputs": [{json.dumps(ROW)}], "background": [[{big}, 0, 0, 0, 0, 0, 0, 0, 0, 0]]}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))
    body = f'{{"inputs": [{json.dumps(ROW)}], "budget": {big}}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))
    params = f'{{"baseline": "constant", "baseline_value": {big}}}'
    body = f'{{"inputs": [{json.dumps(ROW)}], "parameters": {params}}}'
    client_error(raw(hostile, TABULAR + "/explain/integrated-gradients", body))


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integers_in_oip_data_are_a_400(hostile: TestClient, digits: int) -> None:
    big = "9" * digits
    body = (
        '{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 10], '
        f'"data": [{big}, 0, 0, 0, 0, 0, 0, 0, 0, 0]}}]}}'
    )
    client_error(raw(hostile, TABULAR + "/infer", body))


# --- nesting -------------------------------------------------------------------------------


def oip_body(data: str) -> str:
    """An OIP infer body whose one input's data is `data` (raw JSON text)."""
    return '{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": ' + data + "}]}"


def test_oip_data_nested_100k_deep_is_a_400(hostile: TestClient) -> None:
    body = oip_body(deep(100_000))
    client_error(raw(hostile, TABULAR + "/infer", body))


def test_explain_inputs_nested_100k_deep_are_a_4xx(hostile: TestClient) -> None:
    client_error(raw(hostile, TABULAR + "/explain/shapley", f'{{"inputs": {deep(100_000)}}}'))
    client_error(raw(hostile, TABULAR + "/explain/shapley", deep(100_000)))


def test_inputs_nested_a_few_hundred_deep_are_a_4xx(hostile: TestClient) -> None:
    """Under the parser's limit, deep enough to strain validation and conversion."""
    client_error(raw(hostile, TABULAR + "/explain/shapley", f'{{"inputs": {deep(900)}}}'))
    body = oip_body(deep(900))
    client_error(raw(hostile, TABULAR + "/infer", body))


def test_a_deep_job_body_is_a_4xx(hostile: TestClient) -> None:
    client_error(
        raw(hostile, "/v2/jobs", f'{{"model": "diabetes-mlp", "inputs": {deep(100_000)}}}')
    )


# --- lone surrogates --------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_text_is_a_400(hostile: TestClient) -> None:
    body = '{"inputs": ["a fine film \\ud800 indeed"]}'
    client_error(raw(hostile, TEXT + "/explain/shapley", body))


def test_a_lone_surrogate_in_an_oip_text_is_a_400(hostile: TestClient) -> None:
    body = '{"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": ["\\udfff"]}]}'
    client_error(raw(hostile, TEXT + "/infer", body))


def test_a_lone_surrogate_in_an_id_is_a_4xx(hostile: TestClient) -> None:
    body = f'{{"id": "\\ud800", "inputs": [{json.dumps(ROW)}]}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))
    body = (
        '{"id": "\\ud800", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 10], '
        f'"data": {json.dumps(ROW)}}}]}}'
    )
    client_error(raw(hostile, TABULAR + "/infer", body))


def test_a_lone_surrogate_in_a_request_id_header_or_option_is_harmless(
    hostile: TestClient,
) -> None:
    body = f'{{"inputs": [{json.dumps(ROW)}], "parameters": {{"estimator": "\\ud800"}}}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))
    body = f'{{"inputs": [{json.dumps(ROW)}], "target": "\\ud800"}}'
    client_error(raw(hostile, TABULAR + "/explain/shapley", body))


def test_a_lone_surrogate_in_a_model_name_is_a_4xx(hostile: TestClient) -> None:
    # In the path (percent-encoded UTF-8 of the surrogate, which is not valid UTF-8) ...
    client_error(raw(hostile, "/v2/models/%ED%A0%80/explain/shapley", '{"inputs": [[1]]}'))
    r = hostile.get("/v2/models/%ED%A0%80")
    client_error(r)
    # ... and in JSON bodies that name a model (jobs, registration).
    body = f'{{"model": "\\ud800", "explainer": "shapley", "inputs": [{json.dumps(ROW)}]}}'
    client_error(raw(hostile, "/v2/jobs", body))


def test_a_lone_surrogate_in_a_job_id_is_a_4xx(hostile: TestClient) -> None:
    for path in ("/v2/jobs/%ED%A0%80", "/v2/jobs/%ED%A0%80/results"):
        client_error(hostile.get(path))
    client_error(hostile.delete("/v2/jobs/%ED%A0%80"))


def test_a_lone_surrogate_in_an_idempotency_key_is_a_4xx(hostile: TestClient) -> None:
    body = f'{{"model": "diabetes-mlp", "explainer": "shapley", "inputs": [{json.dumps(ROW)}]}}'
    r = hostile.post(
        "/v2/jobs",
        content=body.encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": b"caf\xe9"},  # latin-1
    )
    assert r.status_code < 500, r.text


def test_the_service_still_answers(hostile: TestClient) -> None:
    r = hostile.post(TABULAR + "/explain/shapley", json={"inputs": [ROW]})
    assert r.status_code == 200, r.text
