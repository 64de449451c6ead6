"""ONNX text classifiers: a checkpoint folder with `model.onnx` and the fast tokenizer's
`tokenizer.json` (config.json with id2label optional), a black box for model-agnostic explainers.

Texts are tokenised by the `tokenizers` library from tokenizer.json (offline, no padding changes
between calls), run by onnxruntime on the CPU provider with `input_ids`, `attention_mask` and,
when the graph reads it, `token_type_ids`; the outputs are the softmax of the logits [N, k]
(a sigmoid for multi-label configs, the logits themselves for regression).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import TextModel
from models.declaration import Declaration, InvalidModelError
from models.modality import Modality

if TYPE_CHECKING:
    from models.adapters.checkpoint import Checkpoint

BATCH_SIZE = 64  # texts per session run
TOKENS_PER_BATCH = 8192  # padded tokens per session run
MAX_POSITIONS = 512  # when neither config.json nor tokenizer_config.json says
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MASKS = ("[MASK]", "<mask>")
PADS = ("[PAD]", "<pad>")


def _special(tok: Any, config: dict[str, Any], key: str, names: tuple[str, ...]) -> str | None:
    """A special token by tokenizer_config.json's name for it, else a usual spelling."""
    raw = config.get(key)
    value = raw.get("content") if isinstance(raw, dict) else raw
    for name in (value, *names):
        if isinstance(name, str) and tok.token_to_id(name) is not None:
            return name
    return None


def _tokenizer(root: Path, tok_config: dict[str, Any], positions: int) -> tuple[Any, int]:
    """(the tokenizer of tokenizer.json, its max tokens without special tokens)."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as exc:
        raise InvalidModelError(f"tokenizer.json could not be loaded: {exc}") from None
    specials = tok.post_processor.num_special_tokens_to_add(False) if tok.post_processor else 0
    limit = tok_config.get("model_max_length")
    if isinstance(limit, int) and 0 < limit < 1_000_000:
        positions = min(positions, limit)
    max_tokens = max(1, positions - specials)
    tok.no_padding()
    tok.enable_truncation(max_tokens + specials)
    return tok, max_tokens


def _check_external(path: Path) -> None:
    """External data of model.onnx only from files inside its folder (models/adapters/onnx.py)."""
    import onnx

    from models.adapters.onnx import OnnxModelError, check_external_data

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:
        raise InvalidModelError(f"model.onnx: onnx cannot read it: {exc}") from None
    try:
        check_external_data(model, path.parent)
    except OnnxModelError as exc:
        raise InvalidModelError(f"model.onnx: {exc}") from None


def _session(path: Path) -> tuple[Any, list[str], str]:
    """(an onnxruntime session on the CPU provider, its token inputs, the logits output)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    _check_external(path)
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise InvalidModelError(f"model.onnx: onnxruntime cannot read it: {exc}") from None
    names = [i.name for i in session.get_inputs()]
    if "input_ids" not in names or "attention_mask" not in names:
        raise InvalidModelError(
            f"model.onnx reads {names}: a text classifier reads input_ids and attention_mask "
            "(optionally token_type_ids)"
        )
    odd = [n for n in names if n not in TOKEN_INPUTS]
    if odd:
        raise InvalidModelError(f"model.onnx reads {odd}, which a tokenizer does not give")
    outputs = [o for o in session.get_outputs() if o.type == "tensor(float)" and len(o.shape) == 2]
    if not outputs:
        raise InvalidModelError("model.onnx has no float output of shape [N, k] (the logits)")
    named = [o for o in outputs if o.name == "logits"]
    return session, names, (named or outputs)[0].name


class OnnxTextRunner:
    """Tokenises texts, pads them per batch and runs the session: texts -> float32 logits."""

    def __init__(self, tok: Any, pad_id: int, session: Any, inputs: list[str], output: str):
        self.tok, self.pad_id = tok, pad_id
        self.session, self.inputs, self.output = session, inputs, output

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the text's tokens (no special tokens)."""
        enc = self.tok.encode(text, add_special_tokens=False)
        return [(int(s), int(e)) for s, e in enc.offsets]

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [m, k], batches of similar lengths (bounded padded tokens)."""
        encs = self.tok.encode_batch(list(texts))
        order = np.argsort([len(e.ids) for e in encs], kind="stable")
        parts: dict[int, np.ndarray] = {}
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and stop - start < BATCH_SIZE:
                if (stop - start + 1) * len(encs[order[stop]].ids) > TOKENS_PER_BATCH:
                    break
                stop += 1
            rows = order[start:stop]
            width = len(encs[rows[-1]].ids)
            feed = {
                "input_ids": np.full((len(rows), width), self.pad_id, dtype=np.int64),
                "attention_mask": np.zeros((len(rows), width), dtype=np.int64),
                "token_type_ids": np.zeros((len(rows), width), dtype=np.int64),
            }
            for r, i in enumerate(rows):
                enc, n = encs[i], len(encs[i].ids)
                feed["input_ids"][r, :n] = enc.ids
                feed["attention_mask"][r, :n] = 1
                feed["token_type_ids"][r, :n] = enc.type_ids
            try:
                out = self.session.run([self.output], {k: feed[k] for k in self.inputs})[0]
            except Exception as exc:  # onnxruntime's own errors: the graph failed on these
                raise InvalidModelError(f"onnxruntime failed: {exc}") from None
            for r, i in enumerate(rows):
                parts[int(i)] = np.asarray(out[r], dtype=np.float32)
            start = stop
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([parts[i] for i in range(len(encs))])


def _link(ck: Checkpoint, task: str) -> str:
    if task == "regression":
        return "identity"
    return "sigmoid" if ck.config.get("problem_type") == "multi_label_classification" else "softmax"


def onnx_text_classifier(decl: Declaration, ck: Checkpoint, root: Path, version: str) -> TextModel:
    """The text classifier of a folder with model.onnx and tokenizer.json."""
    tok_config = _json(root / "tokenizer_config.json")
    positions = int(ck.config.get("max_position_embeddings") or MAX_POSITIONS)
    tok, max_tokens = _tokenizer(root, tok_config, positions)
    vocab = ck.config.get("vocab_size")
    if isinstance(vocab, int) and tok.get_vocab_size() > vocab:
        raise InvalidModelError(
            f"tokenizer.json has {tok.get_vocab_size()} tokens but config.json's vocab_size is "
            f"{vocab}: a tokenizer from another model?"
        )
    session, inputs, output = _session(root / "model.onnx")
    pad = _special(tok, tok_config, "pad_token", PADS)
    mask = _special(tok, tok_config, "mask_token", MASKS)
    unk = _special(tok, tok_config, "unk_token", ("[UNK]", "<unk>"))
    runner = OnnxTextRunner(tok, tok.token_to_id(pad) if pad else 0, session, inputs, output)
    link = _link(ck, decl.task)
    k = len(decl.output_names)

    def predict_texts(texts: list[str]) -> np.ndarray:
        logits = runner.logits(texts).astype(np.float64)
        if logits.shape[1:] != (k,):
            raise InvalidModelError(
                f"model.onnx output {output!r} has {logits.shape[1:]} values per text; the "
                f"model declares {k} outputs {list(decl.output_names)}"
            )
        if link == "softmax":
            z = np.exp(logits - logits.max(axis=1, keepdims=True))
            logits = z / z.sum(axis=1, keepdims=True)
        elif link == "sigmoid":
            logits = 1.0 / (1.0 + np.exp(-logits))
        return logits.astype(np.float32)

    return TextModel(
        name=decl.name,
        modality=Modality.TEXT,
        task=decl.task,
        input_shape=(),
        feature_names=(),
        output_names=decl.output_names,
        module=None,
        predict_texts=predict_texts,
        token_spans=runner.token_spans,
        mask_token=mask or unk or "",
        max_tokens=max_tokens,
        batch_size=BATCH_SIZE,
        version=version,
        platform="onnx",
        info={
            "source": "onnx",
            "runtime": "onnxruntime (CPUExecutionProvider)",
            "inputs": inputs,
            "explained_output": output,
            "outputs": f"{link} of {output!r}" if link != "identity" else output,
            "tokenizer": "tokenizer.json (tokenizers)",
            "max_tokens": max_tokens,
        },
    )


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path.name} is unreadable: {exc}") from None
    return value if isinstance(value, dict) else {}
