"""Remote text models: texts forwarded to an Open Inference Protocol endpoint as a BYTES tensor.

MLServer's Hugging Face runtime convention: one BYTES input of shape [N], one string per row,
named as the endpoint's metadata (GET {url}) names its BYTES input, else "args". The explained
output is the one `remote_output` names (else the first), read as float32 [N, k]. A black box
without a tokenizer: word players come from the text itself (explainers/games/text.py's regex);
token players need the model's tokenizer, which the endpoint does not give.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from models.adapters.remote import (
    DETAIL_CHARS,
    RemoteClient,
    RemoteConfig,
    RemoteModelError,
    with_remote_info,
)
from models.adapters.remote_http import HostPolicy
from models.base import ModelError, TextModel
from models.declaration import Declaration
from models.modality import Modality

TEXT_ROWS = 256  # texts per request
DEFAULT_INPUT = "args"  # MLServer's Hugging Face runtime


class NoTokenizerError(ModelError):
    """Token players asked of a remote text model, whose tokenizer is not here."""

    status = 400
    code = "invalid_option"


class RemoteTextClient(RemoteClient):
    """Texts -> float32 [m, k] through an OIP endpoint that reads a BYTES tensor of strings."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        output: str | None = None,
        headers: dict[str, str] | None = None,
        policy: HostPolicy | None = None,
        version_check_s: float = 30.0,
    ) -> None:
        super().__init__(
            url,
            timeout_s,
            output,
            chunk_rows=TEXT_ROWS,
            headers=headers,
            policy=policy,
            version_check_s=version_check_s,
        )
        self._input: str | None = None
        self._name_lock = threading.Lock()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._name_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_name_lock", None)
        return state

    def input_name(self) -> str:
        """The BYTES input the endpoint's metadata names (asked once), else "args"."""
        with self._name_lock:
            if self._input is None:
                self._input = self._metadata_input()
            return self._input

    def _metadata_input(self) -> str:
        status, meta = self.metadata()
        if status != 200 or not isinstance(meta, dict):
            return DEFAULT_INPUT  # metadata is optional in practice; the infer call decides
        inputs = meta.get("inputs") or []
        if not isinstance(inputs, list):
            return DEFAULT_INPUT
        tensors = [i for i in inputs if isinstance(i, dict) and isinstance(i.get("name"), str)]
        named = [str(i["name"]) for i in tensors if i.get("datatype") == "BYTES"]
        if named:
            return named[0]
        if tensors:
            described = [(i["name"], i.get("datatype")) for i in tensors]
            raise RemoteModelError(
                f"remote model {self.where} has no BYTES input for texts (register it with "
                "modality tabular or image)",
                remote_detail=f"its inputs: {described}"[:DETAIL_CHARS],
            )
        return DEFAULT_INPUT

    def texts(self, texts: Sequence[str]) -> np.ndarray:
        """m texts -> float32 [m, k], TEXT_ROWS texts per request."""
        rows = [str(t) for t in texts]
        if not rows:
            raise RemoteModelError("no texts to send to the remote model")
        name = self.input_name()
        parts = []
        for s in range(0, len(rows), self.chunk_rows):
            chunk = rows[s : s + self.chunk_rows]
            tensor = {"name": name, "shape": [len(chunk)], "datatype": "BYTES", "data": chunk}
            parts.append(self._post({"inputs": [tensor]}, len(chunk)))
        if len({p.shape[1] for p in parts}) != 1:
            raise RemoteModelError(f"remote model {self.where} changed its output width")
        return np.concatenate(parts)


def _no_tokens(text: str) -> list[tuple[int, int]]:
    raise NoTokenizerError(
        "players 'tokens' needs the model's tokenizer, and a remote text model has none here "
        "(the endpoint tokenises): use players 'words'"
    )


def remote_text_model(
    decl: Declaration,
    version: str,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
    policy: HostPolicy | None = None,
    cfg: RemoteConfig | None = None,
) -> TextModel:
    """A remote OIP text classifier (or regressor) as the declaration states it."""
    cfg = cfg or RemoteConfig(call_timeout_s=timeout_s)
    client = RemoteTextClient(
        decl.remote_url or "",
        timeout_s,
        decl.remote_output,
        headers=headers,
        policy=policy,
        version_check_s=cfg.version_check_s,
    )
    model = TextModel(
        name=decl.name,
        modality=Modality.TEXT,
        task=decl.task,
        input_shape=(),
        feature_names=(),
        output_names=decl.output_names,
        module=None,
        predict_texts=client.texts,
        token_spans=_no_tokens,
        mask_token="[MASK]",  # absence "mask" sends this string; "delete" (the default) none
        max_tokens=0,  # unknown here: the endpoint truncates what it cannot read
        batch_size=TEXT_ROWS,
        version=version,
        platform="remote",
    )
    return with_remote_info(
        model,
        client,
        cfg,
        input="a BYTES tensor of strings, shape [N]",
        output=decl.remote_output or "the endpoint's first output",
        players="words (a tokenizer is needed for tokens)",
    )
