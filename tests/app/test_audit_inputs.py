"""Audits keep their inputs: list rows, {feature: value} rows and CSV uploads alike fill the
results' input.* columns (CSV, Parquet) and to_shap().data with the rows sent."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from models.registry import ModelRegistry
from tests.app.test_jobs import wait
from xai import Client

MODEL = "diabetes-mlp"


@pytest.fixture(scope="module")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture(scope="module")
def rows(client: TestClient) -> pd.DataFrame:
    """Six real rows of the model's data, columns named as its features, shuffled order."""
    names = client.get(f"/v2/models/{MODEL}").json()["feature_names"]
    model = ModelRegistry(Settings().model_dir).get(MODEL)
    assert model.reference is not None
    frame = pd.DataFrame(np.asarray(model.reference[:6], dtype=np.float64), columns=names)
    return frame[names[::-1]]  # dict rows need not follow the model's order


def api(client: TestClient) -> Client:
    return Client(http=client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client


def fields(client: TestClient) -> dict[str, Any]:
    background = client.get(f"/v2/models/{MODEL}/examples", params={"n": 4}).json()
    return {"background": background["instances"], "budget": 1024 * 4, "seed": 1}


def check_tables(client: TestClient, job_id: str, rows: pd.DataFrame) -> None:
    names = client.get(f"/v2/models/{MODEL}").json()["feature_names"]
    expected = rows[names].to_numpy()
    csv = client.get(f"/v2/jobs/{job_id}/results", params={"format": "csv"})
    parquet = client.get(f"/v2/jobs/{job_id}/results", params={"format": "parquet"})
    assert csv.status_code == parquet.status_code == 200
    for table in (pd.read_csv(io.StringIO(csv.text)), pd.read_parquet(io.BytesIO(parquet.content))):
        assert list(table["index"]) == list(range(len(rows)))
        got = table[[f"input.{n}" for n in names]].to_numpy(dtype=np.float64)
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        values = table[[f"value.{n}" for n in names]].to_numpy()
        np.testing.assert_allclose(
            values.sum(axis=1) + table["base_value"], table["output_value"], atol=1e-4
        )
    result = api(client).results_frame(job_id)
    np.testing.assert_allclose(result[[f"input.{n}" for n in names]], expected, rtol=1e-12)


@pytest.mark.parametrize("as_dicts", [True, False])
def test_json_rows_keep_their_inputs(
    client: TestClient, rows: pd.DataFrame, as_dicts: bool
) -> None:
    names = client.get(f"/v2/models/{MODEL}").json()["feature_names"]
    inputs = rows.to_dict("records") if as_dicts else rows[names].to_numpy().tolist()
    r = client.post("/v2/jobs", json={"model": MODEL, "inputs": inputs, **fields(client)})
    assert r.status_code == 202, r.text
    status = wait(client, r.json()["id"])
    assert status["status"] == "succeeded"
    check_tables(client, status["id"], rows)


def test_csv_upload_keeps_its_inputs(client: TestClient, rows: pd.DataFrame) -> None:
    import json

    data = rows.to_csv(index=False).encode()
    r = client.post(
        "/v2/jobs/upload",
        data={"job": json.dumps({"model": MODEL, **fields(client)})},
        files={"file": ("rows.csv", data)},
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert wait(client, job_id)["status"] == "succeeded"
    check_tables(client, job_id, rows)


def test_client_audit_of_records_has_shap_data(client: TestClient, rows: pd.DataFrame) -> None:
    names = client.get(f"/v2/models/{MODEL}").json()["feature_names"]
    result = api(client).audit(
        MODEL, rows.to_dict("records"), progress=False, **fields(client)
    )
    assert result.status["status"] == "succeeded"
    sx = result.to_shap()
    assert sx.feature_names == names and sx.values.shape == (6, 10)
    np.testing.assert_allclose(sx.data, rows[names].to_numpy(), rtol=1e-12)
    frame = result.to_frame()
    np.testing.assert_allclose(frame[[f"input.{n}" for n in names]], rows[names], rtol=1e-12)
