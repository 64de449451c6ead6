"""Hugging Face checkpoints and ONNX text models in a model worker (issue 27).

The server unpacks the checkpoint (its own archive reader, models/adapters/archive.py, as before)
into a private folder, and the worker makes that folder its root (chroot) instead of an empty one:
after it dropped to nobody, transformers, tokenizers and onnxruntime read config.json, the tokenizer
and the safetensors weights from "/" and nothing else; the server removes the folder once the
worker answered its build. Every forward and backward pass, the embedding hook and a causal LM's
log-likelihoods, key/value caches and generation run here (`HfServed`); the server's stand-ins
are models/sandbox/hf_proxy.py's.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import re
import shutil
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from models.sandbox.worker import Served

MAX_PREFIXES = 8  # key/value caches a worker keeps (least recently used dropped)
_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


# --- the server's side: the folder the worker reads and the modules it imports first ---------


def prepare_folder(meta: dict[str, Any], data: bytes) -> tuple[str, str]:
    """(a private folder to remove afterwards, the checkpoint folder inside it): the archive
    unpacked, or a `uri` folder copied, readable by the worker's user (nobody) only through
    the 0700 parent, which the worker passes as root before its chroot."""
    from models.adapters.archive import unpack
    from models.adapters.checkpoint import root_prefix
    from models.adapters.hf import _all, folder_digest
    from models.declaration import InvalidModelError

    parent = tempfile.mkdtemp(prefix="hf-worker-")
    try:
        base = Path(parent) / "model"
        uri = meta.get("uri")
        if uri:
            src = Path(str(uri))
            if not src.is_dir():
                raise InvalidModelError(f"uri {uri}: the folder is gone")
            digest = meta.get("uri_digest")
            if digest and folder_digest(src) != digest:
                raise InvalidModelError(
                    f"uri {uri}: the folder changed since it was registered; register again"
                )
            shutil.copytree(src, base, symlinks=False)
            root = base
        else:
            base.mkdir()
            unpack(data, base)
            found = [PurePosixPath(p) for p in _all(base)]
            root = base.joinpath(*root_prefix(found).parts)
        for folder, _dirs, files in os.walk(base):
            os.chmod(folder, 0o755)
            for name in files:
                path = Path(folder) / name
                if path.is_symlink():
                    path.unlink()
                else:
                    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
        return parent, str(root)
    except BaseException:
        shutil.rmtree(parent, ignore_errors=True)
        raise


def imports_for(root: str) -> list[str]:
    """The transformers modules this checkpoint's loader imports lazily (its architecture's
    and its tokenizer's), by the names config.json and tokenizer_config.json state: only
    names of transformers' own model folders are kept (nothing else can be named)."""
    import json

    names: list[str] = []
    with contextlib.suppress(Exception):
        config = json.loads((Path(root) / "config.json").read_text())
        names.append(str(config.get("model_type", "")))
    with contextlib.suppress(Exception):
        tok = json.loads((Path(root) / "tokenizer_config.json").read_text())
        cls = str(tok.get("tokenizer_class", ""))
        names.append(re.sub(r"(TokenizerFast|Tokenizer)$", "", cls).lower())
    out: list[str] = []
    for name in names:
        with contextlib.suppress(Exception):
            from transformers.models.auto.configuration_auto import model_type_to_module_name

            module = model_type_to_module_name(name.replace("-", "_"))
            if not _NAME.match(module):
                continue
            for part in ("configuration", "modeling", "tokenization", "tokenization_fast"):
                out.append(f"transformers.models.{module}.{part}_{module}")
    return out


def preimport(names: list[str]) -> None:
    """Import these modules before the chroot (a worker cannot read a file afterwards)."""
    for name in names:
        if isinstance(name, str) and name.startswith("transformers.models."):
            with contextlib.suppress(Exception):
                importlib.import_module(name)


# --- the worker's side -------------------------------------------------------------------------


class _FromEmbeddings(torch.nn.Module):
    """embeddings [b, t, d] -> probabilities [b, k]: the classifier UNI unlearns a copy of
    (its parameters are the checkpoint's; the type ids come with each call)."""

    def __init__(self, hf: Any, link: str, typed: bool) -> None:
        super().__init__()
        self.hf = hf
        self.link, self.typed = link, typed
        self.types = torch.zeros((1, 1), dtype=torch.long)

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        from models.adapters.hf_models import FromEmbeddings

        return FromEmbeddings(self.hf, self.types, self.link, self.typed, "probability")(embeds)


_SENTENCES: list[str] = []


def read_files_now() -> None:
    """What a builder reads from the host's files, read once in the zygote: the encoders'
    reference pool (scikit-learn's dataset descriptions)."""
    import models.builtin.encoders

    if not _SENTENCES:
        _SENTENCES.extend(models.builtin.encoders.descr_sentences())


def build(meta: dict[str, Any], check: bool) -> Any:
    """The model of the checkpoint in the worker's root (its working directory)."""
    import models.builtin.encoders

    if _SENTENCES:  # read in the zygote (no host file can be opened here)
        models.builtin.encoders.descr_sentences = lambda: list(_SENTENCES)
    from models.adapters.checkpoint import folder_checkpoint
    from models.adapters.hf import _load
    from models.adapters.hf_models import check_texts
    from models.declaration import Declaration

    decl = Declaration.from_dict({**meta, "uri": None, "uri_digest": None})
    root = Path(".").resolve()
    model = _load(decl, folder_checkpoint(root), root, str(meta.get("version", "")))
    if check:
        check_texts(model)  # type: ignore[arg-type]
    return model


def _kind(model: Any) -> str:
    from models.adapters.hf_models import EmbeddingTextModel
    from models.base import RankerModel
    from models.builtin.lm import LanguageModel

    if isinstance(model, LanguageModel):
        return "lm"
    if isinstance(model, RankerModel):
        return "ranker"
    if isinstance(model, EmbeddingTextModel):
        return "classifier"
    return "encoder" if model.modality == "encoder" else "texts"


def _json_info(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in info.items():
        if (
            isinstance(v, (str, int, float, bool))
            or v is None
            or (isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v))
        ):
            out[str(k)] = v
    return out


class HfServed(Served):
    """A checkpoint's model in the worker and the text operations the server calls."""

    def __init__(self, model: Any, state: dict[str, str]) -> None:
        self.model = model
        self.state = state
        self.kind = _kind(model)
        self.scratch = None
        self.module: torch.nn.Module | None = None
        self.names, self.buffer_names = [], []
        if self.kind == "classifier":
            hook = model.embeddings
            self.module = _FromEmbeddings(hook.hf, hook.link, hook.runner.types).eval()
            self.names = [n for n, _ in self.module.named_parameters()]
            self.buffer_names = [n for n, _ in self.module.named_buffers()]
        self.prefixes: OrderedDict[int, Any] = OrderedDict()
        self.handles = itertools.count(1)

    def spec(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        m = self.model
        out: dict[str, Any] = {
            "kind": self.kind,
            "sandbox": self.state,
            "mask_token": None if m.mask_token is None else str(m.mask_token),
            "batch_size": int(m.batch_size),
            "max_chars": int(m.max_chars),
            "max_tokens": int(getattr(m, "max_tokens", 0)),
            "platform": str(m.platform),
            "info": _json_info(dict(m.info)),
        }
        if self.kind == "classifier":
            hook = m.embeddings
            out["hook"] = {
                "mask_id": None if hook.mask_id is None else int(hook.mask_id),
                "pad_id": None if hook.pad_id is None else int(hook.pad_id),
                "parameters": [[n, True] for n in self.names],
                "buffers": self.buffer_names,
            }
        if self.kind == "lm":
            out["lm"] = {"add_bos": bool(m.add_bos)}
        return out, []

    # -- the black-box operations --

    def texts(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        texts = [str(t) for t in header["texts"]]
        return {}, [np.ascontiguousarray(self.model.predict_texts(texts), dtype=np.float32)]

    def spans(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        return {"spans": [list(s) for s in self.model.token_spans(str(header["text"]))]}, []

    def score(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        queries = [str(q) for q in header["queries"]]
        documents = [[str(d) for d in docs] for docs in header["documents"]]
        out = np.asarray(self.model.score_lists(queries, documents), dtype=np.float64)
        return {}, [np.ascontiguousarray(out)]

    # -- the embedding hook (text integrated gradients, UNI) --

    def encode(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        ids, types, offsets, special = self.model.embeddings.encode(str(header["text"]))
        return {"ids": ids, "types": types, "offsets": [list(o) for o in offsets],
                "special": special}, []  # fmt: skip

    def embed(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        ids = torch.from_numpy(arrays[0].astype(np.int64))
        with torch.no_grad():
            out = self.model.embeddings.embed(ids)
        return {}, [out.detach().float().numpy()]

    def hook_scores(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        x = torch.from_numpy(arrays[0].copy())
        types = torch.from_numpy(arrays[1].astype(np.int64))
        output = str(header.get("output", "probability"))
        if not header.get("grad"):
            with torch.no_grad():
                out = self.model.embeddings.scores(x, types, output)
            return {}, [out.detach().float().numpy()]
        x.requires_grad_(True)
        grad_out = torch.from_numpy(arrays[2].copy())
        with torch.enable_grad():
            out = self.model.embeddings.scores(x, types, output)
            (grad,) = torch.autograd.grad(out, x, grad_out.to(out.dtype).reshape(out.shape))
        return {}, [grad.detach().float().numpy()]

    def hidden(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        """AutoGnothi's encoder pass: per text its token ids and offsets; arrays: every
        level's hidden states [b, levels, t, d] (embeddings, then each layer) and the
        classifier's probabilities [b, C]."""
        run = self.model.embeddings.runner
        texts = [str(t) for t in header["texts"]]
        encodings = run.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = torch.zeros(len(texts), width, dtype=torch.int64)
        mask = torch.zeros(len(texts), width, dtype=torch.int64)
        for r, enc in enumerate(encodings):
            ids[r, : len(enc.ids)] = torch.tensor(enc.ids)
            mask[r, : len(enc.ids)] = 1
        with torch.inference_mode():
            out = run.module(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hidden = torch.stack(out.hidden_states, dim=1).float()
            probs = torch.softmax(out.logits, dim=-1).float()
        tokens = [{"ids": list(e.ids), "offsets": [list(o) for o in e.offsets]} for e in encodings]
        return {"tokens": tokens}, [hidden.contiguous().numpy(), probs.contiguous().numpy()]

    def vocab(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        return {"vocab": sorted(self.model.embeddings.runner.tokenizer.get_vocab())}, []

    def std(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        return {}, [self.model.embeddings.embedding_std().detach().float().numpy()]

    def weights(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        assert self.module is not None
        params = dict(self.module.named_parameters())
        buffers = dict(self.module.named_buffers())
        tensors = [params[n] for n in self.names] + [buffers[n] for n in self.buffer_names]
        return {}, [t.detach().cpu().contiguous().numpy() for t in tensors]

    def _module(self, header: dict[str, Any], arrays: list[np.ndarray]) -> torch.nn.Module:
        module = super()._module(header, arrays)
        module.types = torch.tensor([[int(t) for t in header.get("types", [0])]])
        return module

    # -- a causal LM (AttriBoT, ContextCite) --

    def lm_encode(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        return {"ids": self.model.encode(str(header["text"]), bos=bool(header["bos"]))}, []

    def lm_decode(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        return {"text": self.model.decode([int(i) for i in header["ids"]])}, []

    def rll(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        prompts = [[int(i) for i in p] for p in header["prompts"]]
        response = [int(i) for i in header["response"]]
        prefix = None
        handle = header.get("prefix")
        if isinstance(handle, int) and handle in self.prefixes:
            prefix = self.prefixes[handle]
            self.prefixes.move_to_end(handle)
        out, passes, tokens = self.model.response_log_likelihood(
            prompts, response, prefix=prefix, batch_size=int(header.get("batch_size", 8))
        )
        reply = {"passes": int(passes), "tokens": int(tokens), "reused": prefix is not None}
        return reply, [np.asarray(out, dtype=np.float64)]

    def full_pass(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        prompt = [int(i) for i in header["prompt"]]
        response = [int(i) for i in header["response"]]
        ll, cache = self.model.full_pass(prompt, response)
        handle = next(self.handles)
        self.prefixes[handle] = cache
        while len(self.prefixes) > MAX_PREFIXES:
            self.prefixes.popitem(last=False)
        return {"ll": float(ll), "handle": handle}, []

    def generate(self, header: dict[str, Any], arrays: list[np.ndarray]) -> Any:
        prompt = [int(i) for i in header["prompt"]]
        return {"ids": self.model.generate(prompt, int(header["max_new_tokens"]))}, []


OPS = frozenset(
    {
        "texts", "spans", "score", "encode", "embed", "hook_scores", "std", "weights",
        "hidden", "vocab",
        "forward", "vjp", "lm_encode", "lm_decode", "rll", "full_pass", "generate",
    }
)  # fmt: skip
