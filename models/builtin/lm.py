"""Built-in causal language models (modality "lm"): the model type AttriBoT runs on and its
loader. What AttriBoT needs of any LM: models/lm_protocol.py (no torch); where the weights come
from and how they are cached: models/builtin/lm_cache.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from models.base import TextModel, UnknownModelError
from models.builtin.lm_cache import SOURCES, _convert, _digest, _read, clean_interrupted
from models.lm_protocol import LanguageModelProtocol
from models.modality import Modality

__all__ = [
    "SOURCES",
    "LanguageModel",
    "LanguageModelProtocol",
    "PrefixCache",
    "clean_interrupted",
    "load_language_model",
    "shared_language_model",
]

log = logging.getLogger(__name__)

MAX_TOKENS = 2048  # prompt + response tokens we accept (both models read far more)
BATCH_SIZE = 8  # sequences per forward pass


@dataclass(frozen=True, kw_only=True)
class LanguageModel(TextModel):
    """A causal LM: `predict` gives each text's log-likelihood; `hf` is the transformers model.

    Thread-safe for inference: forward passes keep no state on the module.
    """

    hf: Any  # transformers PreTrainedModel (causal LM), eval mode, float32
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    add_bos: bool  # prompts start with the BOS token
    cache_dir: Path  # where the built-in LMs are cached (proxy models are looked up there)

    def encode(self, text: str, *, bos: bool) -> list[int]:
        """Token ids of `text` (no special tokens), after BOS when `bos` and the model uses one."""
        ids = [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if bos and self.add_bos:
            ids.insert(0, int(self.tokenizer.bos_token_id))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids (special tokens kept)."""
        return str(self.tokenizer.decode(list(ids)))

    def response_log_likelihood(
        self,
        prompts: Sequence[list[int]],
        response: list[int],
        *,
        prefix: PrefixCache | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> tuple[np.ndarray, int, int]:
        """Σ_t log p(response_t | prompt, response_<t) per prompt, float64 [m]; the sequences
        run (forward passes) and the tokens computed (padding excluded).

        With `prefix`, each prompt reuses the cached keys/values of the tokens it shares with
        the cached sequence (the last prompt token is always recomputed), so only the rest is
        run. Sequences are right-padded: in a causal model padding after a token never changes
        it, so no attention mask is needed.
        """
        if not response:
            return np.zeros(len(prompts)), 0, 0
        starts = [
            0 if prefix is None else min(prefix.common(p), len(p) - 1) for p in prompts
        ]  # tokens reused from the cache, per prompt
        out = np.empty(len(prompts))
        passes = tokens = 0
        device = self.device
        with torch.inference_mode():
            for rows in _batches(starts, [len(p) + len(response) for p in prompts], batch_size):
                start = min(starts[i] for i in rows)
                seqs = [prompts[i][start:] + response for i in rows]
                width = max(len(s) for s in seqs)
                ids = torch.zeros((len(rows), width), dtype=torch.long)
                for r, s in enumerate(seqs):
                    ids[r, : len(s)] = torch.tensor(s)
                past = None if prefix is None else prefix.expand(start, len(rows))
                hidden = self.hf.model(
                    input_ids=ids.to(device),
                    cache=past,
                    position_ids=torch.arange(start, start + width, device=device).expand(
                        len(rows), -1
                    ),
                    use_cache=past is not None,
                ).last_hidden_state  # [b, width, d]
                for r, i in enumerate(rows):
                    first = len(prompts[i]) - start - 1  # predicts the first response token
                    out[i] = self._sum_log_probs(hidden[r, first : first + len(response)], response)
                passes += len(rows)
                tokens += sum(len(q) for q in seqs)
        return out, passes, tokens

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head (with Gemma's final soft-capping when configured)."""
        logits = self.hf.lm_head(hidden)
        cap = getattr(self.hf.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def full_pass(self, prompt: list[int], response: list[int]) -> tuple[float, PrefixCache]:
        """Log-likelihood of `response` after `prompt`, and every layer's keys and values of
        the whole sequence for later prefix reuse (one forward pass)."""
        from transformers import DynamicCache

        cache = DynamicCache()  # no config: full-length layers, so any prefix can be reused
        ids = prompt + response
        with torch.inference_mode():
            hidden = self.hf.model(
                input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True
            ).last_hidden_state[0]  # [len(ids), d]
            ll = self._sum_log_probs(hidden[len(prompt) - 1 : len(ids) - 1], response)
        layers = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr]
        return ll, PrefixCache(ids, layers)  # type: ignore[arg-type]

    def _sum_log_probs(self, hidden: torch.Tensor, targets: list[int]) -> float:
        """Σ log p(target_t) from the hidden states that predict them ([n, d], n targets)."""
        logp = torch.log_softmax(self._logits(hidden).float(), dim=-1)
        index = torch.tensor(targets, device=logp.device)[:, None]
        return float(logp.gather(1, index).double().sum().item())

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of `prompt` (token ids), without the EOS token."""
        with torch.inference_mode():
            out = self.hf.generate(
                torch.tensor([prompt], device=self.device),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=self.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = [int(t) for t in out[0, len(prompt) :].tolist()]
        eos = {self.tokenizer.eos_token_id, *np.atleast_1d(self.hf.generation_config.eos_token_id)}
        for k, token in enumerate(new):
            if token in eos:
                return new[:k]
        return new


def _batches(starts: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
    """Rows per forward pass: similar reuse together, and a row joins a batch only while the
    padded batch costs at most 25% more tokens than running its rows one by one."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], lengths[i]))
    batches: list[list[int]] = []
    for i in order:
        rows = batches[-1] if batches else []
        if rows and len(rows) < batch_size:
            start = starts[rows[0]]  # the smallest start: rows are in order of start
            width = max(lengths[j] - start for j in [*rows, i])
            own = sum(lengths[j] - starts[j] for j in [*rows, i])
            if (len(rows) + 1) * width <= 1.25 * own:
                rows.append(i)
                continue
        batches.append([i])
    return batches


class PrefixCache:
    """Keys and values of one token sequence, reusable for any of its prefixes."""

    def __init__(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.ids = ids
        self.layers = layers  # per layer: keys, values [1, heads, len(ids), head_dim]

    def common(self, ids: list[int]) -> int:
        """How many leading tokens `ids` shares with the cached sequence."""
        n = min(len(ids), len(self.ids))
        a, b = np.asarray(ids[:n]), np.asarray(self.ids[:n])
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else n

    def expand(self, length: int, batch: int) -> Any:
        """A fresh DynamicCache holding the first `length` tokens, repeated `batch` times."""
        from transformers import DynamicCache

        if length == 0:
            return DynamicCache()
        return DynamicCache(
            ddp_cache_data=[
                (
                    k[:, :, :length].expand(batch, -1, -1, -1),
                    v[:, :, :length].expand(batch, -1, -1, -1),
                )
                for k, v in self.layers
            ]
        )


def load_language_model(name: str, cache_dir: Path) -> LanguageModel:
    """Load a built-in LM from `cache_dir`, converting its GGUF file first if needed."""
    source = SOURCES.get(name)
    if source is None:
        raise UnknownModelError(name)
    start = time.perf_counter()
    digest = _digest(source)
    dest = cache_dir / "lm" / f"{name}-{digest}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        clean_interrupted(dest.parent)
        loaded = _read(dest)
        if loaded is None:
            log.info("converting %s from its GGUF file (once; takes minutes)", name)
            _convert(source, dest)
            loaded = _read(dest)
            if loaded is None:
                raise RuntimeError(f"LM cache {dest} is unreadable right after conversion")
    hf, tokenizer, info = loaded
    # Whether the tokenizer itself starts a text with BOS (Gemma does; SmolLM2 does not).
    bos_id = tokenizer.bos_token_id
    add_bos = bos_id is not None and tokenizer("a")["input_ids"][:1] == [bos_id]
    holder: dict[str, LanguageModel] = {}

    def predict_texts(texts: list[str]) -> np.ndarray:
        lm = holder["lm"]
        out = np.empty((len(texts), 1), dtype=np.float32)
        for k, text in enumerate(texts):
            ids = lm.encode(text, bos=True)[: MAX_TOKENS + 1]
            out[k, 0] = lm.response_log_likelihood([ids[:1]], ids[1:])[0][0] if ids else 0.0
        return out

    def token_spans(text: str) -> list[tuple[int, int]]:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(s), int(e)) for s, e in enc["offset_mapping"]]

    lm = LanguageModel(
        name=name,
        modality=Modality.LM,
        task="generation",
        input_shape=(),
        feature_names=(),
        output_names=("log_likelihood",),
        module=hf,
        predict_texts=predict_texts,
        token_spans=token_spans,
        mask_token="",
        max_chars=MAX_TOKENS * 4,
        max_tokens=MAX_TOKENS,
        batch_size=BATCH_SIZE,
        version=f"{digest}{info['gguf_sha256'][:4]}",
        hf=hf,
        tokenizer=tokenizer,
        add_bos=add_bos,
        cache_dir=cache_dir,
        info={
            "source": source.description,
            "package": f"{source.package} {info['package_version']}",
            "gguf_sha256": info["gguf_sha256"],
            "architecture": type(hf).__name__,
            "parameters": sum(p.numel() for p in hf.parameters()),
            "cache": "bf16 safetensors, computed in float32",
            "convert_seconds": info["convert_seconds"],
            "load_seconds": round(time.perf_counter() - start, 2),
            "predict": "log-likelihood of each text (sum over its tokens after the first)",
        },
    )
    holder["lm"] = lm
    return lm


# One loaded copy per (name, cache dir) in a process: the registry and the AttriBoT proxy
# look-up share it instead of holding two copies of the weights.
_LOADED: dict[tuple[str, Path], LanguageModel] = {}
_LOCKS: dict[tuple[str, Path], threading.Lock] = {}
_GUARD = threading.Lock()


def shared_language_model(
    name: str, cache_dir: Path, device: torch.device | None = None
) -> LanguageModel:
    """The process's one copy of a built-in LM, loaded on first use (on the CPU); moved to
    `device` when given (an AttriBoT proxy follows its target: `model.device`). The registry
    moves the same copy when it loads the model."""
    key = (name, cache_dir.resolve())
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _LOADED:
            _LOADED[key] = load_language_model(name, cache_dir)
        lm = _LOADED[key]
        if device is not None and lm.device != device:
            from models.device import place

            lm = _LOADED[key] = place(lm, device)
        return lm
