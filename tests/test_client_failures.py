"""Audits whose rows fail, against the real app: the client stops on every final status
(succeeded_with_errors included), raises JobFailed / JobCancelled for failed / cancelled
audits, warns AuditRowsFailed when some rows failed, leaves failed rows out of to_shap() and
names them in `errors`; large audits go as a JSON-lines upload (POST /v2/jobs/upload).

Rows fail for real: an instance of 1e38 in every feature overflows breast-cancer-mlp (its
outputs are not finite), so the server answers that row with `non_finite_output`."""

from __future__ import annotations

import asyncio
import json
import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

import xai.client
from tests.test_client_inputs import cli
from xai import (
    AsyncClient,
    AuditResult,
    AuditRowsFailed,
    Client,
    JobCancelled,
    JobFailed,
    NoExplanations,
    XaiError,
)
from xai.client import FINAL

ROOT = Path(__file__).resolve().parents[1]
BREAST = "breast-cancer-mlp"
HUGE = [1e38] * 30  # a row whose explanation fails: the model's outputs overflow
FAILS = "non_finite_output"


@pytest.fixture(scope="module")
def app_client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """Breast-cancer rows as sklearn ships them (the docs' example data)."""
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(as_frame=True).frame.drop(columns="target")


@pytest.fixture()
def client(app_client: TestClient) -> Iterator[Client]:
    yield Client(http=app_client)  # type: ignore[arg-type]  # TestClient is an httpx2.Client
    app_client.event_hooks["request"] = []


class Sent:
    """The POSTs a client sent: path, headers and body size (an httpx request hook)."""

    def __init__(self, http: Any) -> None:  # an httpx Client, AsyncClient or TestClient
        self.posts: list[tuple[str, dict[str, str], int]] = []
        hook = self.async_hook if isinstance(http, httpx.AsyncClient) else self.hook
        http.event_hooks["request"] = [hook]

    def hook(self, request: httpx.Request) -> None:
        if request.method == "POST":
            request.read()
            self.posts.append((request.url.path, dict(request.headers), len(request.content)))

    async def async_hook(self, request: httpx.Request) -> None:
        self.hook(request)

    @property
    def paths(self) -> list[str]:
        return [p for p, _, _ in self.posts]


def small(frame: pd.DataFrame) -> dict[str, Any]:
    """Fast audit fields: 10 background rows, 400 coalitions."""
    return {"target": 1, "background": frame.iloc[100:110], "budget": 4000, "seed": 0}


def test_final_statuses_include_succeeded_with_errors() -> None:
    assert set(FINAL) == {"succeeded", "succeeded_with_errors", "failed", "cancelled"}


def test_some_rows_fail_warns_and_keeps_the_others(client: Client, frame: pd.DataFrame) -> None:
    rows = [HUGE, frame.iloc[0].tolist(), frame.iloc[1].tolist()]
    with pytest.warns(AuditRowsFailed, match=FAILS) as caught:
        result = client.audit(BREAST, rows, progress=False, **small(frame))
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the caller
    assert issubclass(AuditRowsFailed, UserWarning)
    # server change: the job ends succeeded_with_errors, with its message and first errors
    assert result.status["status"] == "succeeded_with_errors"
    assert str(caught[0].message) == result.status["error"]
    assert "1 of 3 rows failed" in result.status["error"]
    assert result.summary["errors"] == 1
    assert [e["index"] for e in result.summary["first_errors"]] == [0]
    # the client's view of the rows (any server)
    assert result.errors == [{"index": 0, "code": FAILS, "error": result.results[0]["error"]}]
    sx = result.to_shap()
    assert sx.values.shape == (2, 30)
    np.testing.assert_allclose(sx.data, frame.iloc[:2].to_numpy())
    assert list(sx.instance_names) == ["1: benign", "2: benign"]  # the rows' audit indices
    assert result.explained().indices == (1, 2)
    table = result.to_frame()
    assert list(table["index"]) == [0, 1, 2]
    assert table["error"].notna().tolist() == [True, False, False]
    assert table.loc[0, "code"] == FAILS and np.isnan(table.loc[0, "base_value"])


def test_every_row_fails_raises_job_failed(client: Client, frame: pd.DataFrame) -> None:
    with pytest.raises(JobFailed, match=FAILS) as err:
        client.audit(BREAST, [HUGE, HUGE, HUGE], progress=False, **small(frame))
    assert isinstance(err.value, XaiError) and "\n" not in str(err.value)
    status = err.value.status
    assert status["id"] == err.value.job_id and status["summary"]["errors"] == 3
    # server change: failed, with the server's message and first errors
    assert status["status"] == "failed"
    assert str(err.value) == status["error"]
    assert len(status["summary"]["first_errors"]) == 3
    # the results of such a job convert to a table of errors, not to shap
    result = AuditResult(client.job(status["id"]), list(client.results(status["id"])))
    assert [e["code"] for e in result.errors] == [FAILS] * 3
    assert list(result.to_frame()["code"]) == [FAILS] * 3
    for convert in (result.to_shap, result.explained):
        with pytest.raises(NoExplanations, match=f"row 0: .*non-finite.*{FAILS}"):
            convert()
    assert issubclass(NoExplanations, XaiError)
    with pytest.raises(NoExplanations, match="no results"):
        AuditResult({"id": "x", "status": "succeeded"}, []).to_shap()


def test_wait_stops_on_succeeded_with_errors(client: Client, frame: pd.DataFrame) -> None:
    """Server change: without succeeded_with_errors in FINAL, wait would time out here."""
    body = {"kind": "audit", "model": BREAST, "inputs": [HUGE, frame.iloc[0].tolist()],
            "target": 1, "background": frame.iloc[100:110].to_numpy(), "budget": 4000}  # fmt: skip
    status = client.wait(client.submit(body), poll=0.05, timeout=120)
    assert status["status"] == "succeeded_with_errors"


def test_the_documented_audit_example(client: Client, frame: pd.DataFrame) -> None:
    """docs/client.md: the audit of 20 rows converts to shap; the same audit without its
    background (100 default rows: 4000 evaluations are 40 coalitions, too few) is an XaiError
    naming the budget (a 400 at submission, or JobFailed), never a TypeError."""
    audit = client.audit(
        BREAST, frame.iloc[:20], target=1, budget=4000, background=frame.iloc[100:110],
        progress=False,
    )  # fmt: skip
    assert audit.status["status"] == "succeeded" and audit.errors == []
    np.testing.assert_allclose(audit.to_shap().data[:1, :3], [[17.99, 10.38, 122.8]])
    with pytest.raises(XaiError, match="budget"):
        client.audit(BREAST, frame.iloc[:20], target=1, budget=4000, progress=False)


def test_large_audits_are_uploaded(
    client: Client, app_client: TestClient, frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over INLINE_LIMIT bytes of JSON the inputs go as a JSON-lines file: the same job as
    inline (same values, inputs kept), the same Idempotency-Key."""
    sent = Sent(app_client)
    rows = frame.iloc[:4]
    inline = client.audit(BREAST, rows, progress=False, **small(frame))
    assert sent.paths[-1] == "/v2/jobs"
    monkeypatch.setattr(xai.client, "INLINE_LIMIT", 1000)
    key = f"upload-{random.getrandbits(64):x}"
    uploaded = client.audit(BREAST, rows, progress=False, idempotency_key=key, **small(frame))
    path, headers, _ = sent.posts[-1]
    assert path == "/v2/jobs/upload" and headers["idempotency-key"] == key
    assert headers["content-type"].startswith("multipart/form-data")
    np.testing.assert_allclose(uploaded.to_shap().values, inline.to_shap().values)
    np.testing.assert_allclose(uploaded.to_shap().data, rows.to_numpy())
    again = client.audit(BREAST, rows, progress=False, idempotency_key=key, **small(frame))
    assert again.status["id"] == uploaded.status["id"]  # the key names the same job
    with pytest.warns(AuditRowsFailed, match=FAILS):  # failures come back from uploads too
        partly = client.audit(BREAST, [HUGE, *rows.values.tolist()], progress=False,
                              **small(frame))  # fmt: skip
    assert [e["index"] for e in partly.errors] == [0] and sent.paths[-1] == "/v2/jobs/upload"
    # a job whose fields alone (here its background) pass the server's 1 MiB form field
    # limit stays inline
    monkeypatch.setattr(xai.client, "FORM_FIELD_LIMIT", 100)
    kept = client.audit(BREAST, rows, progress=False, **small(frame))
    assert sent.paths[-1] == "/v2/jobs" and kept.status["status"] == "succeeded"


def test_a_body_over_8_mib_is_uploaded(client: Client, app_client: TestClient) -> None:
    """The real threshold: rows whose JSON is over 8 MiB go as an upload (well under the
    server's 16 MiB body limit); the job holds every row. Cancelled at once."""
    sent = Sent(app_client)
    rng = np.random.default_rng(0)
    rows = rng.uniform(1.0, 20.0, size=(15_000, 30)).tolist()  # ~600 bytes of JSON each
    body = {"kind": "audit", "model": BREAST, "inputs": rows, "target": 1, "budget": 4000,
            "background": rows[:10]}  # fmt: skip
    assert len(json.dumps(body)) > xai.client.INLINE_LIMIT == 8 * 1024 * 1024
    key = f"big-{random.getrandbits(64):x}"
    job_id = client.submit(body, idempotency_key=key)
    try:
        path, headers, size = sent.posts[-1]
        assert path == "/v2/jobs/upload" and headers["idempotency-key"] == key
        assert xai.client.INLINE_LIMIT < size < 16 * 1024 * 1024
        assert client.job(job_id)["progress"]["total"] == 15_000
        small_body = {**body, "inputs": rows[:1]}
        assert client.submit(small_body, idempotency_key=key) == job_id  # inline, same key
        assert sent.paths[-1] == "/v2/jobs"
    finally:
        client.cancel(job_id)


def test_async_client_failures_and_upload(
    app_client: TestClient, frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = small(frame)
    good = frame.iloc[:2].values.tolist()

    async def run() -> None:
        transport = httpx.ASGITransport(app=app_client.app)
        http = httpx.AsyncClient(transport=transport, base_url="http://test")
        sent = Sent(http)
        async with AsyncClient(http=http) as client:
            with pytest.warns(AuditRowsFailed, match=FAILS) as caught:
                result = await client.audit(BREAST, [*good, HUGE], poll=0.05, **fields)
            assert caught[0].filename == __file__
            assert [e["index"] for e in result.errors] == [2]
            assert result.to_shap().values.shape == (2, 30)
            assert result.status["status"] == "succeeded_with_errors"  # server change
            with pytest.raises(JobFailed, match=FAILS) as err:
                await client.audit(BREAST, [HUGE, HUGE], poll=0.05, **fields)
            assert err.value.status["status"] == "failed"  # server change
            monkeypatch.setattr(xai.client, "INLINE_LIMIT", 1000)
            key = f"async-{random.getrandbits(64):x}"
            uploaded = await client.audit(
                BREAST, frame.iloc[:3], poll=0.05, idempotency_key=key, **fields
            )
            path, headers, _ = sent.posts[-1]
            assert path == "/v2/jobs/upload" and headers["idempotency-key"] == key
            assert uploaded.status["status"] == "succeeded"
            np.testing.assert_allclose(uploaded.to_shap().data, frame.iloc[:3].to_numpy())
            body = {"kind": "audit", "model": BREAST, "inputs": [HUGE, good[0]], **fields,
                    "background": frame.iloc[100:110].to_numpy()}  # fmt: skip
            status = await client.wait(await client.submit(body), poll=0.05, timeout=120)
            assert status["status"] == "succeeded_with_errors"  # server change

    asyncio.run(run())


def test_a_cancelled_audit_raises_job_cancelled(inprocess_server: str) -> None:
    """A real server: one coroutine audits, another submits the same Idempotency-Key (the same
    job) and cancels it; the audit raises JobCancelled, a JobFailed."""
    seed = random.getrandbits(31)  # nothing from the cache: the job runs long enough
    key = f"cancel-{seed}"
    rows = [[10.0 + i / 100] * 30 for i in range(50)]
    fields: dict[str, Any] = {"target": 1, "budget": 30000, "seed": seed}

    async def run() -> None:
        async with AsyncClient(inprocess_server) as auditor, AsyncClient(inprocess_server) as other:

            async def cancel() -> None:
                body = {"kind": "audit", "model": BREAST, "explainer": "shapley",
                        "inputs": rows, **fields}  # fmt: skip
                job_id = await other.submit(body, idempotency_key=key)
                await other.cancel(job_id)

            audit = auditor.audit(BREAST, rows, poll=0.05, idempotency_key=key, **fields)
            outcome = await asyncio.gather(audit, cancel(), return_exceptions=True)
            err = outcome[0]
            assert isinstance(err, JobCancelled) and isinstance(err, JobFailed), outcome
            assert err.status["status"] == "cancelled" and "cancelled" in str(err)

    asyncio.run(run())


def test_cli_audit_with_failed_rows(
    inprocess_server: str, frame: pd.DataFrame, tmp_path: Path
) -> None:
    """Some rows failed: the results are written (errors in their column), one warning line,
    exit 1. Every row failed: one error line, nothing written, exit 1."""
    good = frame.iloc[:2].values.tolist()
    partly, every = tmp_path / "partly.jsonl", tmp_path / "every.jsonl"
    partly.write_text("".join(json.dumps(r) + "\n" for r in [good[0], HUGE, good[1]]))
    every.write_text(json.dumps(HUGE) + "\n")
    out = tmp_path / "out.csv"
    base = ["--url", inprocess_server, "audit", BREAST, "--no-progress", "--target", "1",
            "--budget", "8000"]  # fmt: skip
    done = cli(*base, str(partly), "-o", str(out))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [x for x in lines if x.startswith("xai: warning: ")], done.stderr
    assert FAILS in done.stderr and "Traceback" not in done.stderr
    table = pd.read_csv(out)
    assert list(table["index"]) == [0, 1, 2] and list(table["code"].notna()) == [0, 1, 0]
    failed = cli(*base, str(every), "-o", str(tmp_path / "none.csv"))
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.startswith("xai: error: ") and FAILS in failed.stderr
    assert not (tmp_path / "none.csv").exists()


def test_warnings_can_be_errors(client: Client, frame: pd.DataFrame) -> None:
    """AuditRowsFailed is an ordinary warning: a filter turns it into an exception."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditRowsFailed)
        with pytest.raises(AuditRowsFailed):
            client.audit(BREAST, [HUGE, frame.iloc[0].tolist()], progress=False, **small(frame))
