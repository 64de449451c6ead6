"""The models a Hugging Face checkpoint becomes: a text classifier (TextModel), a causal language
model (LanguageModel, for AttriBoT and ContextCite), a sentence encoder (for COCOA) or a
cross-encoder ranker (RankerModel, for RankSHAP).

transformers loads from local files only (HF_HUB_OFFLINE, local_files_only), safetensors only,
without remote code, in float32. Texts are tokenised by a private copy of the fast tokenizer
(configured once: no per-call padding changes, so runners are safe to share between threads).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.adapters.checkpoint import Checkpoint, outputs_of, task_of
from models.base import Model, RankerModel, TextModel, module_device
from models.declaration import Declaration, InvalidModelError
from models.modality import Modality

BATCH_SIZE = 64  # texts per forward pass
TOKENS_PER_BATCH = 8192  # padded tokens per forward pass
LM_MAX_TOKENS = 2048
ST_MODULES = ("Transformer", "Pooling", "Normalize")


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub, even by mistake
    from transformers.utils import logging

    logging.disable_progress_bar()


_LOAD = {"local_files_only": True, "trust_remote_code": False}


def _tokenizer(root: Path, vocab_size: int | None) -> Any:
    """The checkpoint's fast tokenizer, checked against the model's vocabulary."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(root), **_LOAD)
    except Exception as exc:
        raise InvalidModelError(f"the tokenizer could not be loaded: {exc}") from None
    if not getattr(tok, "is_fast", False) or not hasattr(tok, "backend_tokenizer"):
        raise InvalidModelError(
            "the tokenizer is not a fast tokenizer: save tokenizer.json with "
            "tokenizer.save_pretrained (character offsets need it)"
        )
    if vocab_size and len(tok) > vocab_size:
        raise InvalidModelError(
            f"the tokenizer has {len(tok)} tokens but the model embeds {vocab_size} (config.json "
            "vocab_size): a tokenizer from another model?"
        )
    return tok


def _weights(auto: Any, root: Path, ignore: tuple[str, ...] = ()) -> Any:
    """`auto.from_pretrained` from safetensors in float32; every weight must be in the file."""
    try:
        hf, info = auto.from_pretrained(
            str(root), use_safetensors=True, dtype=torch.float32, output_loading_info=True, **_LOAD
        )
    except Exception as exc:
        raise InvalidModelError(f"transformers could not load the checkpoint: {exc}") from None
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(ignore)]
    if missing:
        raise InvalidModelError(
            f"weights missing from model.safetensors (they would be random): {sorted(missing)[:5]}"
        )
    return hf.eval()


class Runner:
    """Tokenises texts (or text pairs) with the checkpoint's tokenizer and batches them."""

    def __init__(self, tok: Any, max_tokens: int, module: nn.Module) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tok.backend_tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens + tok.num_special_tokens_to_add(pair=False))
        self.pad_id = int(tok.pad_token_id or 0)
        self.types = "token_type_ids" in tok.model_input_names
        self.module = module

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the text's tokens (no special tokens)."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return [(int(s), int(e)) for s, e in enc.offsets]

    def run(self, inputs: Sequence[Any], fn: Callable[..., torch.Tensor]) -> np.ndarray:
        """fn(input_ids, attention_mask[, token_type_ids]) -> [b, k] per batch; float32 [m, k]."""
        encs = self.tokenizer.encode_batch(list(inputs))
        order = np.argsort([len(e.ids) for e in encs], kind="stable")
        device = module_device(self.module)
        parts: dict[int, np.ndarray] = {}
        start = 0
        with torch.inference_mode():
            while start < len(order):
                stop = start + 1
                while stop < len(order) and stop - start < BATCH_SIZE:
                    if (stop - start + 1) * len(encs[order[stop]].ids) > TOKENS_PER_BATCH:
                        break
                    stop += 1
                rows = order[start:stop]
                width = len(encs[rows[-1]].ids)
                ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                types = np.zeros((len(rows), width), dtype=np.int64)
                for r, i in enumerate(rows):
                    n = len(encs[i].ids)
                    ids[r, :n], mask[r, :n], types[r, :n] = encs[i].ids, 1, encs[i].type_ids
                args = [torch.from_numpy(a).to(device) for a in (ids, mask, types)]
                out = fn(*args[: 3 if self.types else 2]).float().cpu().numpy()
                for r, i in enumerate(rows):
                    parts[int(i)] = out[r]
                start = stop
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([parts[i] for i in range(len(encs))]).astype(np.float32)


class EmbeddingHook:
    """A classifier from its input embeddings, with gradients: what integrated gradients on
    the embeddings needs (explainers/gradients/integrated_text.py)."""

    def __init__(self, hf: Any, tok: Any, runner: Runner, link: str) -> None:
        self.hf, self.runner, self.link = hf, runner, link
        self.mask_id = tok.mask_token_id
        self.pad_id = runner.pad_id

    def encode(self, text: str) -> tuple[list[int], list[int], list[tuple[int, int]], list[bool]]:
        """Token ids (special tokens included), type ids, character offsets, special flags."""
        enc = self.runner.tokenizer.encode(text)
        offsets = [(int(a), int(b)) for a, b in enc.offsets]
        return (
            list(enc.ids),
            list(enc.type_ids),
            offsets,
            [bool(f) for f in enc.special_tokens_mask],
        )

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input (word) embeddings of token ids [b, t] on the model's device: [b, t, d]."""
        layer = self.hf.get_input_embeddings()
        return layer(ids.to(module_device(self.hf)))

    def scores(self, embeds: torch.Tensor, types: torch.Tensor, output: str) -> torch.Tensor:
        """Outputs [b, k] from input embeddings [b, t, d]: the model's (probabilities) or logits."""
        return FromEmbeddings(self.hf, types, self.link, self.runner.types, output)(embeds)

    def module(self, types: torch.Tensor) -> nn.Module:
        """The classifier as a module of input embeddings [b, t, d] -> probabilities [b, k]
        (UNI unlearns a copy of it)."""
        return FromEmbeddings(self.hf, types, self.link, self.runner.types, "probability")

    def embedding_std(self) -> torch.Tensor:
        """Per-dimension standard deviation of the vocabulary's embeddings. [d]"""
        with torch.no_grad():
            return self.hf.get_input_embeddings().weight.float().std(dim=0)


class FromEmbeddings(nn.Module):
    """input embeddings [b, t, d] -> outputs [b, k] of a sequence classifier (fixed type ids)."""

    def __init__(self, hf: Any, types: torch.Tensor, link: str, typed: bool, output: str) -> None:
        super().__init__()
        self.hf, self.types, self.link, self.typed, self.output = hf, types, link, typed, output

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        device = module_device(self.hf)
        kwargs: dict[str, Any] = {"inputs_embeds": embeds.to(device)}
        if self.typed:
            kwargs["token_type_ids"] = self.types.to(device).expand(len(embeds), -1)
        logits = self.hf(**kwargs).logits
        if self.output == "logit" or self.link == "identity":
            return logits
        return torch.softmax(logits, dim=-1) if self.link == "softmax" else torch.sigmoid(logits)


@dataclass(frozen=True, kw_only=True)
class EmbeddingTextModel(TextModel):
    """A Hugging Face text classifier whose input embeddings can be differentiated."""

    embeddings: EmbeddingHook


def _max_tokens(ck: Checkpoint, tok: Any, cap: int) -> int:
    positions = int(ck.config.get("max_position_embeddings") or ck.config.get("n_positions") or cap)
    limit = int(tok.model_max_length) if 0 < tok.model_max_length < 1_000_000 else positions
    return max(1, min(positions, limit, cap) - tok.num_special_tokens_to_add(pair=False))


def _info(ck: Checkpoint, hf: nn.Module, **extra: Any) -> dict[str, Any]:
    return {
        "source": "huggingface",
        "architecture": type(hf).__name__,
        "model_type": ck.config.get("model_type"),
        "parameters": sum(p.numel() for p in hf.parameters()),
        **extra,
    }


def _classifier(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> TextModel:
    from transformers import AutoModelForSequenceClassification

    tok = _tokenizer(root, ck.config.get("vocab_size"))  # before the weights: cheaper
    hf = _weights(AutoModelForSequenceClassification, root)
    max_tokens = _max_tokens(ck, tok, 510)
    runner = Runner(tok, max_tokens, hf)
    problem = ck.config.get("problem_type")
    task = task_of(ck, "text")
    link = (
        "identity"
        if task == "regression"
        else "sigmoid"
        if problem == "multi_label_classification"
        else ("softmax")
    )

    def forward(*args: torch.Tensor) -> torch.Tensor:
        logits = hf(*args).logits
        if link == "softmax":
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits) if link == "sigmoid" else logits

    def predict_texts(texts: list[str]) -> np.ndarray:
        out = runner.run(texts, forward)
        return out.reshape(len(texts), len(decl.output_names))

    return EmbeddingTextModel(
        name=decl.name,
        modality=Modality.TEXT,
        task=decl.task,
        input_shape=(),
        feature_names=(),
        output_names=decl.output_names,
        module=hf,
        predict_texts=predict_texts,
        token_spans=runner.token_spans,
        mask_token=str(tok.mask_token or tok.unk_token or ""),
        max_tokens=max_tokens,
        batch_size=BATCH_SIZE,
        version=version,
        platform="huggingface",
        info=_info(ck, hf, outputs=f"{link} of the logits", max_tokens=max_tokens),
        embeddings=EmbeddingHook(hf, tok, runner, link),
    )


def _pooling(ck: Checkpoint, root: Path) -> tuple[str, bool]:
    """(pooling mode, normalize) from the sentence-transformers configuration."""
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in ck.modules]
    odd = [t for t in types if t not in ST_MODULES]
    if odd:
        raise InvalidModelError(
            f"sentence-transformers modules {odd} are not supported (only {list(ST_MODULES)})"
        )
    path = next(
        (
            root / str(m.get("path")) / "config.json"
            for m in ck.modules
            if str(m.get("type", "")).endswith("Pooling")
        ),
        root / "1_Pooling" / "config.json",
    )
    cfg = _json_file(path)
    modes = [
        m
        for m in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
        if cfg.get(f"pooling_mode_{m}")
    ]
    if len(modes) != 1:
        raise InvalidModelError(f"pooling config: one pooling mode is supported, got {modes}")
    return modes[0], "Normalize" in types


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path.name} is unreadable: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidModelError(f"{path.name} must be a JSON object")
    return value


def _encoder(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> TextModel:
    from transformers import AutoModel

    tok = _tokenizer(root, ck.config.get("vocab_size"))
    hf = _weights(AutoModel, root, ignore=("pooler.",))
    mode, normalize = _pooling(ck, root)
    st = (
        _json_file(root / "sentence_bert_config.json")
        if ("sentence_bert_config.json" in ck.files)
        else {}
    )
    max_tokens = _max_tokens(ck, tok, int(st.get("max_seq_length") or 512))
    runner = Runner(tok, max_tokens, hf)

    def forward(ids: torch.Tensor, mask: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        hidden = hf(ids, mask, *rest).last_hidden_state  # [b, t, d]
        keep = mask.unsqueeze(-1).to(hidden.dtype)
        if mode == "cls_token":
            pooled = hidden[:, 0]
        elif mode == "max_tokens":
            pooled = hidden.masked_fill(keep == 0, -1e9).max(dim=1).values
        elif mode == "lasttoken":
            pooled = hidden[torch.arange(len(ids)), mask.sum(dim=1) - 1]
        else:
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=1) if normalize else pooled

    from models.builtin.encoders import ENCODER_TASK, descr_sentences

    pool = np.array(descr_sentences(), dtype=str)
    return TextModel(
        name=decl.name,
        modality=Modality.ENCODER,
        task=ENCODER_TASK,
        input_shape=(),
        feature_names=(),
        output_names=decl.output_names,
        module=hf,
        predict_texts=lambda texts: runner.run(texts, forward),
        token_spans=runner.token_spans,
        mask_token=str(tok.mask_token or tok.unk_token or ""),
        max_tokens=max_tokens,
        batch_size=BATCH_SIZE,
        version=version,
        platform="huggingface",
        reference=pool,
        info=_info(
            ck,
            hf,
            pooling=mode,
            normalize=normalize,
            reference=f"{len(pool)} sentences of scikit-learn's dataset descriptions (the pool "
            "foil='auto' samples from)",
        ),
    )


def _ranker(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> RankerModel:
    from transformers import AutoModelForSequenceClassification

    tok = _tokenizer(root, ck.config.get("vocab_size"))  # before the weights: cheaper
    hf = _weights(AutoModelForSequenceClassification, root)
    runner = Runner(tok, _max_tokens(ck, tok, 510), hf)

    def forward(*args: torch.Tensor) -> torch.Tensor:
        return hf(*args).logits[:, :1]

    def score_lists(queries: Sequence[str], documents: Sequence[Sequence[str]]) -> np.ndarray:
        if len({len(d) for d in documents}) > 1:
            raise ValueError("every document list of one call needs the same length")
        pairs = [(q, doc) for q, docs in zip(queries, documents, strict=True) for doc in docs]
        out = runner.run(pairs, forward).astype(np.float64)
        return out.reshape(len(queries), -1)

    return RankerModel(
        name=decl.name,
        modality=Modality.RANKER,
        task="ranking",
        input_shape=(),
        feature_names=(),
        output_names=("score",),
        module=hf,
        score_lists=score_lists,
        mask_token=tok.mask_token,
        version=version,
        platform="huggingface",
        info=_info(ck, hf, method="cross-encoder: the logit of (query, document) pairs"),
    )


class CausalAdapter(nn.Module):
    """A causal LM as models.builtin.lm.LanguageModel reads it: `model` (the decoder stack),
    `lm_head`, `config`, `generation_config`, `generate`, whatever the architecture names them."""

    def __init__(self, hf: Any) -> None:
        super().__init__()
        self.hf = hf
        self.config = hf.config

    @property
    def model(self) -> nn.Module:
        return self.hf.base_model

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    @property
    def generation_config(self) -> Any:
        return self.hf.generation_config

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.hf.generate(*args, **kwargs)


def _language_model(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> Model:
    from transformers import AutoModelForCausalLM

    from models.builtin.lm import LanguageModel

    tok = _tokenizer(root, ck.config.get("vocab_size"))
    hf = _weights(AutoModelForCausalLM, root)
    if hf.get_output_embeddings() is None:
        raise InvalidModelError("the causal LM has no output embeddings (lm_head)")
    adapter = CausalAdapter(hf).eval()
    bos_id = tok.bos_token_id
    add_bos = bos_id is not None and tok("a")["input_ids"][:1] == [bos_id]
    positions = int(ck.config.get("max_position_embeddings") or ck.config.get("n_positions") or 0)
    max_tokens = min(LM_MAX_TOKENS, positions) if positions else LM_MAX_TOKENS
    holder: dict[str, LanguageModel] = {}

    def predict_texts(texts: list[str]) -> np.ndarray:
        lm = holder["lm"]
        out = np.empty((len(texts), 1), dtype=np.float32)
        for k, text in enumerate(texts):
            ids = lm.encode(text, bos=True)[: max_tokens + 1]
            out[k, 0] = lm.response_log_likelihood([ids[:1]], ids[1:])[0][0] if ids else 0.0
        return out

    def token_spans(text: str) -> list[tuple[int, int]]:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(s), int(e)) for s, e in enc["offset_mapping"]]

    lm = LanguageModel(
        name=decl.name,
        modality=Modality.LM,
        task="generation",
        input_shape=(),
        feature_names=(),
        output_names=("log_likelihood",),
        module=adapter,
        predict_texts=predict_texts,
        token_spans=token_spans,
        mask_token="",
        max_chars=max_tokens * 4,
        max_tokens=max_tokens,
        batch_size=8,
        version=version,
        platform="huggingface",
        hf=adapter,
        tokenizer=tok,
        add_bos=add_bos,
        cache_dir=_builtin_cache(),
        info=_info(
            ck, hf, predict="log-likelihood of each text (sum over its tokens after the first)"
        ),
    )
    holder["lm"] = lm
    return lm


def _builtin_cache() -> Path:
    """Where the built-in LMs (AttriBoT's proxy models) are cached: MODEL_DIR as the service's
    settings read it, else their default."""
    default = Path.home() / ".cache" / "attribution-service" / "models"
    return Path(os.environ.get("MODEL_DIR") or default)


BUILDERS = {"text": _classifier, "encoder": _encoder, "ranker": _ranker, "lm": _language_model}


def load(decl: Declaration, ck: Checkpoint, root: Path, version: str, model_kind: str) -> Model:
    """The model of kind `model_kind` from the checkpoint folder `root`."""
    _offline()
    if tuple(decl.output_names) and len(decl.output_names) != len(outputs_of(ck, model_kind)):
        raise InvalidModelError(
            f"declared output_names {list(decl.output_names)} contradict config.json's "
            f"{list(outputs_of(ck, model_kind))}"
        )
    model: Model = BUILDERS[model_kind](decl, ck, root, version)
    return model


def check_texts(model: TextModel | RankerModel) -> TextModel | RankerModel:
    """A test forward pass on two short texts (or a query and two documents): finite outputs
    of the stated shape."""
    try:
        if isinstance(model, RankerModel):
            out = model.score("a test query", ["a first document", "a second one"])[:, None]
        else:
            out = model.predict(["A short test sentence.", "Another one"])
    except Exception as exc:
        raise InvalidModelError(f"test forward pass on two texts failed: {exc}") from None
    if out.shape != (2, model.n_outputs) or not np.all(np.isfinite(out)):
        raise InvalidModelError(
            f"test forward pass gave shape {list(out.shape)}; expected [2, {model.n_outputs}] "
            "finite outputs"
        )
    return model
