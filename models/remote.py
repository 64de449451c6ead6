"""Remote models: rows forwarded to an Open Inference Protocol endpoint (a black box).

Speaks the OIP REST protocol as MLServer, Triton and KServe answer it: one FP32 input tensor
(MLServer's sklearn runtime decodes a single input whatever its name), an optional requested
output by name (MLServer's sklearn runtime answers `predict` unless asked for `predict_proba`),
and outputs of any numeric datatype (FP64 probabilities, INT64 labels) read back as float32.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import httpx
import numpy as np

from models.base import ModelError

CHUNK_ROWS = 4096  # rows per request: a game evaluation may send tens of thousands
BODY_BYTES = 4 << 20  # ... and at most about this much JSON per request (a 3x224x224 row: one)
JSON_VALUE_BYTES = 20  # characters of one float32 in the JSON body, at most about
# Host memory of one value while a request is built: the float32, a Python float and its list
# slot (tolist), its JSON text.
HOST_VALUE_BYTES = 4 + 32 + JSON_VALUE_BYTES
NUMERIC = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
NUMERIC |= {"FP16", "FP32", "FP64"}


class RemoteModelError(ModelError):
    """The remote endpoint failed or answered something that is not an OIP response."""


def _detail(r: httpx.Response) -> str:
    """The server's own error message (OIP: {"error": ...}), else the start of the body."""
    try:
        body = r.json()
    except ValueError:
        return r.text[:300]
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])[:300]
    return str(body)[:300]


class RemoteClient:
    """Forwards rows to an Open Inference Protocol endpoint: a black box's `predict_fn`
    (float32 [m, *input_shape] -> float32 [m, k]; no torch module, no gradients).

    url: the model's OIP URL, `http://host:port/v2/models/<model>` (optionally
    `/versions/<v>`); output: the output to request by name (e.g. MLServer's `predict_proba`),
    else the endpoint's first output. One keep-alive HTTP client is shared by every thread.
    A request carries at most `chunk_rows` rows and about `body_bytes` of JSON (at least one
    row).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float,
        output: str | None = None,
        chunk_rows: int = CHUNK_ROWS,
        body_bytes: int = BODY_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.output = output
        self.chunk_rows = chunk_rows
        self.body_bytes = body_bytes
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self.timeout_s)
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
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(x, dtype=np.float32)
        if rows.shape[0] == 0:
            raise RemoteModelError("no rows to send to the remote model")
        values = max(1, rows[0].size)  # per row
        step = max(1, min(self.chunk_rows, self.body_bytes // (JSON_VALUE_BYTES * values)))
        parts = [self._infer(rows[s : s + step]) for s in range(0, len(rows), step)]
        widths = {p.shape[1] for p in parts}
        if len(widths) != 1:
            raise RemoteModelError(f"remote model {self.url} changed its output width {widths}")
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
        try:
            r = self._http().post(f"{self.url}/infer", json=body)
        except httpx.TimeoutException:
            raise RemoteModelError(
                f"remote model {self.url} did not answer within {self.timeout_s} s"
            ) from None
        except httpx.HTTPError as exc:
            raise RemoteModelError(f"remote model {self.url} unreachable: {exc}") from None
        if r.status_code != 200:
            raise RemoteModelError(
                f"remote model {self.url} answered HTTP {r.status_code}: {_detail(r)}"
            )
        try:
            payload = r.json()
        except ValueError:
            raise RemoteModelError(f"remote model {self.url} answered non-JSON") from None
        return self._read(payload, m)

    def _read(self, payload: Any, m: int) -> np.ndarray:
        outputs = payload.get("outputs") if isinstance(payload, dict) else None
        if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], dict):
            raise RemoteModelError(f"remote model {self.url}: no 'outputs' in its answer")
        out = outputs[0]
        if self.output is not None:
            named = [o for o in outputs if isinstance(o, dict) and o.get("name") == self.output]
            if not named:
                got = [o.get("name") for o in outputs if isinstance(o, dict)]
                raise RemoteModelError(
                    f"remote model {self.url} answered outputs {got}, not {self.output!r}"
                )
            out = named[0]
        name, datatype = out.get("name"), out.get("datatype")
        if datatype not in NUMERIC:
            raise RemoteModelError(
                f"remote model {self.url}: output {name!r} has datatype {datatype!r}, not numbers"
            )
        try:
            data = np.asarray(out["data"], dtype=np.float64).reshape(-1)
            shape = [int(d) for d in out["shape"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteModelError(
                f"remote model {self.url}: output {name!r} is not a numeric tensor ({exc})"
            ) from None
        if not shape or shape[0] != m or int(np.prod(shape)) != data.size:
            raise RemoteModelError(
                f"remote model {self.url}: output {name!r} of shape {shape} with {data.size} "
                f"values for {m} rows"
            )
        return data.astype(np.float32).reshape(m, -1)  # [m] (one value per row) -> [m, 1]
