"""The Python client (sync and async) and the xai CLI against the real app."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import shap
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from xai import AsyncClient, Client, ServiceError

ROOT = Path(__file__).resolve().parents[1]
ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]


@pytest.fixture(scope="module")
def app_client(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = f"sqlite:///{tmp_path_factory.mktemp('client') / 'jobs.db'}"
    settings = Settings(model_dir=model_dir, redis_url=None, database_url=db)
    with TestClient(create_app(settings, ModelRegistry(model_dir))) as c:
        yield c


def test_sync_client_explain_and_audit(app_client: TestClient) -> None:
    client = Client(http=app_client)
    assert {m["name"] for m in client.models()} >= {"diabetes-mlp"}
    explained = client.explain("diabetes-mlp", [ROW, ROW], seed=1)
    assert explained.values.shape == (2, 10) and explained.meta["exact"]
    sx = explained.to_shap()
    assert isinstance(sx, shap.Explanation) and sx.values.shape == (2, 10)
    assert sx.feature_names == client.model("diabetes-mlp")["feature_names"]
    np.testing.assert_allclose(
        sx.values.sum(1) + sx.base_values,
        [e["instance_output_value"] for e in explained.explanations],
        atol=1e-6,
    )
    result = client.audit("diabetes-mlp", [ROW] * 5, progress=False, budget=102400)
    assert result.status["status"] == "succeeded" and len(result.results) == 5
    assert result.to_shap().values.shape == (5, 10)
    assert [r["index"] for r in client.results(result.status["id"], offset=3)] == [3, 4]
    with pytest.raises(ServiceError) as err:
        client.explain("diabetes-mlp", [[1, 2]])
    assert err.value.status == 400 and err.value.code == "invalid_input"


def test_async_client(app_client: TestClient) -> None:
    async def run() -> None:
        transport = httpx.ASGITransport(app=app_client.app)
        async with AsyncClient(
            http=httpx.AsyncClient(transport=transport, base_url="http://test")
        ) as client:
            explained = await client.explain("diabetes-mlp", [ROW])
            assert explained.values.shape == (1, 10)
            result = await client.audit("diabetes-mlp", [ROW] * 3, poll=0.05)
            assert result.status["status"] == "succeeded" and len(result.results) == 3

    asyncio.run(run())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xai", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_audit_csv_to_parquet_and_jsonl(
    inprocess_server: str, tmp_path: Path, model_dir: Path
) -> None:
    model = ModelRegistry(model_dir).get("diabetes-mlp")
    assert model.reference is not None
    frame = pd.DataFrame(model.reference[:12], columns=list(model.feature_names))
    data = tmp_path / "rows.csv"
    frame.to_csv(data, index=False)
    out = tmp_path / "out.parquet"
    done = cli(
        "--url",
        inprocess_server,
        "audit",
        "diabetes-mlp",
        str(data),
        "-o",
        str(out),
        "--no-progress",
        "--seed",
        "2",
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(out)
    assert len(table) == 12 and list(table["index"]) == list(range(12))
    assert set(model.feature_names) <= set(table.columns)
    sums = table[list(model.feature_names)].sum(axis=1) + table["base_value"]
    np.testing.assert_allclose(sums, table["instance_output_value"], atol=1e-4)
    jsonl = cli("--url", inprocess_server, "audit", "diabetes-mlp", str(data), "--no-progress")
    assert jsonl.returncode == 0, jsonl.stderr
    assert len([json.loads(x) for x in jsonl.stdout.splitlines()]) == 12
    bad = cli("--url", inprocess_server, "audit", "nope", str(data), "--no-progress")
    assert bad.returncode == 2 and "unknown_model" in bad.stderr
