"""AutoGnothi vs KernelSHAP on sentiment-minilm: word Shapley values against exact ones.

Ground truth: exact Shapley values (all 2^n coalitions, `shapley` with estimator "exact": the
service's text game, words deleted) of the predicted class's probability, on held-out sentences
of at most 10 words: generated ones (VADER lexicon, sentiment words no training sentence has)
and the handmade sanity set of models/text.py (CHECK_SET, out of the training distribution).
AutoGnothi (a side network trained here with the given options) answers in one encoder pass;
KernelSHAP (`shapley` with estimator "kernel", paired sampling) at several budgets. Errors:
Pearson over every word of every sentence (pooled), the mean per-sentence Pearson, and the RMSE;
time per sentence, one sentence per call, one torch thread. Equal time: the KernelSHAP budget
whose time is closest to AutoGnothi's; equal error: the smallest budget whose pooled Pearson
reaches AutoGnothi's. Training cost: seconds and model rows, and the break-even count of
explanations against KernelSHAP at equal error.

    .venv/bin/python -m bench.autognothi_bench [--held-out 40] [--budgets 16,32,64,128,256] \
        [--options '{"sentences": 400}']
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explainers import autognothi, autognothi_corpus, autognothi_net, autognothi_train
from explainers.estimators import kernel
from explainers.games.text import word_spans
from explainers.shapley import ShapleyOptions
from explainers.shapley import explain as shapley_explain
from models.base import TextModel, weights_hash
from models.text import CHECK_SET, load_sentiment_minilm


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return autognothi_train.pearson(a, b)


def errors(ours: list[np.ndarray], truth: list[np.ndarray]) -> dict[str, float]:
    a, b = np.concatenate(ours), np.concatenate(truth)
    per = [pearson(x, y) for x, y in zip(ours, truth, strict=True) if len(x) > 1]
    return {
        "pearson": pearson(a, b),
        "pearson_per_sentence": float(np.mean(per)),
        "rmse": float(np.sqrt(np.mean((a - b) ** 2))),
    }


def shapley(
    model: TextModel, text: str, estimator: str, budget: int, seed: int = 0
) -> tuple[np.ndarray, int, float]:
    """`shapley`'s values of the predicted class, the class, and the seconds of one call."""
    start = time.perf_counter()
    out = shapley_explain(
        model,
        np.array([text], dtype=object),
        options=ShapleyOptions(estimator=estimator),  # type: ignore[arg-type]
        budget=budget,
        seed=seed,
    )
    seconds = time.perf_counter() - start
    e = out.explanations[0]
    return np.asarray(e.values, dtype=np.float64), e.output_index, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held-out", type=int, default=40, help="generated held-out sentences")
    parser.add_argument(
        "--budgets", default="24,32,64,128,256", help="raised to the kernel's least, 2n"
    )
    parser.add_argument("--options", default="{}", help="AutoGnothiTrainOptions as JSON")
    parser.add_argument("--seed", type=int, default=1, help="seed of the held-out sentences")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_sentiment_minilm(Path("/tmp"))
    before = weights_hash(model.torch_module())

    opts = autognothi_train.AutoGnothiTrainOptions(**json.loads(args.options))
    trained = autognothi_train.train(model, opts)
    assert trained is not None
    assert weights_hash(model.torch_module()) == before
    m = trained.metrics
    print(f"training: {m['train_sentences']} sentences x {m['coalitions_per_sentence']} "
          f"coalitions = {m['model_rows']} model rows, {m['train_seconds']:.1f} s "
          f"(1 thread); corpus {m['corpus']}; weights {before} unchanged")  # fmt: skip

    vocabulary = frozenset(autognothi_net.runner(model).tokenizer.get_vocab())
    sets = {
        "generated": autognothi_corpus.sentences(args.held_out, args.seed, True, 10, vocabulary),
        "check-set": [t for t, _ in CHECK_SET if len(word_spans(t)) <= 10],
    }
    budgets = [int(b) for b in args.budgets.split(",")]
    report: dict[str, Any] = {"training": m, "options": opts.model_dump(), "sets": {}}
    for name, texts in sets.items():
        exact, classes, exact_s = [], [], []
        for text in texts:
            n = len(word_spans(text))
            values, c, seconds = shapley(model, text, "exact", 2**n)
            exact.append(values)
            classes.append(c)
            exact_s.append(seconds)
        # AutoGnothi, one sentence per call (a first call warms up).
        autognothi.amortized(model, trained, texts[:1])
        ours, ours_s = [], []
        for text, c in zip(texts, classes, strict=True):
            start = time.perf_counter()
            out = autognothi.amortized(model, trained, [text])
            ours_s.append(time.perf_counter() - start)
            assert int(np.argmax(out.full[0])) == c
            ours.append(out.values[0][:, c])
        start = time.perf_counter()
        autognothi.amortized(model, trained, texts)
        batch_ms = (time.perf_counter() - start) * 1000 / len(texts)
        rows: dict[str, Any] = {
            "exact": {"ms": 1000 * float(np.median(exact_s)), "evals": "2^n"},
            "autognothi": {
                **errors(ours, exact),
                "ms": 1000 * float(np.median(ours_s)),
                "ms_batched": batch_ms,
            },
        }
        for budget in budgets:
            estimates, times = [], []
            for i, text in enumerate(texts):
                least = kernel.min_coalitions(len(word_spans(text)))  # 2n
                v, _, s = shapley(model, text, "kernel", max(budget, least), seed=i)
                estimates.append(v)
                times.append(s)
            rows[f"kernel-{budget}"] = {**errors(estimates, exact),
                                        "ms": 1000 * float(np.median(times))}  # fmt: skip
        report["sets"][name] = {"sentences": len(texts), "words": sum(map(len, exact)), **rows}
        print(f"\n{name}: {len(texts)} sentences, {sum(map(len, exact))} words")
        print(f"{'method':<14}{'pearson':>9}{'per-sent':>10}{'rmse':>9}{'ms/sentence':>13}")
        for key, row in rows.items():
            if key == "exact":
                print(f"{key:<14}{'1':>9}{'1':>10}{'0':>9}{row['ms']:>13.1f}")
                continue
            print(f"{key:<14}{row['pearson']:>9.3f}{row['pearson_per_sentence']:>10.3f}"
                  f"{row['rmse']:>9.4f}{row['ms']:>13.1f}")  # fmt: skip
        ag = rows["autognothi"]
        kernels = {b: rows[f"kernel-{b}"] for b in budgets}
        same_time = min(budgets, key=lambda b: abs(kernels[b]["ms"] - ag["ms"]))
        reach = [b for b in budgets if kernels[b]["pearson"] >= ag["pearson"]]
        print(f"autognothi batched: {ag['ms_batched']:.1f} ms/sentence")
        print(f"equal time: kernel-{same_time} ({kernels[same_time]['ms']:.0f} ms vs "
              f"{ag['ms']:.0f} ms) has pearson {kernels[same_time]['pearson']:.3f} vs "
              f"{ag['pearson']:.3f}")  # fmt: skip
        if reach:
            b = reach[0]
            extra = kernels[b]["ms"] - ag["ms"]
            breakeven = m["train_seconds"] * 1000 / extra if extra > 0 else float("inf")
            print(f"equal error: kernel-{b} reaches pearson {kernels[b]['pearson']:.3f} in "
                  f"{kernels[b]['ms']:.0f} ms ({kernels[b]['ms'] / ag['ms']:.0f}x AutoGnothi); "
                  f"training pays off after {breakeven:.0f} explanations")  # fmt: skip
        else:
            print(f"equal error: no budget up to {budgets[-1]} reaches AutoGnothi's pearson")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
