"""The Python client (sync and async) and the xai CLI against the real app."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
import shap
from fastapi.testclient import TestClient

from app.auth import digest
from app.main import create_app
from app.settings import Settings
from models.registry import ModelRegistry
from tests.conftest import free_port
from xai import AsyncClient, Client, ServiceError, Unreachable, XaiError
from xai.results import text_tokens

ROOT = Path(__file__).resolve().parents[1]
ROW = [50, 1, 25, 90, 180, 100, 50, 4, 4.5, 90]
XAI = Path(sys.executable).parent / "xai"  # the console script of the editable install
KEYS = [{"name": "reader", "sha256": digest("key-reader").hex(), "scopes": ["explain"]}]


@pytest.fixture(scope="module")
def app_client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def test_sync_client_explain_and_audit(app_client: TestClient) -> None:
    client = Client(http=app_client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
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


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xai", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("XAI_")}, **(env or {})},
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
    job_id = jsonl.stderr.strip().splitlines()[-1].split()[1].rstrip(":")
    env = {"XAI_URL": inprocess_server}
    csv, png = tmp_path / "r.csv", tmp_path / "s.png"
    job = cli("job", job_id, "--results", str(csv), "--plot", str(png), env=env)
    assert job.returncode == 0, job.stderr
    assert json.loads(job.stdout)["status"] == "succeeded"
    assert len(pd.read_csv(csv)) == 12 and png.read_bytes()[:4] == b"\x89PNG"
    listed = cli("jobs", env=env)
    assert listed.returncode == 0 and job_id in listed.stdout


@pytest.fixture(scope="module")
def keyed_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real HTTP server (uvicorn in a thread) that asks for an API key."""
    import uvicorn

    tmp = tmp_path_factory.mktemp("keyed")
    settings = Settings(
        model_dir=model_dir,
        api_keys=json.dumps(KEYS),
        redis_url=None,
        database_url=f"sqlite:///{tmp / 'jobs.db'}",
        user_model_dir=tmp / "u",
        load_models_on_start=False,
    )
    port = free_port()
    # Not make_client: a real uvicorn server on a port (the client's own HTTP transport)
    config = uvicorn.Config(
        create_app(settings, ModelRegistry(model_dir)), port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=20)


def test_url_and_key_from_the_environment(
    keyed_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XAI_URL", keyed_server)
    monkeypatch.delenv("XAI_API_KEY", raising=False)
    with Client() as client, pytest.raises(ServiceError) as err:
        client.models()
    assert err.value.status == 401 and "XAI_API_KEY" in str(err.value)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("XAI_API_KEY", "key-reader")
    with Client() as client:
        assert str(client.http.base_url).rstrip("/") == keyed_server
        assert {m["name"] for m in client.models()} >= {"diabetes-mlp"}
    with Client(keyed_server, api_key="wrong") as client, pytest.raises(ServiceError):
        client.models()


def test_unreachable_server_is_one_error() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", timeout=5) as client:
        with pytest.raises(Unreachable) as err:
            client.models()
        assert "cannot reach the service at http://127.0.0.1" in str(err.value)
        assert "\n" not in str(err.value) and isinstance(err.value, XaiError)
        with pytest.raises(Unreachable):
            list(client.results("x"))


def test_cli_url_after_the_subcommand_env_and_one_line_errors(keyed_server: str) -> None:
    env = {"XAI_API_KEY": "key-reader"}
    for args in (["models", "--url", keyed_server], ["--url", keyed_server, "models"]):
        done = cli(*args, env=env)
        assert done.returncode == 0, done.stderr
        assert "diabetes-mlp" in done.stdout
    by_env = cli("models", env={**env, "XAI_URL": keyed_server})
    assert by_env.returncode == 0 and "diabetes-mlp" in by_env.stdout
    refused = cli("models", "--url", keyed_server, "--api-key", "wrong")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "xai: error: 401 unauthorized: missing or invalid API key "
        "(set XAI_API_KEY or pass api_key / --api-key)"
    ]
    gone = cli("models", env={"XAI_URL": f"http://127.0.0.1:{free_port()}"})
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1
    assert gone.stderr.startswith("xai: error: cannot reach the service at http://127.0.0.1:")
    one = cli("explain", "diabetes-mlp", json.dumps(ROW), "--url", keyed_server, env=env)
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("[0] ") and "f(x) = " in one.stdout and "bmi" in one.stdout


def test_console_script_runs_from_another_folder(tmp_path: Path) -> None:
    """The editable install puts `xai` beside the interpreter; it imports from any folder."""
    assert XAI.exists(), "run scripts/setup.sh: it installs the project into .venv"
    done = subprocess.run(
        [str(XAI), "--help"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "XAI_URL" in done.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import xai; from xai import Client; print(xai.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).parent == ROOT / "xai"


def test_plots_evaluate_and_frames(app_client: TestClient, tmp_path: Path) -> None:
    client = Client(http=app_client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
    png = client.plot("diabetes-mlp", [ROW], kind="waterfall")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    saved = client.plot("diabetes-mlp", [ROW], format="svg", path=tmp_path / "w.svg")
    assert saved == tmp_path / "w.svg" and saved.read_text().lstrip().startswith("<?xml")
    explained = client.explain("diabetes-mlp", [ROW, ROW])
    spec = client.render(explained, format="vega-lite", index=1)
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
    assert isinstance(client.render(explained, format="shap"), shap.Explanation)
    row = explained.to_frame().iloc[0]
    names = explained.feature_names
    assert row["index"] == 0 and set(names) <= set(explained.to_frame().columns)
    np.testing.assert_allclose(
        sum(row[n] for n in names) + row["base_value"], row["instance_output_value"], atol=1e-6
    )
    figures = client.evaluate("diabetes-mlp", [ROW, ROW], explainer="shapley")
    table = figures.to_frame()
    assert list(table["index"]) == [0, 1] and "deletion_auc" in table.columns
    assert "sensitivity_max" in table.columns or "mufidelity" in table.columns
    given = client.evaluate("diabetes-mlp", [ROW], explained.values[:1].tolist())
    assert len(given.evaluations) == 1
    result = client.audit("diabetes-mlp", [ROW] * 4, progress=False, seed=3)
    audit = result.to_frame()
    assert list(audit["index"]) == [0, 1, 2, 3] and set(names) <= set(audit.columns)
    assert "error" not in audit.columns
    downloaded = client.results_frame(result.status["id"])
    pd.testing.assert_frame_equal(downloaded, audit)
    summary = client.job_plot(result.status["id"], kind="summary")
    assert summary[:8] == b"\x89PNG\r\n\x1a\n"
    spec = client.job_plot(result.status["id"], kind="beeswarm", format="vega")
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
    path = client.job_plot(
        result.status["id"], kind="dependence", format="svg", path=tmp_path / "d.svg"
    )
    assert "<svg" in path.read_text()


TEXT = '"The food was wonderful."  Really!'


def test_text_tokens_keep_every_character() -> None:
    players = [
        {"text": "The", "start": 1, "end": 4},
        {"text": "food", "start": 5, "end": 9},
        {"text": "Really", "start": 27, "end": 33},
    ]
    assert text_tokens(TEXT, players) == ['"The ', 'food was wonderful."  ', "Really!"]
    assert text_tokens(None, players) == ["The ", "food ", "Really"]
    assert text_tokens("other text", players) == ["The ", "food ", "Really"]
    assert text_tokens(TEXT, []) == []


@pytest.mark.parametrize(
    "players",
    [
        [{"text": "The", "start": 1, "end": 4}, {"text": "Really", "start": 27, "end": 33}],
        [{"text": "food", "start": 5, "end": 9}, {"text": "The", "start": 1, "end": 4}],
        [],
    ],
)
def test_server_and_client_cut_the_same_tokens_and_rows(players: list[dict[str, Any]]) -> None:
    """format=shap (app/plot_shap.py) and to_shap() (xai/results.py, installed without the
    server) apply one rule to the same answers."""
    from app import plot_shap
    from xai import results

    for text in (TEXT, None, "other text"):
        assert plot_shap.text_tokens(text, players) == results.text_tokens(text, players)
    names = ["a", "b", "c"]
    for data in ([1, 2, 3], [[1, 2], [3]], {"a": 1, "b": 2, "c": 3}, {"a": 1}, "text", None):
        assert plot_shap.feature_row(data, names) == results.feature_row(data, names)


def test_shap_round_trip_of_text(app_client: TestClient) -> None:
    """format=shap and to_shap() keep the tokens with their spacing; shap's text plot shows
    the text as written (it used to print 'Thefoodwaswonderful')."""
    import matplotlib

    matplotlib.use("Agg")
    from xai import shap_explanation

    client = Client(http=app_client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
    texts = ["The food was wonderful.", TEXT]
    explained = client.explain("sentiment-minilm", texts)
    sx = explained.to_shap()
    r = app_client.post(
        "/v2/models/sentiment-minilm/explain/shapley/plot?format=shap", json={"inputs": texts}
    )
    assert r.status_code == 200
    fx = shap_explanation(r.json())
    for ex in (sx, fx):
        assert ex.data is not None
        for i, text in enumerate(texts):
            e = explained.explanations[i]
            tokens = list(ex[i].data)
            assert "".join(tokens) == text
            assert list(ex[i].feature_names) == [p["text"] for p in e["players"]]
            np.testing.assert_allclose(ex[i].values, e["values"])
            assert float(ex[i].base_values) == pytest.approx(e["base_value"])
            html = shap.plots.text(ex[i], display=False)
            assert isinstance(html, str)
            for token in tokens:
                assert f">{token}</div>" in html, token
    assert "".join(sx[0].data) == "The food was wonderful."
    assert list(sx[0].data) == ["The ", "food ", "was ", "wonderful."]


def test_shap_round_trip_of_a_table(app_client: TestClient) -> None:
    """Feature values and base values survive both routes; waterfall and beeswarm draw them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xai import shap_explanation

    client = Client(http=app_client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
    rows = [[v + 3 * i for v in ROW] for i in range(6)]
    explained = client.explain("diabetes-mlp", rows, seed=0)
    r = app_client.post("/v2/plots?format=shap", json=explained.raw)
    for ex in (explained.to_shap(), shap_explanation(r.json())):
        np.testing.assert_allclose(ex.data, rows)
        np.testing.assert_allclose(ex.base_values, explained.base_values)
        np.testing.assert_allclose(ex.values, explained.values)
        assert list(ex.feature_names) == explained.feature_names
        shap.plots.waterfall(ex[0], show=False)
        labels = " ".join(t.get_text() for t in plt.gcf().findobj(matplotlib.text.Text))
        assert "E[f(X)]" in labels and "f(x)" in labels
        assert any(f"= {n}" in labels for n in explained.feature_names)
        plt.close("all")
        shap.plots.beeswarm(ex, show=False)
        plt.close("all")
