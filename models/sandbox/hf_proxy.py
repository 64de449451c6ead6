"""Server-side stand-ins for Hugging Face checkpoints and ONNX text models in a worker.

A text classifier, encoder, ranker, causal LM or ONNX text model becomes the same model type it
is in process (TextModel, EmbeddingTextModel, RankerModel, LanguageModel) whose callables go to
the worker (models/sandbox/hf_worker.py): texts and token spans, (query, documents) scores, the
embedding hook (embed; scores of embeddings as a `torch.autograd.Function` whose backward pass
asks the worker for the vector-Jacobian product; the classifier as a module of embeddings for
UNI, a `WorkerModule` whose weights are fetched from the worker when first used), and a causal
LM's encode/decode, response log-likelihoods, full passes (their key/value cache stays in the
worker, named by a handle) and greedy generation. The server loads no tokenizer and no weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.base import Model, RankerModel, TextModel
from models.declaration import Declaration, InvalidModelError
from models.modality import Modality
from models.sandbox.pool import WorkerGroup
from models.sandbox.proxy import FLOAT_BYTES, WorkerModule

MAX_TEXT_ROWS_BYTES = 1 << 30  # an answer for one call: rows x outputs floats, bounded anyway


class Stub(torch.nn.Module):
    """The module of a model that computes in its worker (no weights here): it keeps the
    model's capabilities (`differentiable`) as the in-process model declares them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model computes in its model worker")


def _floats(out: list[np.ndarray], size: int, what: str) -> np.ndarray:
    if len(out) != 1 or out[0].dtype.kind != "f" or out[0].size != size:
        raise InvalidModelError(f"the model worker answered {what} of another shape")
    return out[0]


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise InvalidModelError(f"the model worker answered invalid {what}")
    return [int(v) for v in value]


class WorkerTexts:
    """`predict_texts`: m texts -> float32 [m, k] from the worker."""

    def __init__(self, group: WorkerGroup, k: int) -> None:
        self.group, self.k = group, k

    def __call__(self, texts: list[str]) -> np.ndarray:
        m = len(texts)
        _, out = self.group.call({"op": "texts", "texts": [str(t) for t in texts]}, [],
                                 max(1, m * self.k * FLOAT_BYTES))  # fmt: skip
        return _floats(out, m * self.k, "predictions").reshape(m, self.k).astype(np.float32)


class WorkerSpans:
    """`token_spans`: the tokenizer's character offsets, from the worker."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def __call__(self, text: str) -> list[tuple[int, int]]:
        reply, _ = self.group.call({"op": "spans", "text": str(text)}, [], 1)
        spans = reply.get("spans")
        if not isinstance(spans, list):
            raise InvalidModelError("the model worker answered invalid token spans")
        out = []
        for s in spans:
            pair = _ints(s, "token spans")
            if len(pair) != 2 or not 0 <= pair[0] <= pair[1] <= len(text):
                raise InvalidModelError("the model worker answered invalid token spans")
            out.append((pair[0], pair[1]))
        return out


class WorkerScores:
    """A ranker's `score_lists`: m queries x K documents -> float64 [m, K]."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def __call__(self, queries: Sequence[str], documents: Sequence[Sequence[str]]) -> np.ndarray:
        if len({len(d) for d in documents}) > 1:
            raise ValueError("every document list of one call needs the same length")
        m, k = len(queries), len(documents[0]) if documents else 0
        header = {"op": "score", "queries": [str(q) for q in queries],
                  "documents": [[str(d) for d in docs] for docs in documents]}  # fmt: skip
        _, out = self.group.call(header, [], max(1, m * k * FLOAT_BYTES))
        return _floats(out, m * k, "scores").reshape(m, k).astype(np.float64)


class _HookModule(WorkerModule):
    """The classifier as a module of input embeddings [b, t, d] -> probabilities [b, k] (UNI):
    its weights are the worker's, the type ids travel with each call."""

    types: list[int]

    def message(self, x: torch.Tensor) -> tuple[dict[str, Any], list[np.ndarray]]:
        header, arrays = super().message(x)
        header["types"] = self.types
        return header, arrays

    def __deepcopy__(self, memo: dict[int, Any]) -> _HookModule:
        twin = super().__deepcopy__(memo)
        twin.__class__ = _HookModule
        twin.types = list(self.types)  # type: ignore[assignment]
        return twin  # type: ignore[return-value]


class _Scores(torch.autograd.Function):
    """embeddings -> scores in the worker; backward: the worker's vector-Jacobian product."""

    @staticmethod
    def forward(
        ctx: Any, hook: WorkerHook, x: torch.Tensor, types: torch.Tensor, output: str
    ) -> Any:
        ctx.hook, ctx.output = hook, output
        ctx.save_for_backward(x, types)
        return hook.run_scores(x, types, output, None)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        x, types = ctx.saved_tensors
        return None, ctx.hook.run_scores(x, types, ctx.output, grad_out), None, None


class WorkerHook:
    """models.adapters.hf_models.EmbeddingHook of a classifier in a worker."""

    def __init__(self, group: WorkerGroup, spec: dict[str, Any], k: int) -> None:
        self.group, self.k = group, k
        mask, pad = spec.get("mask_id"), spec.get("pad_id")
        self.mask_id = mask if isinstance(mask, int) and not isinstance(mask, bool) else None
        self.pad_id = pad if isinstance(pad, int) and not isinstance(pad, bool) else None
        self.parameters = spec.get("parameters") or []
        self.buffers = spec.get("buffers") or []
        self._std: torch.Tensor | None = None
        self._weights: list[np.ndarray] | None = None
        self._vocab: frozenset[str] | None = None

    def encode(self, text: str) -> tuple[list[int], list[int], list[tuple[int, int]], list[bool]]:
        reply, _ = self.group.call({"op": "encode", "text": str(text)}, [], 1)
        ids, types = _ints(reply.get("ids"), "token ids"), _ints(reply.get("types"), "type ids")
        offsets = [tuple(_ints(o, "offsets")) for o in reply.get("offsets") or []]
        special = reply.get("special")
        if not isinstance(special, list) or not len(ids) == len(types) == len(offsets) == len(
            special
        ):
            raise InvalidModelError("the model worker answered an invalid encoding")
        return ids, types, [(o[0], o[1]) for o in offsets], [bool(s) for s in special]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        a = ids.detach().to("cpu", torch.int64).contiguous().numpy()
        _, out = self.group.call({"op": "embed"}, [a], max(1, a.size * 1 << 16))
        if len(out) != 1 or out[0].dtype.kind != "f" or out[0].shape[:2] != a.shape:
            raise InvalidModelError("the model worker answered embeddings of another shape")
        return torch.from_numpy(out[0].copy())

    def run_scores(
        self, x: torch.Tensor, types: torch.Tensor, output: str, grad_out: torch.Tensor | None
    ) -> torch.Tensor:
        arrays = [x.detach().to("cpu", torch.float32).contiguous().numpy(),
                  types.detach().to("cpu", torch.int64).contiguous().numpy()]  # fmt: skip
        header: dict[str, Any] = {"op": "hook_scores", "output": output}
        if grad_out is None:
            size = len(x) * self.k
            _, out = self.group.call(header, arrays, max(1, size * FLOAT_BYTES))
            return torch.from_numpy(_floats(out, size, "scores").reshape(len(x), self.k).copy())
        header["grad"] = True
        arrays.append(grad_out.detach().to("cpu", torch.float32).contiguous().numpy())
        _, out = self.group.call(header, arrays, max(1, x.numel() * FLOAT_BYTES),
                                 expected=[tuple(x.shape)], what="computing gradients")  # fmt: skip
        return torch.from_numpy(_floats(out, x.numel(), "gradients").copy()).to(x.dtype)

    def scores(self, embeds: torch.Tensor, types: torch.Tensor, output: str) -> torch.Tensor:
        out: torch.Tensor = _Scores.apply(self, embeds, types, output)
        return out

    def module(self, types: torch.Tensor) -> torch.nn.Module:
        if self._weights is None:
            n = len(self.parameters) + len(self.buffers)
            limit = max(1, 2 * self.group.folder_bytes)
            _, out = self.group.call({"op": "weights"}, [], limit)
            if len(out) != n:
                raise InvalidModelError("the model worker sent weights that do not match")
            self._weights = out
        params = [
            (str(p[0]), a, True) for p, a in zip(self.parameters, self._weights, strict=False)
        ]
        rest = self._weights[len(self.parameters) :]
        buffers = [(str(b), a) for b, a in zip(self.buffers, rest, strict=True)]
        module = _HookModule(self.group, self.k, params, buffers).eval()
        module.types = [int(t) for t in types.reshape(-1).tolist()]
        return module

    def hidden_states(
        self, texts: list[str]
    ) -> tuple[list[tuple[list[int], list[tuple[int, int]]]], torch.Tensor, torch.Tensor]:
        """AutoGnothi's encoder pass in the worker: per text (token ids, offsets), the hidden
        states of every level [b, levels, t, d] and the probabilities [b, C]."""
        limit = len(texts) * (64 << 20) + (1 << 20)  # at most 64 MiB of states per text
        reply, out = self.group.call({"op": "hidden", "texts": [str(t) for t in texts]}, [],
                                     limit, what="encoding hidden states")  # fmt: skip
        raw = reply.get("tokens")
        if not isinstance(raw, list) or len(raw) != len(texts) or len(out) != 2:
            raise InvalidModelError("the model worker answered invalid hidden states")
        tokens = []
        for t in raw:
            ids = _ints(t.get("ids") if isinstance(t, dict) else None, "token ids")
            offsets = [tuple(_ints(o, "offsets")) for o in t.get("offsets") or []]
            if len(offsets) != len(ids) or any(len(o) != 2 for o in offsets):
                raise InvalidModelError("the model worker answered invalid token offsets")
            tokens.append((ids, [(o[0], o[1]) for o in offsets]))
        hidden, probs = out
        width = max(len(ids) for ids, _ in tokens)
        if (
            hidden.dtype.kind != "f" or hidden.ndim != 4 or hidden.shape[0] != len(texts)
            or hidden.shape[2] != width or probs.shape != (len(texts), self.k)
        ):  # fmt: skip
            raise InvalidModelError("the model worker answered hidden states of another shape")
        return tokens, torch.from_numpy(hidden.copy()), torch.from_numpy(probs.copy())

    def vocabulary(self) -> frozenset[str]:
        """The tokenizer's vocabulary (AutoGnothi's held-out words avoid unknown tokens)."""
        if self._vocab is None:
            reply, _ = self.group.call({"op": "vocab"}, [], 1)
            words = reply.get("vocab")
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise InvalidModelError("the model worker answered an invalid vocabulary")
            self._vocab = frozenset(words)
        return self._vocab

    def embedding_std(self) -> torch.Tensor:
        if self._std is None:
            _, out = self.group.call({"op": "std"}, [], 1 << 24)
            if len(out) != 1 or out[0].dtype.kind != "f" or out[0].ndim != 1:
                raise InvalidModelError("the model worker answered an invalid embedding std")
            self._std = torch.from_numpy(out[0].copy())
        return self._std


class WorkerTokenizer:
    """What explainers read of a user LM's tokenizer: `decode` (in the worker)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def decode(self, ids: Sequence[int]) -> str:
        reply, _ = self.group.call({"op": "lm_decode", "ids": [int(i) for i in ids]}, [], 1)
        return str(reply.get("text", ""))


@dataclass(frozen=True)
class WorkerPrefix:
    """A key/value cache kept in the worker (models.builtin.lm.PrefixCache there), by handle."""

    handle: int
    ids: list[int] = field(default_factory=list)

    def common(self, ids: list[int]) -> int:
        n = min(len(ids), len(self.ids))
        a, b = np.asarray(ids[:n]), np.asarray(self.ids[:n])
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else n


def _language_model_type() -> Any:
    from models.builtin.lm import BATCH_SIZE, LanguageModel

    @dataclass(frozen=True, kw_only=True)
    class WorkerLanguageModel(LanguageModel):
        """A causal LM in its worker: models.builtin.lm.LanguageModel's operations as worker
        calls."""

        group: Any

        def encode(self, text: str, *, bos: bool) -> list[int]:
            reply, _ = self.group.call({"op": "lm_encode", "text": str(text), "bos": bos}, [], 1)
            return _ints(reply.get("ids"), "token ids")

        def decode(self, ids: Sequence[int]) -> str:
            return str(self.tokenizer.decode(ids))

        def response_log_likelihood(
            self,
            prompts: Sequence[list[int]],
            response: list[int],
            *,
            prefix: Any = None,
            batch_size: int = BATCH_SIZE,
        ) -> tuple[np.ndarray, int, int]:
            header = {
                "op": "rll",
                "prompts": [[int(i) for i in p] for p in prompts],
                "response": [int(i) for i in response],
                "prefix": prefix.handle if isinstance(prefix, WorkerPrefix) else None,
                "batch_size": int(batch_size),
            }
            reply, out = self.group.call(header, [], max(1, len(prompts) * FLOAT_BYTES))
            values = _floats(out, len(prompts), "log-likelihoods").astype(np.float64)
            passes, tokens = reply.get("passes"), reply.get("tokens")
            if not isinstance(passes, int) or not isinstance(tokens, int):
                raise InvalidModelError("the model worker answered invalid counts")
            return values, passes, tokens

        def full_pass(self, prompt: list[int], response: list[int]) -> tuple[float, Any]:
            header = {"op": "full_pass", "prompt": [int(i) for i in prompt],
                      "response": [int(i) for i in response]}  # fmt: skip
            reply, _ = self.group.call(header, [], 1)
            ll, handle = reply.get("ll"), reply.get("handle")
            if not isinstance(ll, float | int) or not isinstance(handle, int):
                raise InvalidModelError("the model worker answered an invalid full pass")
            return float(ll), WorkerPrefix(handle, [*prompt, *response])

        def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
            header = {"op": "generate", "prompt": [int(i) for i in prompt],
                      "max_new_tokens": int(max_new_tokens)}  # fmt: skip
            reply, _ = self.group.call(header, [], 1)
            return _ints(reply.get("ids"), "generated ids")

    return WorkerLanguageModel


_LM_TYPE: Any = None


def _int_of(spec: dict[str, Any], key: str, low: int = 0) -> int:
    value = spec.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidModelError(f"the model worker stated an invalid {key}")
    return value


def text_proxy_model(
    decl: Declaration, version: str, group: WorkerGroup, spec: dict[str, Any]
) -> Model:
    """The server's model of a checkpoint in `group`'s worker, from the declaration and the
    worker's spec (its kind, the tokenizer's mask token and limits)."""
    global _LM_TYPE
    kind = spec.get("kind")
    if kind not in ("classifier", "texts", "encoder", "ranker", "lm"):
        raise InvalidModelError("the model worker described its model wrongly")
    mask = spec.get("mask_token")
    if mask is not None and (not isinstance(mask, str) or len(mask) > 100):
        raise InvalidModelError("the model worker stated an invalid mask token")
    platform = str(spec.get("platform", "huggingface"))[:40]
    raw = spec.get("info")
    raw_info: dict[str, Any] = raw if isinstance(raw, dict) else {}
    info = {**raw_info, "sandbox": dict(group.sandbox)}
    common: dict[str, Any] = {
        "name": decl.name,
        "input_shape": (),
        "feature_names": (),
        "version": version,
        "platform": platform,
        "info": info,
        "module": Stub() if platform == "huggingface" else None,
    }
    k = len(decl.output_names)
    if kind == "ranker":
        return RankerModel(
            modality=Modality.RANKER, task="ranking", output_names=("score",),
            score_lists=WorkerScores(group), mask_token=mask, **common,
        )  # fmt: skip
    text: dict[str, Any] = {
        "output_names": decl.output_names,
        "predict_texts": WorkerTexts(group, k),
        "token_spans": WorkerSpans(group),
        "mask_token": mask or "",
        "max_tokens": _int_of(spec, "max_tokens"),
        "max_chars": _int_of(spec, "max_chars", 1),
        "batch_size": _int_of(spec, "batch_size", 1),
        **common,
    }
    if kind == "classifier":
        from models.adapters.hf_models import EmbeddingTextModel

        hook = WorkerHook(group, dict(spec.get("hook") or {}), k)
        return EmbeddingTextModel(
            modality=Modality.TEXT,
            task=decl.task,
            embeddings=hook,  # type: ignore[arg-type]
            **text,
        )
    if kind == "lm":
        from models.adapters.hf_models import _builtin_cache

        if _LM_TYPE is None:
            _LM_TYPE = _language_model_type()
        lm_raw = spec.get("lm")
        lm_spec: dict[str, Any] = lm_raw if isinstance(lm_raw, dict) else {}
        return _LM_TYPE(
            modality="lm", task="generation", hf=None, tokenizer=WorkerTokenizer(group),
            add_bos=bool(lm_spec.get("add_bos")), cache_dir=Path(_builtin_cache()),
            group=group, **text,
        )  # fmt: skip
    if kind == "encoder":
        from models.builtin.encoders import ENCODER_TASK, descr_sentences

        pool = np.array(descr_sentences(), dtype=str)
        return TextModel(modality=Modality.ENCODER, task=ENCODER_TASK, reference=pool, **text)
    return TextModel(modality=Modality.TEXT, task=decl.task, **text)


def text_group(model: Model) -> WorkerGroup | None:
    """The worker group a text model computes in; None for one of the server process."""
    for attr in ("predict_texts", "score_lists"):
        fn = getattr(model, attr, None)
        if isinstance(fn, WorkerTexts | WorkerScores):
            return fn.group
    return None
