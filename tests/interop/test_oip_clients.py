"""The Open Inference Protocol against a running server, with real clients: tritonclient's HTTP
client and the KServe SDK's REST client (from their own virtualenv, scripts/setup_peers.sh), and
raw httpx for bodies no client sends (bad UTF-8, wrong binary sizes) on one keep-alive connection.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from models.base import Model
from models.builtin.trained import dataset_split
from models.registry import ModelRegistry

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".peers" / "clients" / "bin" / "python"
HEADER = "inference-header-content-length"
TEXTS = ["a wonderful, moving film", "the movie was terrible"]
MODELS = ["diabetes-mlp", "digits-cnn", "sentiment-minilm"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def peer_python() -> Path:
    """The peers' interpreter; missing: a skip on a developer machine, a failure under CI."""
    if not PEERS.exists():
        message = f"{PEERS} is missing: run scripts/setup_peers.sh"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(message)
        pytest.skip(message)
    return PEERS


@pytest.fixture(scope="module")
def models(model_dir: Path) -> dict[str, Model]:
    registry = ModelRegistry(model_dir)
    return {name: registry.get(name) for name in MODELS}


@pytest.fixture(scope="module")
def inputs(models: dict[str, Model]) -> dict[str, Any]:
    background = models["diabetes-mlp"].background
    assert background is not None
    return {
        "diabetes-mlp": background[:3],  # float32 [3, 10]
        "digits-cnn": dataset_split("digits-cnn").x_test[:2],  # float32 [2, 1, 8, 8]
        "sentiment-minilm": TEXTS,
    }


def case(model: str, x: Any, binary_in: bool, binary_out: bool | None, **extra: Any) -> dict:
    if model == "sentiment-minilm":
        tensor = {"datatype": "BYTES", "shape": [len(x)], "data": list(x)}
    else:
        tensor = {"datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    out = {"model": model, **tensor, "binary_in": binary_in, **extra}
    if binary_out is not None:
        out["binary_out"] = binary_out
    return out


def run_peer(python: Path, script: str, url: str, spec: dict, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [str(python), script, url, str(path)],
        cwd=ROOT / "tests" / "interop",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout))


def predict(model: Model, x: Any) -> np.ndarray:
    return np.asarray(model.predict(x if isinstance(x, list) else np.asarray(x, np.float32)))


def check_results(
    results: list[dict[str, Any]], cases: list[dict], models: dict[str, Model], inputs: dict
) -> None:
    assert len(results) == len(cases)
    for result, spec in zip(results, cases, strict=True):
        expected = predict(models[spec["model"]], inputs[spec["model"]])
        assert result["datatype"] == "FP32" and result["shape"] == list(expected.shape), spec
        np.testing.assert_allclose(
            np.reshape(result["data"], expected.shape), expected, rtol=1e-5, atol=1e-6
        )
        assert result["binary"] == spec.get("binary_out", True), spec


def test_tritonclient(
    peer_python: Path,
    inprocess_server: str,
    models: dict[str, Model],
    inputs: dict[str, Any],
    tmp_path: Path,
) -> None:
    cases = []
    for name in MODELS:
        x = inputs[name]
        cases += [
            case(name, x, binary_in=False, binary_out=False),
            case(name, x, binary_in=True, binary_out=True),
            case(name, x, binary_in=True, binary_out=False),
            case(name, x, binary_in=False, binary_out=True),
        ]
    version = models["digits-cnn"].version
    cases.append(case("digits-cnn", inputs["digits-cnn"], True, None, version=version))
    x64 = np.round(inputs["diabetes-mlp"]).astype(np.float64)  # exact in every dtype below
    for datatype in ("FP64", "INT32", "INT64"):
        cases.append(
            {**case("diabetes-mlp", x64, True, True), "datatype": datatype, "id": datatype}
        )
    errors = [
        {**case("diabetes-mlp", inputs["diabetes-mlp"], True, True), "output": "nope"},
        {**case("digits-cnn", inputs["digits-cnn"], True, True), "version": "0" * 16},
        case("no-such-model", inputs["digits-cnn"], True, True),
        {**case("diabetes-mlp", inputs["digits-cnn"], True, True)},  # wrong shape
    ]
    spec = {"models": MODELS, "cases": cases, "errors": errors}
    out = run_peer(peer_python, "triton_client.py", inprocess_server, spec, tmp_path)

    assert out["live"] and out["ready"]
    assert "binary_tensor_data" in out["server"]["extensions"]
    for name in MODELS:
        entry = out["models"][name]
        assert entry["ready"] and entry["version_ready"] and not entry["other_version_ready"]
        meta = entry["metadata"]
        assert meta["name"] == name and meta["versions"] == [models[name].version]
        assert meta["outputs"][0]["name"] == "output"
        assert entry["version_metadata"] == meta
    assert not out["unknown_model_ready"]
    expected_inputs = {**inputs}
    results = out["results"]
    check_results(results[:13], cases[:13], models, expected_inputs)
    x64_inputs = {"diabetes-mlp": x64.astype(np.float32)}
    check_results(results[13:], cases[13:], models, x64_inputs)
    assert [r["id"] for r in results[13:]] == ["FP64", "INT32", "INT64"]  # echoed
    assert [e["status"] for e in out["errors"]] == ["400", "404", "404", "400"]
    assert "unknown output 'nope'" in out["errors"][0]["message"]
    assert "serves version" in out["errors"][1]["message"]


def test_kserve_client(
    peer_python: Path,
    inprocess_server: str,
    models: dict[str, Model],
    inputs: dict[str, Any],
    tmp_path: Path,
) -> None:
    cases = []
    for name in MODELS:
        x = inputs[name]
        cases += [
            case(name, x, binary_in=False, binary_out=False),
            case(name, x, binary_in=True, binary_out=True),
            case(name, x, binary_in=True, binary_out=False, parameters={"note": "ignored"}),
        ]
    errors = [
        {**case("diabetes-mlp", inputs["diabetes-mlp"], False, False), "output": "nope"},
        case("no-such-model", inputs["digits-cnn"], True, True),
        {**case("diabetes-mlp", inputs["digits-cnn"], True, True)},  # wrong shape
    ]
    spec = {"models": MODELS, "cases": cases, "errors": errors}
    out = run_peer(peer_python, "kserve_client.py", inprocess_server, spec, tmp_path)

    assert out["live"] and out["ready"]
    assert all(out["models"][name]["ready"] for name in MODELS)
    assert not out["unknown_model_ready"]
    check_results(out["results"], cases, models, inputs)
    assert all(r["name"] == "output" for r in out["results"])
    assert out["errors"] == [
        {"status": 400, "code": "unknown_output"},
        {"status": 404, "code": "unknown_model"},
        {"status": 400, "code": "invalid_input"},
    ]


# --- raw HTTP: what no client sends, and the connection it must not cost ----------------------


@pytest.fixture()
def http(inprocess_server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=inprocess_server, timeout=120) as client:
        yield client


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {
        HEADER: str(len(head)),
        "content-type": "application/octet-stream",
    }


def parse_binary(r: httpx.Response) -> tuple[dict[str, Any], bytes]:
    n = int(r.headers[HEADER])
    return json.loads(r.content[:n]), r.content[n:]


def local_port(r: httpx.Response) -> Any:
    """The client side of the connection a response came on (same port: same connection)."""
    return r.extensions["network_stream"].get_extra_info("client_addr")


def test_errors_keep_the_connection(http: httpx.Client, inputs: dict[str, Any]) -> None:
    x = inputs["diabetes-mlp"][:1]
    good = {"inputs": [{"name": "input", "shape": [1, 10], "datatype": "FP32"}]}
    good["inputs"][0]["data"] = x.ravel().tolist()
    blob = np.ascontiguousarray(x, "<f4").tobytes()
    short, short_headers = binary_body(
        {
            "inputs": [
                {"shape": [1, 10], "datatype": "FP32", "parameters": {"binary_data_size": 40}}
            ]
        },
        blob[:36],
    )
    extra, extra_headers = binary_body(
        {
            "inputs": [
                {"shape": [1, 10], "datatype": "FP32", "parameters": {"binary_data_size": 40}}
            ]
        },
        blob + b"\x00\x00\x00\x00",
    )
    infer = "/v2/models/diabetes-mlp/infer"
    octet = {"content-type": "application/octet-stream"}
    bad = [  # (method, path, body, headers) -> (status, code)
        ("POST", infer, b'{"inputs": "\xff\xfe"}', {}, 400, "invalid_body"),
        ("POST", infer, b"\x93NUMPY\x01\x00\xff" * 10, octet, 400, "invalid_body"),
        ("POST", infer, b'{"inputs": [', {}, 400, "invalid_json"),
        ("POST", infer, short, short_headers, 400, "invalid_body"),
        ("POST", infer, extra, extra_headers, 400, "invalid_body"),
        ("POST", infer, b"{}", {HEADER: "99"}, 400, "invalid_body"),
        ("POST", infer, b'{"id": 5, "inputs": []}', {}, 422, "validation_error"),
        ("POST", "/v2/models/diabetes-mlp/explain/shapley", b"\xff\xfe\x00", octet, 422, None),
        ("POST", "/v2/models/nope/infer", json.dumps(good).encode(), {}, 404, "unknown_model"),
        ("POST", "/v2/models/diabetes-mlp/versions/1/infer", b"{}", {}, 404, "unknown_version"),
        ("GET", "/v2/models/diabetes-mlp/versions/1", None, {}, 404, "unknown_version"),
        ("GET", "/v2/models/diabetes-mlp/versions/1/ready", None, {}, 404, "unknown_version"),
        ("GET", "/v2/models/nope/ready", None, {}, 404, "unknown_model"),
        ("GET", "/v2/models/gemma3-270m/ready", None, {}, 503, "model_not_ready"),
        ("GET", "/no/such/route", None, {}, 404, "not_found"),
        ("GET", infer, None, {}, 405, "method_not_allowed"),
        ("POST", infer, b"x" * (16 * 1024 * 1024 + 1), {}, 413, "payload_too_large"),
    ]
    first = None
    for method, path, body, headers, status, code in bad:
        r = http.request(method, path, content=body, headers=headers)
        label = f"{method} {path} {body[:40] if body else body!r}"
        assert r.status_code == status, (label, r.text)
        assert r.headers["content-type"] == "application/json", label
        assert r.json()["error"] and (code is None or r.json()["code"] == code), (label, r.text)
        assert len(r.headers["x-request-id"]) >= 16, label
        port = local_port(r)
        ok = http.post(infer, content=json.dumps(good))  # no Content-Type: accepted
        assert ok.status_code == 200, (label, ok.text)
        assert local_port(ok) == port, f"connection dropped after {label}"
        first = first or port
    assert local_port(ok) == first  # one connection all along
    echo = http.post(infer, content=b"{", headers={"X-Request-ID": "trace-42"})
    assert echo.status_code == 400 and echo.headers["x-request-id"] == "trace-42"


def test_binary_tensor_extension_raw(
    http: httpx.Client, models: dict[str, Model], inputs: dict[str, Any]
) -> None:
    x = inputs["digits-cnn"]
    expected = predict(models["digits-cnn"], x)
    body, headers = binary_body(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP64",
                    "parameters": {"binary_data_size": x.size * 8},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        np.ascontiguousarray(x, "<f8").tobytes(),
    )
    r = http.post("/v2/models/digits-cnn/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    head, tail = parse_binary(r)
    out = head["outputs"][0]
    assert out["parameters"] == {"binary_data_size": expected.size * 4} and "data" not in out
    values = np.frombuffer(tail, "<f4").reshape(out["shape"])
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)

    # BYTES: 4-byte little-endian length, then UTF-8, per element; JSON output on request
    blob = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in TEXTS)
    body, headers = binary_body(
        {
            "inputs": [
                {
                    "shape": [2, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": True},  # the output's own parameter wins
        },
        blob,
    )
    r = http.post("/v2/models/sentiment-minilm/infer", content=body, headers=headers)
    assert r.status_code == 200 and HEADER not in r.headers, r.text
    np.testing.assert_allclose(
        np.reshape(r.json()["outputs"][0]["data"], (2, 2)),
        predict(models["sentiment-minilm"], TEXTS),
        rtol=1e-5,
        atol=1e-6,
    )

    # nested JSON data, INT32, no Content-Type
    rows = np.round(inputs["diabetes-mlp"][:2])
    nested = {"inputs": [{"shape": [2, 10], "datatype": "INT32", "data": rows.tolist()}]}
    r = http.post("/v2/models/diabetes-mlp/infer", content=json.dumps(nested))
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        np.reshape(r.json()["outputs"][0]["data"], (2, 1)),
        predict(models["diabetes-mlp"], rows),
        rtol=1e-5,
    )

    bad_texts = [
        (b"\x05\x00\x00\x00abc", "overruns"),  # length past the end
        (b"\x02\x00\x00\x00ok\x01\x00", "truncated"),  # then half a prefix
        (b"\x02\x00\x00\x00\xff\xfe", "not UTF-8"),
    ]
    for blob, words in bad_texts:
        body, headers = binary_body(
            {
                "inputs": [
                    {
                        "shape": [1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(blob)},
                    }
                ]
            },
            blob,
        )
        r = http.post("/v2/models/sentiment-minilm/infer", content=body, headers=headers)
        assert r.status_code == 400 and words in r.json()["error"], r.text

    plain = {"shape": [1, 10], "datatype": "FP32", "data": [1.0] * 10}
    invalid = [  # (request, status, code)
        ({"inputs": [plain], "parameters": {"nested": {"a": 1}}}, 422, "validation_error"),
        ({"inputs": [{**plain, "parameters": {"x": None}}]}, 422, "validation_error"),
        ({"inputs": [plain], "outputs": [{"name": "logits"}]}, 400, "unknown_output"),
        ({"inputs": [plain], "parameters": {"binary_data_output": 1}}, 400, "invalid_input"),
        ({"inputs": [{**plain, "parameters": {"binary_data_size": 40}}]}, 400, "invalid_input"),
        ({"inputs": [{**plain, "data": [float("nan")] * 10}]}, 400, "invalid_input"),
        ({"inputs": [{**plain, "data": [True] * 10}]}, 400, "invalid_input"),
        ({"inputs": [{**plain, "datatype": "BF16"}]}, 400, "invalid_input"),
        ({"inputs": [{**plain, "shape": [2, 10]}]}, 400, "invalid_input"),
    ]
    for request, status, code in invalid:
        r = http.post("/v2/models/diabetes-mlp/infer", content=json.dumps(request))
        assert (r.status_code, r.json()["code"]) == (status, code), (request, r.text)


def test_openapi_documents_the_oip_routes(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/v2/models/{model}/ready",
        "/v2/models/{model}/versions/{version}",
        "/v2/models/{model}/versions/{version}/ready",
    ):
        assert "get" in paths[path], path
    for path in ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"):
        body = paths[path]["post"]["requestBody"]["content"]
        assert {"application/json", "application/octet-stream"} <= set(body)
        assert "inputs" in body["application/json"]["schema"]["properties"]
        assert "$ref" not in json.dumps(body)  # inlined: no dangling references


def test_unhandled_error_keeps_the_connection(model_dir: Path) -> None:
    """A route that fails unexpectedly (a test-only route on the real app, served by uvicorn)
    answers a JSON 500 with the request id, and the keep-alive connection stays usable."""
    import threading
    import time

    import uvicorn

    from app.main import create_app
    from app.settings import Settings
    from tests.conftest import free_port

    settings = Settings(
        model_dir=model_dir, redis_url=None, job_queue="inprocess", load_models_on_start=False
    )
    # Not make_client: a test-only route on the real app, served by uvicorn
    app = create_app(settings)

    @app.get("/fails")
    async def fails() -> None:
        raise RuntimeError("a bug, not the client's doing")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            r = http.get("/fails")
            assert r.status_code == 500
            assert r.json() == {"error": "internal server error", "code": "internal_error"}
            assert len(r.headers["x-request-id"]) >= 16
            ok = http.get("/v2/health/live")
            assert ok.status_code == 200 and ok.json()["live"] is True
            assert local_port(ok) == local_port(r)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
