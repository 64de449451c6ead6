"""The one case table of the explainer tests: a valid request body per (explainer, modality) and
an instance per built-in model, shared by the library contract test
(tests/explainers/test_every_explainer.py) and the HTTP matrix (tests/app/test_matrix.py).

A new explainer gets its body here once: the matrix asks it of every model, the contract test of
the built-in model its CONTRACT row names. Small budgets: few players, few path steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.builtin.trained import dataset_split

QUERY = "solar electricity"
DOCS = [
    "solar panels convert sunlight into electricity",
    "the wind turbine makes electricity",
    "a recipe for bread with flour",
]
CONTEXT = "Zorblat is the capital of Quenmoria. It has a harbour.\n\nBread is baked from flour."
LM_QUERY = "What is the capital of Quenmoria?"
TEXTS = ["a cat sleeps on the warm mat", "a dog runs in the park"]
FOIL_TEXTS = ["stock prices fell sharply today", "the recipe needs two eggs"]


@dataclass(frozen=True)
class Kind:
    """One model of the matrix: its kind (for the summary) and a valid instance for it."""

    label: str
    instance: Any  # a row, an image, a text (rankers, LMs: a text, unused by their explainers)
    corpus: list[Any] | None = None  # encoders: COCOA's corpus and foil
    foil: list[Any] | None = None
    background: list[Any] | None = None  # tabular and image models: a few rows to send


def _cocoa(k: Kind) -> dict[str, Any]:
    corpus, foil = k.corpus or [k.instance], k.foil or [k.instance]  # others: refused anyway
    body: dict[str, Any] = {"inputs": [k.instance], "corpus": corpus, "foil": foil}
    if not isinstance(k.instance, str):
        body["parameters"] = {"patch_size": 4}  # 4 patches of an 8x8 image: exact, 16 coalitions
    return body


# One valid request per (explainer, modality), without seed and budget.
BODIES: dict[tuple[str, str], Callable[[Kind], dict[str, Any]]] = {
    ("shapley", "tabular"): lambda k: {"inputs": [k.instance]},
    ("shapley", "image"): lambda k: {"inputs": [k.instance], "parameters": {"patch_size": 4}},
    ("shapley", "text"): lambda k: {"inputs": [k.instance]},
    ("integrated-gradients", "tabular"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"steps": 4},
    },
    ("integrated-gradients", "image"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"steps": 4},
    },
    ("integrated-gradients", "text"): lambda k: {  # Hugging Face text classifiers
        "inputs": [k.instance],
        "parameters": {"steps": 4},
    },
    ("uni", "tabular"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"pgd_steps": 2, "ig_steps": 4},
    },
    ("uni", "image"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"pgd_steps": 2, "ig_steps": 4},
    },
    ("uni", "text"): lambda k: {  # Hugging Face text classifiers
        "inputs": [k.instance],
        "parameters": {"pgd_steps": 2, "ig_steps": 4},
    },
    ("rankshap", "ranker"): lambda k: {
        "query": QUERY,
        "documents": DOCS,
        "parameters": {"k": 2, "max_players": 6},
    },
    ("cocoa", "encoder"): _cocoa,
    ("salvage", "image"): lambda k: {"inputs": [k.instance]},
    ("autognothi", "text"): lambda k: {"inputs": [k.instance]},
    ("sufficient-subset", "tabular"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"order": "leave-one-out"},
    },
    ("sufficient-subset", "image"): lambda k: {
        "inputs": [k.instance],
        "parameters": {"patch_size": 4},
    },
    ("sufficient-subset", "text"): lambda k: {"inputs": [k.instance]},
    ("attribot", "lm"): lambda k: {
        "context": CONTEXT,
        "query": LM_QUERY,
        "response": " Zorblat.",
        "parameters": {"granularity": "paragraph"},
    },
}


def builtin_kinds() -> dict[str, Kind]:
    """A Kind (valid instance, corpus, background rows) per built-in model."""

    def tabular(label: str, name: str) -> Kind:
        data = dataset_split(name)
        return Kind(label, data.x_test[0].tolist(), background=data.x_train[:3].tolist())

    digits = dataset_split("digits-cnn")
    image = digits.x_test[0].tolist()
    return {
        "diabetes-mlp": tabular("built-in torch regressor", "diabetes-mlp"),
        "breast-cancer-mlp": tabular("built-in torch classifier", "breast-cancer-mlp"),
        "digits-cnn": Kind(
            "built-in torch image classifier", image, background=digits.x_train[:3].tolist()
        ),
        "digits-sst": Kind(
            "built-in SST image classifier", image, background=digits.x_train[:3].tolist()
        ),
        "digits-sst-twin": Kind(
            "built-in SST image classifier (independent selector)",
            image,
            background=digits.x_train[:3].tolist(),
        ),
        "sentiment-minilm": Kind("built-in text classifier", TEXTS[0]),
        "bm25": Kind("built-in ranker (BM25)", DOCS[0]),
        "minilm-ranker": Kind("built-in ranker (MiniLM)", DOCS[0]),
        "minilm-encoder": Kind("built-in text encoder", TEXTS[0], TEXTS, FOIL_TEXTS),
        "digits-encoder": Kind(
            "built-in image encoder",
            image,
            digits.x_train[digits.y_train == 7][:8].tolist(),
            digits.x_train[digits.y_train != 7][:16].tolist(),
        ),
        "smollm2-135m": Kind("built-in language model", CONTEXT),
        "gemma3-270m": Kind("built-in language model", CONTEXT),
    }


def body(explainer: str, modality: str, kind: Kind) -> dict[str, Any]:
    """BODIES' request of `explainer` for a model of `modality`, on `kind`'s instance."""
    return BODIES[(explainer, modality)](kind)
