"""Remote models: rows forwarded to an Open Inference Protocol endpoint (a black box).

Speaks the OIP REST protocol as MLServer, Triton and KServe answer it: one FP32 input tensor
(MLServer's sklearn runtime decodes a single input whatever its name), an optional requested
output by name (MLServer's sklearn runtime answers `predict` unless asked for `predict_proba`),
and outputs of any numeric datatype (FP64 probabilities, INT64 labels) read back as float32.

Nothing the remote answers goes into an error's message (its body, output names, datatypes):
it is kept apart in `RemoteModelError.remote_detail`, which only admin keys see (and in the
message itself while an admin registers the model: `reveal_remote_detail`). Credentials are
never part of a URL kept here (models/adapters/remote_http.py): they travel as headers. Each request
has a total deadline (REMOTE_CALL_TIMEOUT_S), and the remote's own metadata (its versions)
is part of the cache key of its answers, which expire after REMOTE_CACHE_TTL_S.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import numpy as np

from models.adapters.remote_config import (
    RemoteConfig,
    config,
    configure,
    open_headers,
    seal_headers,
)
from models.adapters.remote_http import (
    HostPolicy,
    HostRefused,
    deadline,
    display_url,
    make_client,
    split_credentials,
)
from models.base import ModelError

CHUNK_ROWS = 4096  # rows per request: a game evaluation may send tens of thousands
BODY_BYTES = 4 << 20  # ... and at most about this much JSON per request (a 3x224x224 row: one)
JSON_VALUE_BYTES = 20  # characters of one float32 in the JSON body, at most about
# Host memory of one value while a request is built: the float32, a Python float and its list
# slot (tolist), its JSON text.
HOST_VALUE_BYTES = 4 + 32 + JSON_VALUE_BYTES
NUMERIC = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
NUMERIC |= {"FP16", "FP32", "FP64"}
ANSWER_ROW_BYTES = 64 << 10  # an answer may hold this much JSON per row sent (~3000 values)
ANSWER_MIN_BYTES = 8 << 20
METADATA_BYTES = 1 << 20  # a model's metadata answer, at most
METADATA_TIMEOUT_S = 5.0  # ... within this (capped by the call timeout): a cache check waits on it
ERROR_BYTES = 64 << 10  # read of an error answer; DETAIL_CHARS of it are kept
DETAIL_CHARS = 300

# httpx logs each request's URL at INFO: remote URLs (their query strings) stay out of logs.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)

_reveal: contextvars.ContextVar[bool] = contextvars.ContextVar("reveal_remote", default=False)


@contextmanager
def reveal_remote_detail() -> Iterator[None]:
    """Errors raised in this context (and threads started from it by anyio) carry the
    remote's answer in their message: for an admin's registration."""
    token = _reveal.set(True)
    try:
        yield
    finally:
        _reveal.reset(token)


class RemoteModelError(ModelError):
    """The remote endpoint failed or answered something that is not an OIP response.

    The message names the endpoint (no credentials, no query) and what went wrong;
    `remote_detail` holds what the remote said (its error body, truncated), for admins."""

    status = 502
    code = "remote_model_error"

    def __init__(self, message: str, remote_detail: str | None = None) -> None:
        if remote_detail and _reveal.get():
            message = f"{message}: {remote_detail}"
        super().__init__(message)
        self.remote_detail = remote_detail


def _detail(data: bytes) -> str:
    """The server's own error message (OIP: {"error": ...}), else the start of the body."""
    text = data.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return text[:DETAIL_CHARS]
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])[:DETAIL_CHARS]
    return text[:DETAIL_CHARS]


class RemoteClient:
    """Forwards rows to an Open Inference Protocol endpoint: a black box's `predict_fn`
    (float32 [m, *input_shape] -> float32 [m, k]; no torch module, no gradients).

    url: the model's OIP URL, `http://host:port/v2/models/<model>` (optionally
    `/versions/<v>`; userinfo in it becomes a Basic Authorization header); output: the output
    to request by name (e.g. MLServer's `predict_proba`), else the endpoint's first output.
    headers: sent with every request (credentials). policy: the hosts it may connect to
    (None: any). timeout_s: the total time of one request, connect to last byte. One
    keep-alive HTTP client is shared by every thread. A request carries at most `chunk_rows`
    rows and about `body_bytes` of JSON (at least one row).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float,
        output: str | None = None,
        chunk_rows: int = CHUNK_ROWS,
        body_bytes: int = BODY_BYTES,
        headers: dict[str, str] | None = None,
        policy: HostPolicy | None = None,
        version_check_s: float = 30.0,
    ) -> None:
        clean, found = split_credentials(url)
        self.url = clean.rstrip("/")
        self.where = display_url(self.url)
        self._headers = {**found, **(headers or {})}
        self.policy = policy
        self.timeout_s = timeout_s
        self.output = output
        self.chunk_rows = chunk_rows
        self.body_bytes = body_bytes
        self.version_check_s = version_check_s
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._meta_lock = threading.Lock()
        self._fingerprint: str | None = None
        self._checked = -math.inf

    def __repr__(self) -> str:
        return f"RemoteClient({self.where!r})"

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = make_client(self.policy, self.timeout_s)
                # A re-registered or deleted model drops its client: its sockets close with it.
                weakref.finalize(self, self._client.close)
            return self._client

    def close(self) -> None:
        """Close the pooled connections (a later call opens new ones)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getstate__(self) -> dict[str, Any]:
        # A client and a lock cannot be pickled or deep-copied; a copy opens its own.
        state = self.__dict__.copy()
        state["_client"] = None
        state.pop("_lock", None)
        state.pop("_meta_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._meta_lock = threading.Lock()

    # --- one request --------------------------------------------------------------------------

    def _request(
        self, method: str, url: str, body: Any, limit: int, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """(status, body bytes) of one request, all of it within `timeout_s` (default the
        client's); an answer over `limit` bytes is an error (an error answer is cut there)."""
        seconds = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        try:
            client = self._http()
            with (
                deadline(seconds),
                client.stream(method, url, json=body, headers=self._headers) as r,
            ):
                status = r.status_code
                cap = limit if status == 200 else ERROR_BYTES
                data = bytearray()
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > cap and status == 200:
                        raise RemoteModelError(
                            f"remote model {self.where} answered more than {cap} bytes"
                        )
                    if len(data) > cap:
                        break
                return status, bytes(data[:cap])
        except httpx.TimeoutException:
            raise RemoteModelError(
                f"remote model {self.where} did not answer within {seconds:g} s "
                "(REMOTE_CALL_TIMEOUT_S)"
            ) from None
        except httpx.HTTPError as exc:
            if isinstance(exc.__cause__, HostRefused):
                raise RemoteModelError(
                    f"remote model {self.where}: its host is not allowed (REMOTE_MODEL_HOSTS)",
                    remote_detail=str(exc),
                ) from None
            raise RemoteModelError(
                f"remote model {self.where} unreachable",
                remote_detail=f"{type(exc).__name__}: {exc}",
            ) from None

    def metadata(self) -> tuple[int, Any]:
        """(status, the parsed JSON or None) of the endpoint's OIP metadata (GET url)."""
        status, data = self._request("GET", self.url, None, METADATA_BYTES, METADATA_TIMEOUT_S)
        try:
            return status, json.loads(data) if status == 200 else None
        except (ValueError, RecursionError):
            return status, None

    def remote_version(self) -> str:
        """A digest of the remote's own metadata (its name, versions, platform, inputs and
        outputs), re-read at most every `version_check_s`; "-" when it has none. A failed
        re-read keeps the last digest."""
        with self._meta_lock:
            now = time.monotonic()
            if self._fingerprint is not None and now - self._checked < self.version_check_s:
                return self._fingerprint
            self._checked = now
            try:
                status, meta = self.metadata()
            except RemoteModelError:
                if self._fingerprint is None:
                    self._fingerprint = "-"
                return self._fingerprint
            if status == 200 and isinstance(meta, dict):
                fields = {k: meta.get(k) for k in ("name", "versions", "platform", "inputs")}
                fields["outputs"] = meta.get("outputs")
                text = json.dumps(fields, sort_keys=True, default=str)
                self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:12]
            else:
                self._fingerprint = "-"
            return self._fingerprint

    # --- inference ----------------------------------------------------------------------------

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(x, dtype=np.float32)
        if rows.shape[0] == 0:
            raise RemoteModelError("no rows to send to the remote model")
        values = max(1, rows[0].size)  # per row
        step = max(1, min(self.chunk_rows, self.body_bytes // (JSON_VALUE_BYTES * values)))
        parts = [self._infer(rows[s : s + step]) for s in range(0, len(rows), step)]
        widths = {p.shape[1] for p in parts}
        if len(widths) != 1:
            raise RemoteModelError(
                f"remote model {self.where} changed its output width", remote_detail=str(widths)
            )
        return np.concatenate(parts)

    def _infer(self, rows: np.ndarray) -> np.ndarray:
        """One OIP request: float32 [m, *input_shape] -> float32 [m, k]."""
        body: dict[str, Any] = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "data": rows.reshape(-1).tolist(),
                }
            ]
        }
        return self._post(body, len(rows))

    def _post(self, body: dict[str, Any], m: int) -> np.ndarray:
        """POST one OIP request body ({"inputs": [...]}, the output asked for by name when set)
        for m rows -> float32 [m, k]."""
        if self.output is not None:
            body = {**body, "outputs": [{"name": self.output}]}
        limit = max(ANSWER_MIN_BYTES, m * ANSWER_ROW_BYTES)
        status, data = self._request("POST", f"{self.url}/infer", body, limit)
        if status != 200:
            raise RemoteModelError(
                f"remote model {self.where} answered HTTP {status}", remote_detail=_detail(data)
            )
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            raise RemoteModelError(
                f"remote model {self.where} answered non-JSON", remote_detail=_detail(data)
            ) from None
        return self._read(payload, m)

    def _read(self, payload: Any, m: int) -> np.ndarray:
        where = self.where
        outputs = payload.get("outputs") if isinstance(payload, dict) else None
        if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], dict):
            raise RemoteModelError(f"remote model {where}: no 'outputs' in its answer")
        out = outputs[0]
        if self.output is not None:
            named = [o for o in outputs if isinstance(o, dict) and o.get("name") == self.output]
            if not named:
                got = [o.get("name") for o in outputs if isinstance(o, dict)]
                raise RemoteModelError(
                    f"remote model {where} answered no output {self.output!r}",
                    remote_detail=f"its outputs: {got}"[:DETAIL_CHARS],
                )
            out = named[0]
        name, datatype = out.get("name"), out.get("datatype")
        what = f"{name!r} of datatype {datatype!r}"[:DETAIL_CHARS]
        if datatype not in NUMERIC:
            raise RemoteModelError(
                f"remote model {where}: its output is not numbers", remote_detail=what
            )
        try:
            data = np.asarray(out["data"], dtype=np.float64).reshape(-1)
            shape = [int(d) for d in out["shape"]]
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise RemoteModelError(
                f"remote model {where}: its output is not a numeric tensor",
                remote_detail=f"{what}: {exc}"[:DETAIL_CHARS],
            ) from None
        if not shape or shape[0] != m or math.prod(shape) != data.size:
            raise RemoteModelError(
                f"remote model {where}: its output does not hold one row per input ({m} rows)",
                remote_detail=f"{what}: shape {shape} with {data.size} values"[:DETAIL_CHARS],
            )
        return data.astype(np.float32).reshape(m, -1)  # [m] (one value per row) -> [m, 1]


# --- models built on a client -----------------------------------------------------------------


def client_of(model: Any) -> RemoteClient | None:
    """The RemoteClient a model forwards to (its predict_fn or its predict_texts' owner)."""
    fn = getattr(model, "predict_fn", None)
    if isinstance(fn, RemoteClient):
        return fn
    owner = getattr(getattr(model, "predict_texts", None), "__self__", None)
    return owner if isinstance(owner, RemoteClient) else None


def cache_version(model: Any) -> str:
    """The model version an answer's cache key holds: the version itself, and for a remote
    model also the remote's own metadata digest and the current REMOTE_CACHE_TTL_S period
    (a cached answer is served at most that long, and never once the remote changed)."""
    version = str(model.version)
    client = client_of(model)
    if client is None:
        return version
    info = getattr(model, "info", None) or {}
    ttl = float(info.get("cache_ttl_s", config().cache_ttl_s))
    period = time.time_ns() if ttl <= 0 else int(time.time() // ttl)
    return f"{version}+{client.remote_version()}@{period}"


def with_remote_info(model: Any, client: RemoteClient, cfg: RemoteConfig, **extra: Any) -> Any:
    """`model` whose info names the endpoint (never its credentials) and its cache terms."""
    info = {
        **(getattr(model, "info", None) or {}),
        "source": "remote",
        "url": client.where,
        "cache_ttl_s": cfg.cache_ttl_s,
        "version_check_s": cfg.version_check_s,
        "call_timeout_s": cfg.call_timeout_s,
        **extra,
    }
    return replace(model, info=info)


__all__ = [
    "RemoteClient",
    "RemoteConfig",
    "RemoteModelError",
    "cache_version",
    "client_of",
    "config",
    "configure",
    "open_headers",
    "reveal_remote_detail",
    "seal_headers",
    "with_remote_info",
]
