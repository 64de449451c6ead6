"""HTTP client (httpx, sync and async) with typed results that convert to shap.Explanation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

FINAL = ("succeeded", "failed", "cancelled")


class ServiceError(Exception):
    """A 4xx/5xx answer: the service's message, machine code and HTTP status."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        message = body.get("error") if isinstance(body, dict) else str(body)
        super().__init__(f"{status} {self.code}: {message}")


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        raise ServiceError(response.status_code, body)
    return response.json()


@dataclass(frozen=True)
class Explained:
    """An explanation of one or more instances, as the service returned it."""

    raw: dict[str, Any]

    @property
    def explanations(self) -> list[dict[str, Any]]:
        return list(self.raw["data"]["explanations"])

    @property
    def feature_names(self) -> list[str]:
        return list(self.raw["data"]["feature_names"])

    @property
    def values(self) -> np.ndarray:
        return np.array([e["values"] for e in self.explanations])  # [m, n]

    @property
    def base_values(self) -> np.ndarray:
        return np.array([e["base_value"] for e in self.explanations])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.raw["meta"])

    def to_shap(self) -> Any:
        """A shap.Explanation with values, base values, data and feature names."""
        import shap

        data = np.array([np.ravel(e["data"]) for e in self.explanations])
        return shap.Explanation(
            values=self.values,
            base_values=self.base_values,
            data=data if data.shape == self.values.shape else None,
            feature_names=self.feature_names,
            output_names=[e["output_name"] for e in self.explanations],
        )


def shap_explanation(arguments: dict[str, Any]) -> Any:
    """A shap.Explanation from a `format=shap` answer (POST .../plot?format=shap or /v2/plots).

    Text players differ per instance, so their values and words become object arrays of
    arrays, the ragged form shap's text plot reads.
    """
    import shap

    def array(value: Any) -> np.ndarray:
        rows = [np.asarray(row) for row in value]
        if len({row.shape for row in rows}) <= 1:
            return np.asarray(value)
        out = np.empty(len(rows), dtype=object)
        out[:] = rows
        return out

    ragged = ("values", "data", "error_std")
    kwargs = {k: array(v) if k in ragged else v for k, v in arguments.items()}
    data = kwargs.get("data")
    if isinstance(data, np.ndarray) and data.dtype == object:
        kwargs["feature_names"] = data  # text: the words name the players per instance
    kwargs["base_values"] = np.asarray(kwargs["base_values"])
    return shap.Explanation(**kwargs)


@dataclass(frozen=True)
class AuditResult:
    """A finished job: its final status (with summary) and every result line."""

    status: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)

    def to_shap(self) -> Any:
        ok = [r for r in self.results if "explanation" in r]
        return Explained(
            {
                "data": {
                    "feature_names": ok[0]["feature_names"] if ok else [],
                    "explanations": [r["explanation"] for r in ok],
                },
                "meta": {},
            }
        ).to_shap()


def _explain_body(inputs: list[Any], **fields: Any) -> dict[str, Any]:
    return {"inputs": inputs, **{k: v for k, v in fields.items() if v is not None}}


class Client:
    """Synchronous client. `http` may be any httpx.Client (e.g. FastAPI's TestClient)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 120,
        http: httpx.Client | None = None,
    ) -> None:
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def models(self) -> list[dict[str, Any]]:
        return list(_check(self.http.get("/v2/models")))

    def model(self, name: str) -> dict[str, Any]:
        return dict(_check(self.http.get(f"/v2/models/{name}")))

    def explain(
        self,
        model: str,
        inputs: list[Any],
        *,
        explainer: str = "shapley",
        use_cache: bool = True,
        **fields: Any,
    ) -> Explained:
        """fields: target, seed, budget, background, parameters (the explain request)."""
        headers = {} if use_cache else {"Cache-Control": "no-cache"}
        r = self.http.post(
            f"/v2/models/{model}/explain/{explainer}",
            json=_explain_body(inputs, **fields),
            headers=headers,
        )
        return Explained(_check(r))

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return str(_check(self.http.post("/v2/jobs", json=body, headers=headers))["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(_check(self.http.get(f"/v2/jobs/{job_id}")))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(_check(self.http.delete(f"/v2/jobs/{job_id}")))

    def results(self, job_id: str, offset: int = 0) -> Iterator[dict[str, Any]]:
        """Result lines from `offset` (resume a download where it stopped)."""
        with self.http.stream("GET", f"/v2/jobs/{job_id}/results", params={"offset": offset}) as r:
            if r.status_code >= 400:
                r.read()
                _check(r)
            for line in r.iter_lines():
                if line:
                    yield json.loads(line)

    def wait(
        self,
        job_id: str,
        *,
        poll: float = 0.5,
        progress: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the job finishes, optionally with a tqdm progress bar."""
        bar = None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                status = self.job(job_id)
                if progress:
                    if bar is None:
                        from tqdm import tqdm

                        bar = tqdm(total=status["progress"]["total"], unit="inst")
                    bar.update(status["progress"]["done"] - bar.n)
                if status["status"] in FINAL:
                    return status
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {job_id} still {status['status']}")
                time.sleep(poll)
        finally:
            if bar is not None:
                bar.close()

    def audit(
        self,
        model: str,
        inputs: list[Any],
        *,
        explainer: str = "shapley",
        progress: bool = True,
        idempotency_key: str | None = None,
        chunk_size: int | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> AuditResult:
        """Submit an audit, show progress, wait, and download every result."""
        body = {
            "kind": "audit",
            "model": model,
            "explainer": explainer,
            "inputs": inputs,
            **{k: v for k, v in {**fields, "chunk_size": chunk_size}.items() if v is not None},
        }
        job_id = self.submit(body, idempotency_key)
        status = self.wait(job_id, progress=progress, timeout=timeout)
        return AuditResult(status, list(self.results(job_id)))


class AsyncClient:
    """The same calls with httpx.AsyncClient."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 120,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def models(self) -> list[dict[str, Any]]:
        return list(_check(await self.http.get("/v2/models")))

    async def explain(
        self,
        model: str,
        inputs: list[Any],
        *,
        explainer: str = "shapley",
        use_cache: bool = True,
        **fields: Any,
    ) -> Explained:
        headers = {} if use_cache else {"Cache-Control": "no-cache"}
        r = await self.http.post(
            f"/v2/models/{model}/explain/{explainer}",
            json=_explain_body(inputs, **fields),
            headers=headers,
        )
        return Explained(_check(r))

    async def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return str(_check(await self.http.post("/v2/jobs", json=body, headers=headers))["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict(_check(await self.http.get(f"/v2/jobs/{job_id}")))

    async def results(self, job_id: str, offset: int = 0) -> list[dict[str, Any]]:
        r = await self.http.get(f"/v2/jobs/{job_id}/results", params={"offset": offset})
        if r.status_code >= 400:
            _check(r)
        return [json.loads(line) for line in r.text.splitlines() if line]

    async def audit(
        self,
        model: str,
        inputs: list[Any],
        *,
        explainer: str = "shapley",
        poll: float = 0.5,
        **fields: Any,
    ) -> AuditResult:
        body = {
            "kind": "audit",
            "model": model,
            "explainer": explainer,
            "inputs": inputs,
            **{k: v for k, v in fields.items() if v is not None},
        }
        job_id = await self.submit(body)
        while (status := await self.job(job_id))["status"] not in FINAL:
            await asyncio.sleep(poll)
        return AuditResult(status, await self.results(job_id))
