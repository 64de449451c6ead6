"""Global plots and tables of a finished audit: summary bars are the mean |value| the job's
results give, the beeswarm has a dot per instance and feature coloured by the feature's value,
dependence follows shap's interaction heuristic; Vega-Lite validates; CSV and Parquet hold the
results; 404, 409 and 400 where they belong."""

from __future__ import annotations

import csv
import io
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from app import job_plots
from models.registry import ModelRegistry
from tests.app.test_plots import vega_lite_validator


def wait(client: TestClient, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/v2/jobs/{job_id}").json()
        if status["status"] in ("succeeded", "succeeded_with_errors", "failed", "cancelled"):
            return dict(status)
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture(scope="module")
def jobs(registry: ModelRegistry, make_client: Callable[..., TestClient]) -> Any:
    client = make_client(registry)
    rows = client.get("/v2/models/diabetes-mlp/examples?n=24").json()["instances"]
    tab = client.post("/v2/jobs", json={"model": "diabetes-mlp", "inputs": rows}).json()
    digits = client.get("/v2/models/digits-cnn/examples?n=3").json()["instances"]
    img = client.post(
        "/v2/jobs", json={"model": "digits-cnn", "inputs": digits, "budget": 256}
    ).json()
    text = client.post(
        "/v2/jobs", json={"model": "sentiment-minilm", "inputs": ["good film", "bad plot."]}
    ).json()
    for job in (tab, img, text):
        assert wait(client, job["id"])["status"] == "succeeded"
    return client, tab["id"], img["id"], text["id"]


def results(client: TestClient, job_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v2/jobs/{job_id}/results")
    return [json.loads(line) for line in r.text.splitlines()]


def test_summary_is_the_mean_absolute_value(jobs: Any) -> None:
    client, tab, _, _ = jobs
    stored = results(client, tab)
    values = np.array([r["explanation"]["values"] for r in stored])
    names = stored[0]["feature_names"]
    r = client.get(f"/v2/jobs/{tab}/plot?kind=summary&format=vega&max_features=4")
    assert r.status_code == 200, r.text
    spec = r.json()
    vega_lite_validator().validate(spec)
    totals: dict[str, float] = {}
    for row in spec["data"]["values"]:
        totals[row["feature"]] = totals.get(row["feature"], 0.0) + row["value"]
    mean_abs = np.abs(values).mean(axis=0)
    order = np.argsort(-mean_abs)
    for j in order[:4]:
        assert totals[names[j]] == pytest.approx(mean_abs[j])
    assert totals["Sum of 6 other features"] == pytest.approx(mean_abs[order[4:]].sum())
    # the job's own summary gives the same numbers
    summary = client.get(f"/v2/jobs/{tab}").json()["summary"]
    np.testing.assert_allclose(summary["mean_abs_value"], mean_abs, rtol=1e-9)


def test_beeswarm_has_a_dot_per_instance_and_feature(jobs: Any) -> None:
    client, tab, _, _ = jobs
    stored = results(client, tab)
    spec = client.get(f"/v2/jobs/{tab}/plot?kind=beeswarm&format=vega-lite").json()
    vega_lite_validator().validate(spec)
    dots = spec["data"]["values"]
    assert len(dots) == len(stored) * 10
    bmi = [d for d in dots if d["feature"] == "bmi"]
    want = [r["explanation"]["values"][2] for r in stored]
    assert sorted(d["value"] for d in bmi) == pytest.approx(sorted(want))
    assert {d["feature_value"] for d in bmi} == {r["explanation"]["data"][2] for r in stored}
    # higher bmi, redder dot (colour rank follows value rank, clipped at the 5/95 percentiles)
    by_value = sorted(bmi, key=lambda d: d["feature_value"])
    colours = [d["colour"] for d in by_value]
    assert colours == sorted(colours) and 0 <= colours[0] <= colours[-1] <= 1


def test_dependence_follows_shaps_interaction_heuristic(jobs: Any) -> None:
    client, tab, _, _ = jobs
    stored = results(client, tab)
    spec = client.get(f"/v2/jobs/{tab}/plot?kind=dependence&feature=bmi&format=vega").json()
    vega_lite_validator().validate(spec)
    points = spec["data"]["values"]
    assert [p["x"] for p in points] == [r["explanation"]["data"][2] for r in stored]
    assert [p["value"] for p in points] == [r["explanation"]["values"][2] for r in stored]
    shap = pytest.importorskip("shap")
    x = np.array([r["explanation"]["data"] for r in stored], dtype=float)
    v = np.array([r["explanation"]["values"] for r in stored])
    partner = stored[0]["feature_names"][int(shap.utils.approximate_interactions(2, v, x)[0])]
    assert spec["encoding"]["color"]["title"].startswith(partner)
    plain = client.get(f"/v2/jobs/{tab}/plot?kind=dependence&feature=bmi&color=value&format=vega")
    assert plain.json()["encoding"]["color"]["field"] == "sign"


@pytest.mark.parametrize("kind", ["summary", "beeswarm", "dependence"])
def test_png_and_svg(jobs: Any, kind: str) -> None:
    client, tab, _, _ = jobs
    png = client.get(f"/v2/jobs/{tab}/plot?kind={kind}&format=png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG\r\n\x1a\n")
    assert Image.open(io.BytesIO(png.content)).width >= 500
    svg = client.get(f"/v2/jobs/{tab}/plot?kind={kind}&format=svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert ET.fromstring(svg.content).tag.endswith("svg")


def test_image_audit_summary_without_feature_values(jobs: Any) -> None:
    client, _, img, _ = jobs
    r = client.get(f"/v2/jobs/{img}/plot?kind=summary&format=png")
    assert r.status_code == 200
    beeswarm = client.get(f"/v2/jobs/{img}/plot?kind=beeswarm&format=vega").json()
    vega_lite_validator().validate(beeswarm)
    # each digit explains its predicted class (a multi-class model): a panel per class
    panels = beeswarm.get("vconcat", [beeswarm])
    dots = [d for panel in panels for d in panel["data"]["values"]]
    assert dots and all("colour" not in d for d in dots)  # patches: no one feature value
    r = client.get(f"/v2/jobs/{img}/plot?kind=dependence&format=png")
    assert r.status_code == 400 and "feature values" in r.json()["error"]


def test_results_as_csv_and_parquet(jobs: Any) -> None:
    import pyarrow.parquet as pq

    client, tab, _, text = jobs
    stored = results(client, tab)
    r = client.get(f"/v2/jobs/{tab}/results?format=csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert len(table) == len(stored)
    assert float(table[3]["value.bmi"]) == pytest.approx(stored[3]["explanation"]["values"][2])
    assert float(table[3]["input.bmi"]) == stored[3]["explanation"]["data"][2]
    r = client.get(f"/v2/jobs/{tab}/results?format=parquet")
    assert r.status_code == 200 and r.content[:4] == b"PAR1"
    frame = pq.read_table(io.BytesIO(r.content)).to_pydict()
    assert frame["index"] == list(range(len(stored)))
    np.testing.assert_allclose(
        frame["value.s5"], [s["explanation"]["values"][8] for s in stored], rtol=1e-12
    )
    words = client.get(f"/v2/jobs/{text}/results?format=csv").text
    row = next(csv.DictReader(io.StringIO(words)))
    assert json.loads(row["players"]) == ["good", "film"]


def test_tables_stream_a_page_at_a_time(jobs: Any) -> None:
    """Pages of 5 stored results (24 rows: 5 pages, the last short) make the same CSV and one
    Parquet file of 5 row groups that reads back as the route's whole table: every page is
    written and yielded as it is read, none is held (the footer's offsets count every byte)."""
    import pyarrow.parquet as pq

    from app import job_tables

    client, tab, _, _ = jobs
    store = client.app.state.jobs  # type: ignore[attr-defined]

    def pages() -> Any:
        return store.result_pages(tab, page=5)

    chunks = list(job_tables.parquet_stream(pages))
    assert len(chunks) == 6  # a row group per page, then the footer
    streamed = pq.ParquetFile(io.BytesIO(b"".join(chunks)))
    assert streamed.num_row_groups == 5 and streamed.metadata.num_rows == 24
    whole = client.get(f"/v2/jobs/{tab}/results?format=parquet").content
    assert streamed.read().equals(pq.read_table(io.BytesIO(whole)))
    csv_chunks = list(job_tables.csv_stream(pages))
    assert len(csv_chunks) == 5
    assert b"".join(csv_chunks).decode() == client.get(f"/v2/jobs/{tab}/results?format=csv").text
    tail = client.get(f"/v2/jobs/{tab}/results?format=csv&offset=20").text
    assert [r["index"] for r in csv.DictReader(io.StringIO(tail))] == ["20", "21", "22", "23"]


def test_errors(jobs: Any, registry: ModelRegistry) -> None:
    client, tab, _, text = jobs
    assert client.get("/v2/jobs/nope/plot").status_code == 404
    r = client.get(f"/v2/jobs/{text}/plot")
    assert r.status_code == 400 and "text audits" in r.json()["error"]
    r = client.get(f"/v2/jobs/{tab}/plot?kind=dependence&feature=height")
    assert r.status_code == 400 and "unknown feature" in r.json()["error"]
    assert client.get(f"/v2/jobs/{tab}/plot?kind=pie").status_code == 422
    store = client.app.state.jobs  # type: ignore[attr-defined]
    queued, _ = store.create("audit", "diabetes-mlp", {"explainer": "shapley"}, 5, 5)
    r = client.get(f"/v2/jobs/{queued.id}/plot")
    assert r.status_code == 409 and r.json()["code"] == "job_not_finished"
    store.finish(queued.id, "cancelled")


def test_swarm_offsets_stay_in_their_row() -> None:
    x = np.concatenate([np.zeros(50), np.linspace(0, 1, 50)])
    off = job_plots.swarm_offsets(x)
    assert np.abs(off).max() < 0.4 and len(set(off[:50].round(9))) > 10
