"""HTTP client (httpx, sync and async) with typed results that convert to shap.Explanation
and pandas DataFrames. XAI_URL and XAI_API_KEY give the defaults of the server and the key.

Inputs, backgrounds and audit rows may be lists, numpy arrays or pandas DataFrames (columns
named as the model's features, in any order: xai/inputs.py); `target` an output, a list of
outputs or "all". Every failure is an XaiError.

An audit that ends `failed` raises JobFailed (`cancelled`: JobCancelled, a JobFailed) with the
server's message; one that ends `succeeded_with_errors` warns AuditRowsFailed and returns its
AuditResult (the failed rows in `errors`). A job body over INLINE_LIMIT bytes of JSON is
uploaded as a JSON-lines file instead (POST /v2/jobs/upload)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from xai import inputs as convert
from xai.errors import (
    AuditRowsFailed,
    JobCancelled,
    JobFailed,
    JobTimeout,
    NoExplanations,
    ServiceError,
    Unreachable,
    XaiError,
)
from xai.results import (
    AuditResult,
    Evaluated,
    Explained,
    failure_message,
    frame,
    shap_explanation,
    text_tokens,
)

FINAL = ("succeeded", "succeeded_with_errors", "failed", "cancelled")
INLINE_LIMIT = 8 * 1024 * 1024  # bytes of a job's JSON body; above, its inputs are uploaded
FORM_FIELD_LIMIT = 1024 * 1024  # the server's multipart parser takes form fields up to 1 MiB
DEFAULT_URL = "http://127.0.0.1:8000"
IMAGES = ("png", "svg")


def default_url(url: str | None = None) -> str:
    return url or os.environ.get("XAI_URL") or DEFAULT_URL


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("XAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _unreachable(http: httpx.Client | httpx.AsyncClient, exc: Exception) -> XaiError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not isinstance(exc, httpx.TransportError):  # an invalid URL, a broken stream
        return XaiError(f"request to {http.base_url} failed: {reason}")
    return Unreachable(f"cannot reach the service at {http.base_url}: {reason}")


FAILED = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError)


def _sendable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`json=` encoded here (numpy numbers as numbers; NaN and other non-JSON an XaiError)."""
    if "json" not in kwargs:
        return kwargs
    body = kwargs.pop("json")
    headers = {"Content-Type": "application/json", **(kwargs.pop("headers", None) or {})}
    return {**kwargs, "content": convert.encode(body), "headers": headers}


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise XaiError(
            f"the service answered {response.status_code} with a body that is not JSON: "
            f"{response.text[:80]!r}"
        ) from None


def _name(model: Any) -> str:
    if not isinstance(model, str) or not model or "/" in model:
        raise XaiError(f"model: a registered model's name, got {model!r}")
    return model


def _write(path: str | Path, data: bytes) -> Path:
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise XaiError(f"cannot write {path}: {exc.strerror or exc}") from None
    return Path(path)


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


def _converted(
    inputs: Any, fields: dict[str, Any], model: dict[str, Any] | None
) -> tuple[list[Any], dict[str, Any]]:
    """Instances and request fields as JSON-ready lists (background rows, target)."""
    rows = convert.instances(inputs, model, "inputs")
    out = dict(fields)
    if out.get("background") is not None:
        out["background"] = convert.instances(out["background"], model, "background")
    if "target" in out:
        out["target"] = convert.target(out["target"])
    return rows, out


def _plot_result(response: httpx.Response, fmt: str, path: str | Path | None) -> Any:
    """PNG/SVG bytes, a Vega-Lite dict or a shap.Explanation; with `path`, the file written."""
    if path is not None:
        return _write(path, response.content)
    if fmt in IMAGES:
        return response.content
    if fmt == "shap":
        return shap_explanation(_json(response))
    return _json(response)


def _submission(
    body: dict[str, Any], idempotency_key: str | None
) -> tuple[str, dict[str, Any]]:
    """The route and request arguments of a job: its JSON (POST /v2/jobs), or, when that
    encoded body is over INLINE_LIMIT bytes and the job has inputs, an upload (POST
    /v2/jobs/upload: form field `job` the job as JSON without inputs, `file` the inputs as
    JSON lines, one instance a line). The Idempotency-Key goes with either. A job whose
    fields without inputs (a large background) are over FORM_FIELD_LIMIT stays inline: the
    server's form parser would refuse its `job` field."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    content = convert.encode(body)
    inputs = body.get("inputs")
    job = b""
    if len(content) > INLINE_LIMIT and isinstance(inputs, list | tuple) and inputs:
        job = convert.encode({k: v for k, v in body.items() if k != "inputs"})
    if not job or len(job) > FORM_FIELD_LIMIT:
        headers["Content-Type"] = "application/json"
        return "/v2/jobs", {"content": content, "headers": headers}
    lines = b"".join(convert.encode(instance) + b"\n" for instance in inputs or ())
    file = ("inputs.jsonl", lines, "application/x-ndjson")
    form = {"job": job.decode()}
    return "/v2/jobs/upload", {"data": form, "files": {"file": file}, "headers": headers}


def _raise_if_failed(status: dict[str, Any]) -> None:
    """JobFailed (JobCancelled) with the server's message for an audit that ended failed
    (cancelled)."""
    state, job = status.get("status"), status.get("id")
    if state == "cancelled":
        raise JobCancelled(status.get("error") or f"audit {job} was cancelled", status)
    if state == "failed":
        raise JobFailed(status.get("error") or f"audit {job} failed", status)


def _checked(result: AuditResult) -> AuditResult:
    """The result of a finished audit; AuditRowsFailed warned when some rows failed
    (succeeded_with_errors, the server's message), JobFailed when every row did. A server
    from before succeeded_with_errors said `succeeded` for both: the rows tell."""
    errors, total = result.errors, len(result.results)
    if not errors and result.status.get("status") != "succeeded_with_errors":
        return result
    message = result.status.get("error") or failure_message(errors, total)
    if errors and len(errors) == total:
        raise JobFailed(message, result.status)
    warnings.warn(AuditRowsFailed(message), stacklevel=3)  # at the caller of audit()
    return result


def _line(line: str) -> dict[str, Any]:
    try:
        return dict(json.loads(line))
    except (ValueError, TypeError):
        raise XaiError(f"a result line that is not a JSON object: {line[:80]!r}") from None


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
        try:
            self.http = http or httpx.Client(base_url=default_url(base_url), timeout=timeout)
        except FAILED as exc:
            raise XaiError(f"base_url {default_url(base_url)!r}: {exc}") from None
        self.http.headers.update(auth_headers(api_key))
        self._models: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One call; `json=` is encoded by the client (numpy numbers welcome)."""
        sent = _sendable(kwargs)
        try:
            return _check(self.http.request(method, url, **sent))
        except FAILED as exc:
            raise _unreachable(self.http, exc) from None

    def models(self) -> list[dict[str, Any]]:
        return list(_json(self.request("GET", "/v2/models")))

    def model(self, name: str) -> dict[str, Any]:
        return dict(_json(self.request("GET", f"/v2/models/{_name(name)}")))

    def _metadata(self, name: str, *values: Any) -> dict[str, Any] | None:
        """The model's metadata when one of `values` is an array or DataFrame (fetched once)."""
        if not any(convert.needs_model(v) for v in values):
            return None
        if name not in self._models:
            self._models[name] = self.model(name)
        return self._models[name]

    def _request_body(self, model: str, inputs: Any, fields: dict[str, Any]) -> dict[str, Any]:
        meta = self._metadata(_name(model), inputs, fields.get("background"))
        rows, converted = _converted(inputs, fields, meta)
        return _explain_body(rows, **converted)

    def explain(
        self,
        model: str,
        inputs: Any,
        *,
        explainer: str = "shapley",
        use_cache: bool = True,
        **fields: Any,
    ) -> Explained:
        """inputs: a list, numpy array or DataFrame. fields: target (an output, a list of
        outputs or "all"), seed, budget, background, parameters (the explain request)."""
        headers = {} if use_cache else {"Cache-Control": "no-cache"}
        r = self.request(
            "POST",
            f"/v2/models/{model}/explain/{explainer}",
            json=self._request_body(model, inputs, fields),
            headers=headers,
        )
        return Explained(_json(r))

    def plot(
        self,
        model: str,
        inputs: Any,
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
            json=self._request_body(model, inputs, fields),
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
        inputs: Any,
        attributions: Any = None,
        *,
        explainer: str | dict[str, Any] | None = None,
        **fields: Any,
    ) -> Evaluated:
        """Deletion/insertion AUC, MuFidelity, sensitivity of `attributions` or of an explainer
        (a name, or {"name": ..., "parameters": ...}). fields: target, background, seed,
        patch_size, players, evaluation."""
        call = {"name": explainer} if isinstance(explainer, str) else explainer
        body = {"attributions": attributions, "explainer": call, **fields}
        r = self.request(
            "POST", f"/v2/models/{model}/evaluate", json=self._request_body(model, inputs, body)
        )
        return Evaluated(_json(r))

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        """Submit a job (the JSON of POST /v2/jobs); its id. A body over INLINE_LIMIT bytes
        of JSON with inputs goes as an upload (POST /v2/jobs/upload, the inputs as JSON
        lines): the same job, the same Idempotency-Key."""
        url, sent = _submission(body, idempotency_key)
        return str(_json(self.request("POST", url, **sent))["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(_json(self.request("GET", f"/v2/jobs/{job_id}")))

    def jobs(self, limit: int = 100, status: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
        return list(_json(self.request("GET", "/v2/jobs", params=params)))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(_json(self.request("DELETE", f"/v2/jobs/{job_id}")))

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
                        yield _line(line)
        except FAILED as exc:
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
        """Poll until the job finishes (a status in FINAL: succeeded, succeeded_with_errors,
        failed, cancelled) and return its status, optionally with a tqdm progress bar;
        JobTimeout after `timeout` seconds."""
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
                    raise JobTimeout(f"job {job_id} still {status['status']} after {timeout} s")
                time.sleep(poll)
        finally:
            if bar is not None:
                bar.close()

    def audit(
        self,
        model: str,
        inputs: Any,
        *,
        explainer: str = "shapley",
        progress: bool = True,
        idempotency_key: str | None = None,
        chunk_size: int | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> AuditResult:
        """Submit an audit of `inputs` (a list of rows or {feature: value} objects, a numpy
        array or a DataFrame), show progress, wait, and download every result.

        Raises JobFailed (the server's `error` as message, the status as `status`) when the
        job ends `failed` (every row failed, or the job did), JobCancelled (a JobFailed) when
        it ends `cancelled`, JobTimeout after `timeout` seconds. Ends `succeeded_with_errors`
        (some rows failed): warns AuditRowsFailed with the server's message and returns the
        result (the failures in `AuditResult.errors`). Inputs whose JSON is over INLINE_LIMIT
        bytes (8 MiB) are uploaded as a JSON-lines file (POST /v2/jobs/upload)."""
        explained = self._request_body(model, inputs, {**fields, "chunk_size": chunk_size})
        body = {"kind": "audit", "model": model, "explainer": explainer, **explained}
        job_id = self.submit(body, idempotency_key)
        status = self.wait(job_id, progress=progress, timeout=timeout)
        _raise_if_failed(status)
        return _checked(AuditResult(status, list(self.results(job_id))))


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
        try:
            self.http = http or httpx.AsyncClient(base_url=default_url(base_url), timeout=timeout)
        except FAILED as exc:
            raise XaiError(f"base_url {default_url(base_url)!r}: {exc}") from None
        self.http.headers.update(auth_headers(api_key))
        self._models: dict[str, dict[str, Any]] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        sent = _sendable(kwargs)
        try:
            return _check(await self.http.request(method, url, **sent))
        except FAILED as exc:
            raise _unreachable(self.http, exc) from None

    async def models(self) -> list[dict[str, Any]]:
        return list(_json(await self.request("GET", "/v2/models")))

    async def model(self, name: str) -> dict[str, Any]:
        return dict(_json(await self.request("GET", f"/v2/models/{_name(name)}")))

    async def _request_body(
        self, model: str, inputs: Any, fields: dict[str, Any]
    ) -> dict[str, Any]:
        meta = None
        if any(convert.needs_model(v) for v in (inputs, fields.get("background"))):
            if _name(model) not in self._models:
                self._models[model] = await self.model(model)
            meta = self._models[model]
        rows, converted = _converted(inputs, fields, meta)
        return _explain_body(rows, **converted)

    async def explain(
        self,
        model: str,
        inputs: Any,
        *,
        explainer: str = "shapley",
        use_cache: bool = True,
        **fields: Any,
    ) -> Explained:
        headers = {} if use_cache else {"Cache-Control": "no-cache"}
        r = await self.request(
            "POST",
            f"/v2/models/{model}/explain/{explainer}",
            json=await self._request_body(model, inputs, fields),
            headers=headers,
        )
        return Explained(_json(r))

    async def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> str:
        """As Client.submit: inline JSON, or an upload over INLINE_LIMIT bytes."""
        url, sent = _submission(body, idempotency_key)
        return str(_json(await self.request("POST", url, **sent))["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict(_json(await self.request("GET", f"/v2/jobs/{job_id}")))

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(_json(await self.request("DELETE", f"/v2/jobs/{job_id}")))

    async def results(self, job_id: str, offset: int = 0) -> list[dict[str, Any]]:
        r = await self.request("GET", f"/v2/jobs/{job_id}/results", params={"offset": offset})
        return [_line(line) for line in r.text.splitlines() if line]

    async def wait(
        self, job_id: str, *, poll: float = 0.5, timeout: float | None = None
    ) -> dict[str, Any]:
        """Poll until the job's status is in FINAL and return it; JobTimeout after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := await self.job(job_id))["status"] not in FINAL:
            if deadline is not None and time.monotonic() > deadline:
                raise JobTimeout(f"job {job_id} still {status['status']} after {timeout} s")
            await asyncio.sleep(poll)
        return status

    async def audit(
        self,
        model: str,
        inputs: Any,
        *,
        explainer: str = "shapley",
        poll: float = 0.5,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> AuditResult:
        """As Client.audit: JobFailed / JobCancelled for a failed / cancelled audit,
        AuditRowsFailed warned for succeeded_with_errors, large inputs uploaded."""
        explained = await self._request_body(model, inputs, fields)
        body = {"kind": "audit", "model": model, "explainer": explainer, **explained}
        job_id = await self.submit(body, idempotency_key)
        status = await self.wait(job_id, poll=poll, timeout=timeout)
        _raise_if_failed(status)
        return _checked(AuditResult(status, await self.results(job_id)))


__all__ = [
    "AsyncClient",
    "AuditResult",
    "AuditRowsFailed",
    "Client",
    "Evaluated",
    "Explained",
    "JobCancelled",
    "JobFailed",
    "JobTimeout",
    "NoExplanations",
    "ServiceError",
    "Unreachable",
    "XaiError",
    "shap_explanation",
    "text_tokens",
]
