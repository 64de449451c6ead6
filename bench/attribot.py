"""AttriBoT benchmark on gemma3-270m: exact LOO vs each trick and their combinations, and our
exact LOO vs captum's LLMAttribution + FeatureAblation on the same spans.

    .venv/bin/python bench/attribot.py [--out results.json] [--skip-captum]

A made-up context (6 paragraphs, 30 sentences) with two planted facts the query needs; the
response is fixed. Metrics against exact LOO (Liu, Kandpal & Raffel, ICLR 2025): speed-up in
wall-clock, Spearman correlation over all sentences (unscored sentences count as 0), top-3
overlap, and average precision of recovering the LOO outliers (ours: sentences whose LOO
score exceeds mean + 2 std of all LOO scores; the paper's threshold is not published).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

from app.settings import Settings
from explainers.attribot import DEFAULT_TEMPLATE, AttriBoTOptions, attribute
from explainers.games.sentences import build_tree
from models.builtin.lm import LanguageModel, shared_language_model

PARAGRAPHS = [
    "Varnholt is a small fishing town on a rocky coast. Its harbour shelters about forty "
    "boats. The market opens every Saturday morning. Most houses are painted white or blue. "
    "A narrow road links the town to the valley.",
    "The town hall was built from grey stone. Its clock tower chimes every hour. The mayor "
    "meets citizens on Tuesdays. A library occupies the ground floor. The archive keeps old "
    "fishing records.",
    "The lighthouse stands on a cliff north of the harbour. The lighthouse keeper of "
    "Varnholt is Edda Quillon. She climbs its stairs twice a night. The lamp was replaced "
    "last spring. Ships can see it from twenty miles away.",
    "Winters in Varnholt are long and windy. Snow rarely stays for more than a day. Storms "
    "often close the harbour in January. Fishermen repair their nets indoors. The school "
    "holds a lantern festival in December.",
    "Edda Quillon keeps a grey parrot called Pim. Visitors often hear it whistle old songs. "
    "The bakery sells rye bread and honey cakes. A ferry crosses to the island on Sundays. "
    "Tourists come mostly in August.",
    "The river Maul reaches the sea south of the town. Trout are common in its upper "
    "stretch. A wooden bridge crosses it near the mill. The mill grinds barley for the "
    "farms. Herons nest in the reeds by the bank.",
]
QUERY = "Who keeps the lighthouse of Varnholt, and what is her parrot called?"
RESPONSE = " Edda Quillon keeps the lighthouse, and her parrot is called Pim."

CONFIGS: dict[str, dict[str, Any]] = {
    "exact LOO": {"method": "loo"},
    "kv cache": {"kv_cache": True},
    "hierarchical (2 paragraphs) + kv": {"hierarchical": True},
    "proxy smollm2-135m + kv": {"proxy_model": "smollm2-135m"},
    "prune (smollm2, 5 sentences) + kv": {"prune": True},
    "hierarchical + prune (3) + kv": {"hierarchical": True, "prune": True, "keep_sentences": 3},
}
# With --all: each trick without the cache, and the ContextCite peer.
MORE: dict[str, dict[str, Any]] = {
    "hierarchical (2 paragraphs)": {"kv_cache": False, "hierarchical": True},
    "proxy smollm2-135m": {"kv_cache": False, "proxy_model": "smollm2-135m"},
    "prune (smollm2, 5 sentences)": {"kv_cache": False, "prune": True},
    "contextcite (32 ablations) + kv": {"method": "contextcite", "n_ablations": 32},
}


def metrics(values: np.ndarray, loo: np.ndarray) -> dict[str, float]:
    outliers = loo > loo.mean() + 2 * loo.std()
    top = set(np.argsort(-values)[:3].tolist())
    return {
        "spearman": float(spearmanr(values, loo).statistic),
        "top3_overlap": len(top & set(np.argsort(-loo)[:3].tolist())) / 3,
        "ap_outliers": float(average_precision_score(outliers, values)),
        "n_outliers": int(outliers.sum()),
    }


def captum_comparison(lm: LanguageModel) -> dict[str, Any]:
    """Paragraph-level exact LOO: ours vs captum LLMAttribution(FeatureAblation), same texts.

    Each paragraph is one captum feature whose value carries its trailing "\\n\\n", so
    removing one gives exactly our rebuilt context (captum cannot rebuild sentence
    separators, hence paragraphs).
    """
    from captum.attr import FeatureAblation, LLMAttribution, TextTemplateInput

    opts = AttriBoTOptions(method="loo", granularity="paragraph")
    start = time.perf_counter()
    ours, _ = attribute(lm, PARAGRAPHS, QUERY, RESPONSE, opts)
    ours_s = time.perf_counter() - start
    tree = build_tree(PARAGRAPHS)
    suffix = DEFAULT_TEMPLATE.split("{context}\n\n")[1].replace("{query}", QUERY)
    values = [p.text + "\n\n" for p in tree.paragraphs]
    template = "{}" * len(values) + suffix
    assert template.format(*values) == DEFAULT_TEMPLATE.format(context=tree.text, query=QUERY)
    llm_attr = LLMAttribution(FeatureAblation(lm.hf), lm.tokenizer)
    target = torch.tensor(lm.encode(RESPONSE, bos=False))
    start = time.perf_counter()
    with torch.inference_mode():
        result = llm_attr.attribute(
            TextTemplateInput(template, values=values), target=target, forward_in_tokens=False
        )
    captum_s = time.perf_counter() - start
    theirs = result.seq_attr.detach().double().numpy()
    return {
        "spans": len(values),
        "ours": ours.values.tolist(),
        "captum": theirs.tolist(),
        "max_abs_diff": float(np.abs(ours.values - theirs).max()),
        "ours_s": ours_s,
        "captum_s": captum_s,
        "time_ratio_captum_over_ours": captum_s / ours_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-captum", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--all", action="store_true", help="also tricks without the cache")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = Settings().model_dir
    lms = {n: shared_language_model(n, model_dir) for n in ("gemma3-270m", "smollm2-135m")}
    gemma = lms["gemma3-270m"]
    tree = build_tree(PARAGRAPHS)
    print(f"context: {len(tree.paragraphs)} paragraphs, {len(tree.sentences)} sentences, ")
    print(f"{len(gemma.encode(tree.text, bos=True))} tokens; response {RESPONSE!r}")
    rows: dict[str, Any] = {}
    loo: np.ndarray | None = None
    configs = {**CONFIGS, **(MORE if args.all else {})}
    out: dict[str, Any] = {"methods": rows}
    for name, cfg in configs.items():
        start = time.perf_counter()
        e, _ = attribute(
            gemma, PARAGRAPHS, QUERY, RESPONSE, AttriBoTOptions(**cfg), resolve=lms.get
        )
        seconds = time.perf_counter() - start
        assert e.details is not None
        if loo is None:
            loo, loo_s = e.values, seconds
        row = {
            "seconds": seconds,
            "speedup": loo_s / seconds,
            "forward_passes": e.details["forward_passes"],
            "tokens_computed": e.details["tokens_computed"],
            **metrics(e.values, loo),
            "top3": np.argsort(-e.values)[:3].tolist(),
            "values": np.round(e.values, 4).tolist(),
        }
        rows[name] = row
        print(
            f"{name:34s} {seconds:8.1f} s  x{row['speedup']:5.1f}  rho {row['spearman']:5.2f}  "
            f"top3 {row['top3_overlap']:.2f}  AP {row['ap_outliers']:.2f}  "
            f"passes {row['forward_passes']}  tokens {row['tokens_computed']}",
            flush=True,
        )
        if args.out:  # written as it goes: a long run keeps what it measured
            args.out.write_text(json.dumps(out, indent=1))
    assert loo is not None
    out["loo_top3"] = np.argsort(-loo)[:3].tolist()
    out["loo_outliers"] = np.flatnonzero(loo > loo.mean() + 2 * loo.std()).tolist()
    print("LOO outliers:", [tree.sentences[j].text for j in out["loo_outliers"]])
    if not args.skip_captum:
        out["captum"] = captum_comparison(gemma)
        c = out["captum"]
        print(
            f"captum FeatureAblation vs our exact LOO ({c['spans']} paragraphs): max |diff| "
            f"{c['max_abs_diff']:.2e}; ours {c['ours_s']:.1f} s, captum {c['captum_s']:.1f} s "
            f"(captum/ours x{c['time_ratio_captum_over_ours']:.2f})"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
