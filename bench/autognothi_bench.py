"""AutoGnothi vs KernelSHAP on sentiment-minilm: word Shapley values against exact ones, on
sentences and templates never used in design, and the out-of-range warning on long reviews.

AutoGnothi: Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in Black-Box
Transformers" (ICLR 2025). Side networks are trained here, one per configuration of `--configs`
(default: "fixed", the earlier design, 24 kernel pairs per sentence drawn once; "resampled", the
default: 2 pairs per sentence drawn afresh every epoch), same seed, same sentences.

Sets (explainers/amortized/autognothi/corpus.py):
- `check` (held out, never used in design): CHECK_TEMPLATES over CHECK_SUBJECTS with the
  lexicon's held-out words, at most 10 words; ground truth exact Shapley values (all 2^n
  coalitions, `shapley` estimator "exact": the service's text game, words deleted) of the
  predicted class's probability.
- `reviews` (held out, beyond the training length): check sentences joined into reviews of
  30-34 words; reference: `shapley` estimator "kernel" at `--reference-budget` coalitions
  (paired sampling), whose own error is its error_std and, on `--reference-twice` reviews, the
  RMSE between two seeds.
- `validation` and `design-check`: the sets the training templates and defaults were designed
  on (generated sentences of the training templates with held-out words; models/builtin/text.py
  CHECK_SET), so not independent checks: reported apart.

Errors: Pearson over every word of every sentence (pooled), the mean per-sentence Pearson, RMSE
and the reference values' RMS; the share of explanations warned `outside_training_range` and
the RMSE of warned and unwarned ones; time per sentence, one sentence per call, one torch
thread. KernelSHAP (`shapley` estimator "kernel") at `--budgets`, raised to its least, 2n.

    .venv/bin/python -m bench.autognothi_bench [--check 40] [--reviews 12] \
        [--budgets 24,64] [--out /tmp/autognothi.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explainers.amortized.autognothi import corpus as autognothi_corpus
from explainers.amortized.autognothi import explainer as autognothi
from explainers.amortized.autognothi import net as autognothi_net
from explainers.amortized.autognothi import train as autognothi_train
from explainers.estimators import kernel
from explainers.games.text import word_spans
from explainers.shapley.explainer import ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from models.base import TextModel, weights_hash
from models.builtin.text import CHECK_SET, load_sentiment_minilm

CONFIGS = {"fixed": {"pairs": 24, "resample": False}, "resampled": {}}


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return autognothi_train.pearson(a, b)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def errors(ours: list[np.ndarray], truth: list[np.ndarray]) -> dict[str, float]:
    a, b = np.concatenate(ours), np.concatenate(truth)
    per = [pearson(x, y) for x, y in zip(ours, truth, strict=True) if len(x) > 1]
    return {
        "pearson": pearson(a, b),
        "pearson_per_sentence": float(np.mean(per)),
        "rmse": rmse(a, b),
        "rms_truth": float(np.sqrt(np.mean(b**2))),
    }


def shapley(
    model: TextModel, text: str, estimator: str, budget: int, seed: int = 0
) -> tuple[np.ndarray, int, float, np.ndarray | None]:
    """`shapley`'s values of the predicted class, the class, the seconds of one call, and the
    estimator's error_std."""
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
    return np.asarray(e.values, dtype=np.float64), e.output_index, seconds, e.error_std


def autognothi_rows(
    model: TextModel, trained: autognothi_train.Trained, texts: list[str], classes: list[int],
    truth: list[np.ndarray],
) -> dict[str, Any]:  # fmt: skip
    """AutoGnothi's errors, times and warnings on one set (one sentence per call)."""
    autognothi.amortized(model, trained, texts[:1])  # warm-up
    ours, times, warned = [], [], []
    for text, c in zip(texts, classes, strict=True):
        start = time.perf_counter()
        out = autognothi.amortized(model, trained, [text])
        times.append(time.perf_counter() - start)
        assert int(np.argmax(out.full[0])) == c
        ours.append(out.values[0][:, c])
        words = [p.text for p in word_spans(text)]
        warned.append(bool(autognothi.range_warnings(trained, words, out.tokens[0])))
    start = time.perf_counter()
    autognothi.amortized(model, trained, texts)
    row: dict[str, Any] = {
        **errors(ours, truth),
        "ms": 1000 * float(np.median(times)),
        "ms_batched": (time.perf_counter() - start) * 1000 / len(texts),
        "warned": float(np.mean(warned)),
    }
    for name, keep in (("warned", True), ("unwarned", False)):
        idx = [i for i, w in enumerate(warned) if w == keep]
        if idx:
            row[f"rmse_{name}"] = rmse(
                np.concatenate([ours[i] for i in idx]), np.concatenate([truth[i] for i in idx])
            )
    return row


def kernel_rows(
    model: TextModel, texts: list[str], truth: list[np.ndarray], budgets: list[int]
) -> dict[str, Any]:
    rows = {}
    for budget in budgets:
        estimates, times = [], []
        for i, text in enumerate(texts):
            least = kernel.min_coalitions(len(word_spans(text)))  # 2n
            v, _, s, _ = shapley(model, text, "kernel", max(budget, least), seed=i)
            estimates.append(v)
            times.append(s)
        rows[f"kernel-{budget}"] = {**errors(estimates, truth),
                                    "ms": 1000 * float(np.median(times))}  # fmt: skip
    return rows


def print_set(name: str, info: dict[str, Any]) -> None:
    print(f"\n{name}: {info['sentences']} sentences, {info['words']} words "
          f"({info['mean_words']:.1f} per sentence); truth: {info['truth']}")  # fmt: skip
    print(f"{'method':<22}{'pearson':>9}{'per-sent':>10}{'rmse':>9}{'rms':>8}{'warned':>8}"
          f"{'rmse w/u':>16}{'ms':>9}")  # fmt: skip
    for key, row in info["rows"].items():
        wu = ""
        if "warned" in row:
            wu = "/".join(f"{row[k]:.4f}" if k in row else "-"
                          for k in ("rmse_warned", "rmse_unwarned"))  # fmt: skip
        warned = f"{row['warned']:.2f}" if "warned" in row else ""
        print(f"{key:<22}{row['pearson']:>9.3f}{row['pearson_per_sentence']:>10.3f}"
              f"{row['rmse']:>9.4f}{row['rms_truth']:>8.4f}{warned:>8}{wu:>16}"
              f"{row['ms']:>9.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", type=int, default=40, help="check sentences (new templates)")
    parser.add_argument("--reviews", type=int, default=12, help="30-word check reviews")
    parser.add_argument("--validation", type=int, default=40, help="design-time sentences")
    parser.add_argument("--budgets", default="24,64", help="KernelSHAP, raised to its least, 2n")
    parser.add_argument("--review-budgets", default="64,256")
    parser.add_argument("--reference-budget", type=int, default=4096)
    parser.add_argument("--reference-twice", type=int, default=3)
    parser.add_argument("--configs", default="fixed,resampled", help=f"of {sorted(CONFIGS)}")
    parser.add_argument("--options", default="{}", help="AutoGnothiTrainOptions for every config")
    parser.add_argument("--seed", type=int, default=0, help="seed of the check sets")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_sentiment_minilm(Path("/tmp"))
    before = weights_hash(model.torch_module())
    report: dict[str, Any] = {"training": {}, "sets": {}}

    trained: dict[str, autognothi_train.Trained] = {}
    for name in args.configs.split(","):
        opts = autognothi_train.AutoGnothiTrainOptions(
            **{**json.loads(args.options), **CONFIGS[name]}
        )
        t = autognothi_train.train(model, opts)
        assert t is not None and weights_hash(model.torch_module()) == before
        trained[name] = t
        m = t.metrics
        report["training"][name] = {"options": opts.model_dump(), **m}
        print(f"training {name}: {m['train_sentences']} sentences x "
              f"{m['coalitions_per_sentence_and_epoch']} coalitions "
              f"({'every epoch' if m['coalitions_resampled'] else 'once'}) = "
              f"{m['coalitions_drawn']} drawn, {m['model_rows']} model rows, "
              f"{m['train_seconds']:.1f} s (1 thread); range {m['training_range']}; "
              f"weights {before} unchanged")  # fmt: skip

    vocabulary = frozenset(autognothi_net.runner(model).tokenizer.get_vocab())
    short = {
        "check (new templates, held out)": autognothi_corpus.check_sentences(
            args.check, args.seed, 10, vocabulary
        ),
        "validation (design)": autognothi_corpus.sentences(
            args.validation, 1, True, 10, vocabulary
        ),
        "design-check (CHECK_SET)": [t for t, _ in CHECK_SET if len(word_spans(t)) <= 10],
    }
    budgets = [int(b) for b in args.budgets.split(",")]
    for set_name, texts in short.items():
        exact, classes, exact_s = [], [], []
        for text in texts:
            values, c, seconds, _ = shapley(model, text, "exact", 2 ** len(word_spans(text)))
            exact.append(values)
            classes.append(c)
            exact_s.append(seconds)
        rows: dict[str, Any] = {
            f"autognothi {k}": autognothi_rows(model, t, texts, classes, exact)
            for k, t in trained.items()
        }
        rows.update(kernel_rows(model, texts, exact, budgets))
        words = sum(map(len, exact))
        info = {"sentences": len(texts), "words": words, "mean_words": words / len(texts),
                "truth": "exact", "exact_ms": 1000 * float(np.median(exact_s)),
                "rows": rows, "texts": texts}  # fmt: skip
        report["sets"][set_name] = info
        print_set(set_name, info)

    reviews = autognothi_corpus.check_reviews(args.reviews, args.seed, 30, vocabulary)
    reference, classes, ref_std, twice = [], [], [], []
    for i, text in enumerate(reviews):
        values, c, _, std = shapley(model, text, "kernel", args.reference_budget, seed=1000 + i)
        reference.append(values)
        classes.append(c)
        if std is not None:
            ref_std.append(std)
        if i < args.reference_twice:
            again, _, _, _ = shapley(model, text, "kernel", args.reference_budget, seed=2000 + i)
            twice.append(rmse(values, again))
    rows = {
        f"autognothi {k}": autognothi_rows(model, t, reviews, classes, reference)
        for k, t in trained.items()
    }
    review_budgets = [int(b) for b in args.review_budgets.split(",")]
    rows.update(kernel_rows(model, reviews, reference, review_budgets))
    words = sum(map(len, reference))
    ref_err = float(np.sqrt(np.mean(np.concatenate(ref_std) ** 2))) if ref_std else float("nan")
    info = {
        "sentences": len(reviews), "words": words, "mean_words": words / len(reviews),
        "truth": f"kernel-{args.reference_budget} (rms error_std {ref_err:.4f}; two seeds on "
                 f"{len(twice)} reviews differ by rmse {np.mean(twice):.4f})",
        "reference_rms_error_std": ref_err, "reference_two_seed_rmse": twice,
        "rows": rows, "texts": reviews,
    }  # fmt: skip
    report["sets"]["reviews (30-34 words, held out)"] = info
    print_set("reviews (30-34 words, held out)", info)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
