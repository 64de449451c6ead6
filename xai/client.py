"""HTTP client (httpx, sync and async) with typed results that convert to shap.Explanation
and pandas DataFrames. XAI_URL and XAI_API_KEY give the defaults of the server and the key."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from xai.results import AuditResult, Evaluated, Explained, frame, shap_explanation, text_tokens

FINAL = ("succeeded", "failed", "cancelled")
DEFAULT_URL = "http://127.0.0.1:8000"
IMAGES = ("png", "svg")


class XaiError(Exception):
    """Anything the client reports: the message is one line, fit for a terminal."""


class Unreachable(XaiError):
    """No answer from the server (refused, unknown host, timed out)."""


class ServiceError(XaiError):
    """A 4xx/5xx answer: the service's message, machine code and HTTP status."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        message = body.get("error") if isinstance(body, dict) else str(body)[:200]
        if status == 401:
            message = f"{message} (set XAI_API_KEY or pass api_key / --api-key)"
        super().__init__(f"{status} {self.code}: {message}")


def default_url(url: str | None = None) -> str:
    return url or os.environ.get("XAI_URL") or DEFAULT_URL


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("XAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _unreachable(http: httpx.Client | httpx.AsyncClient, exc: httpx.TransportError) -> Unreachable:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return Unreachable(f"cannot reach the service at {http.base_url}: {reason}")


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        raise ServiceError(response.status_code, body)
    return response


def _explain_body(inputs: list[Any], **fields: Any) -> dict[str, Any]:
    return {"inputs": inputs, **{k: v for k, v in fields.items() if v is not None}}


def _plot_result(response: httpx.Response, fmt: str, path: str | Path | None) -> Any:
    """PNG/SVG bytes, a Vega-Lite dict or a shap.Explanation; with `path`, the file written."""
    if path is not None:
        Path(path).write_bytes(response.content)
        return Path(path)
    if fmt in IMAGES:
        return response.content
    if fmt == "shap":
        return shap_explanation(response.json())
    return response.json()


class Client:
    """Synchronous client. `http` may be any httpx.Client (e.g. FastAPI's TestClient).

    base_url: default XAI_URL, else http://127.0.0.1:8000; api_key: default XAI_API_KEY.
    Every failure raises an XaiError: ServiceError for an error answer, Unreachable when no
    answer came.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 120,
        http: httpx.Client | None = None,
    ) -> None:
        self.http = http or httpx.Client(base_url=default_url(base_url), timeout=timeout)
        self.http.headers.update(auth_headers(api_key))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return _check(self.http.request(method, url, **kwargs))
        except httpx.TransportError as exc:
            raise _unreachable(self.http, exc) from None

    def models(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/v2/models").json())

    def model(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v2/models/{name}").json())

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
        r = self.request(
            "POST",
            f"/v2/models/{model}/explain/{explainer}",
            json=_explain_body(inputs, **fields),
            headers=headers,
        )
        return Explained(r.json())

    def plot(
        self,
        model: str,
        inputs: list[Any],
        *,
        explainer: str = "shapley",
        format: str = "png",
        kind: str = "auto",
        index: int = 0,
        max_features: int = 20,
        path: str | Path | None = None,
        **fields: Any,
    ) -> Any:
        """Explain and plot in one call: PNG/SVG bytes, a Vega-Lite dict or (format="shap") a
        shap.Explanation; with `path`, the file is written and its Path returned."""
        r = self.request(
            "POST",
            f"/v2/models/{model}/explain/{explainer}/plot",
            params={"format": format, "kind": kind, "index": index, "max_features": max_features},
            json=_explain_body(inputs, **fields),
        )
        return _plot_result(r, format, path)

    def render(
        self,
        explained: Explained,
        *,
        format: str = "png",
        kind: str = "auto",
        index: int = 0,
        max_features: int = 20,
        path: str | Path | None = None,
    ) -> Any:
        """Plot an explanation already at hand (POST /v2/plots): nothing is recomputed."""
        r = self.request(
            "POST",
            "/v2/plots",
            params={"format": format, "kind": kind, "index": index, "max_features": max_features},
            json=explained.raw,
        )
        return _plot_result(r, format, path)

    def evaluate(
        self,
        model: str,
        inputs: list[Any],
        attributions: list[list[float]] | None = None,
        *,
        explainer: str | dict[str, Any] | None = None,
        **fields: Any,
    ) -> Evaluated:
        """Deletion/insertion AUC, MuFidelity, sensitivity of `attributions` or of an explainer
        (a name, or {"name": ..., "parameters": ...}). fields: target, background, seed,
        patch_size, players, evaluation."""
        call = {"name": explainer} if isinstance(explainer, str) else explainer
        body = {"attributions": attributions, "explainer": call, **fields}
        r = self.request("POST", f"/v2/models/{model}/evaluate", json=_explain_body(inputs, **body))
        return Evaluated(r.json())

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return str(self.request("POST", "/v2/jobs", json=body, headers=headers).json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v2/jobs/{job_id}").json())

    def jobs(self, limit: int = 100, status: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
        return list(self.request("GET", "/v2/jobs", params=params).json())

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("DELETE", f"/v2/jobs/{job_id}").json())

    def results(self, job_id: str, offset: int = 0) -> Iterator[dict[str, Any]]:
        """Result lines from `offset` (resume a download where it stopped)."""
        try:
            with self.http.stream(
                "GET", f"/v2/jobs/{job_id}/results", params={"offset": offset}
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    _check(r)
                for line in r.iter_lines():
                    if line:
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise _unreachable(self.http, exc) from None

    def results_frame(self, job_id: str) -> Any:
        """A job's results as a pandas DataFrame, one row per instance (see xai.results.frame)."""
        return frame(list(self.results(job_id)))

    def job_plot(
        self,
        job_id: str,
        *,
        kind: str = "summary",
        feature: str | None = None,
        format: str = "png",
        path: str | Path | None = None,
        **params: Any,
    ) -> Any:
        """A global view of a finished audit (summary, beeswarm, dependence): PNG/SVG bytes or a
        Vega-Lite dict; with `path`, the file is written and its Path returned."""
        query = {"kind": kind, "format": format, **params}
        if feature is not None:
            query["feature"] = feature
        r = self.request("GET", f"/v2/jobs/{job_id}/plot", params=query)
        return _plot_result(r, format, path)

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
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 120,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.http = http or httpx.AsyncClient(base_url=default_url(base_url), timeout=timeout)
        self.http.headers.update(auth_headers(api_key))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return _check(await self.http.request(method, url, **kwargs))
        except httpx.TransportError as exc:
            raise _unreachable(self.http, exc) from None

    async def models(self) -> list[dict[str, Any]]:
        return list((await self.request("GET", "/v2/models")).json())

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
        r = await self.request(
            "POST",
            f"/v2/models/{model}/explain/{explainer}",
            json=_explain_body(inputs, **fields),
            headers=headers,
        )
        return Explained(r.json())

    async def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        r = await self.request("POST", "/v2/jobs", json=body, headers=headers)
        return str(r.json()["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self.request("GET", f"/v2/jobs/{job_id}")).json())

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return dict((await self.request("DELETE", f"/v2/jobs/{job_id}")).json())

    async def results(self, job_id: str, offset: int = 0) -> list[dict[str, Any]]:
        r = await self.request("GET", f"/v2/jobs/{job_id}/results", params={"offset": offset})
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


__all__ = [
    "AsyncClient",
    "AuditResult",
    "Client",
    "Evaluated",
    "Explained",
    "ServiceError",
    "Unreachable",
    "XaiError",
    "shap_explanation",
    "text_tokens",
]
