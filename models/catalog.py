"""The catalog of built-in models: one line per model (name, modality, loader), nothing else.

Each family's loader lives with its family: the trained MLP/CNN family in models/builtin/trained.py,
the text classifier in models/builtin/text.py, encoders in models/builtin/encoders.py, rankers in
models/builtin/rankers.py, causal LMs in models/builtin/lm.py. Only this module imports them all, so
the families never import each other through the catalog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models.base import Model
from models.builtin.encoders import load_digits_encoder, load_minilm_encoder
from models.builtin.lm import shared_language_model
from models.builtin.rankers import load_bm25, load_minilm_ranker
from models.builtin.sst import load_digits_sst, load_digits_sst_twin
from models.builtin.text import load_sentiment_minilm
from models.builtin.trained import load_breast_cancer_mlp, load_diabetes_mlp, load_digits_cnn


@dataclass(frozen=True)
class BuiltinModel:
    """One catalog line: a built-in model's name, modality and loader (cache_dir -> Model)."""

    name: str
    modality: str
    load: Callable[[Path], Model]
    # Loaded after the others, in the background: readiness does not wait for it, the model
    # listing says "loading", and explain requests answer 503 until it is loaded.
    background: bool = False


def load_gemma3_270m(cache_dir: Path) -> Model:
    """Gemma 3 270M (pretrained) causal LM: AttriBoT's target (models/builtin/lm.py)."""
    return shared_language_model("gemma3-270m", cache_dir)


def load_smollm2_135m(cache_dir: Path) -> Model:
    """SmolLM2 135M Instruct causal LM: AttriBoT's proxy (models/builtin/lm.py)."""
    return shared_language_model("smollm2-135m", cache_dir)


BUILTINS: tuple[BuiltinModel, ...] = (
    BuiltinModel("diabetes-mlp", "tabular", load_diabetes_mlp),
    BuiltinModel("breast-cancer-mlp", "tabular", load_breast_cancer_mlp),
    BuiltinModel("digits-cnn", "image", load_digits_cnn),
    BuiltinModel("digits-sst", "image", load_digits_sst),  # SST's network: its own subset
    BuiltinModel("digits-sst-twin", "image", load_digits_sst_twin, background=True),  # ours
    BuiltinModel("sentiment-minilm", "text", load_sentiment_minilm),
    BuiltinModel("gemma3-270m", "lm", load_gemma3_270m, background=True),
    BuiltinModel("smollm2-135m", "lm", load_smollm2_135m, background=True),
    BuiltinModel("bm25", "ranker", load_bm25),
    BuiltinModel("minilm-ranker", "ranker", load_minilm_ranker),
    BuiltinModel("minilm-encoder", "encoder", load_minilm_encoder),
    BuiltinModel("digits-encoder", "encoder", load_digits_encoder),
)
