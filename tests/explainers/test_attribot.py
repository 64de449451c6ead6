"""AttriBoT on the built-in LMs: planted facts, exactness of the tricks, ground-truth LOO."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from explainers.attribot import DEFAULT_TEMPLATE, AttriBoTOptions, attribute
from explainers.explanation import Explanation, OptionError
from explainers.games.sentences import build_tree, split_sentences
from models.builtin.lm import LanguageModel, shared_language_model

pytestmark = pytest.mark.slow

# Small LMs answer world knowledge from memory: the fact is made up and planted in paragraph 1.
CONTEXT = [
    "The weather in Lisbon was mild that week. Many tourists visited the old town.",
    "Zorblat is the capital of the island nation of Quenmoria. It has a famous harbour.",
    "Bread is baked from flour and water. Some bakers add seeds.",
]
QUERY = "What is the capital of Quenmoria?"
RESPONSE = " Zorblat."
FACT = 2  # sentence index of the planted fact
N_SENTENCES = 6


@pytest.fixture(scope="module")
def gemma(model_dir: Path) -> LanguageModel:
    return shared_language_model("gemma3-270m", model_dir)


@pytest.fixture(scope="module")
def smollm(model_dir: Path) -> LanguageModel:
    return shared_language_model("smollm2-135m", model_dir)


@pytest.fixture(scope="module")
def runs(gemma: LanguageModel, smollm: LanguageModel) -> dict[str, Explanation]:
    """Every method once on the same instance (the LMs are slow on a shared CPU)."""
    models = {"smollm2-135m": smollm, "gemma3-270m": gemma}
    configs: dict[str, dict[str, Any]] = {
        "loo": {"method": "loo"},
        "kv": {"kv_cache": True},
        "hier_all": {"hierarchical": True, "keep_paragraphs": 3},
        "hier_1": {"hierarchical": True, "keep_paragraphs": 1},
        "proxy": {"proxy_model": "smollm2-135m"},
        "prune_2": {"prune": True, "keep_sentences": 2},
        "contextcite": {"method": "contextcite", "n_ablations": 24},
        "paragraph": {"granularity": "paragraph", "method": "loo"},
    }
    out = {}
    for key, cfg in configs.items():
        out[key], _ = attribute(
            gemma, CONTEXT, QUERY, RESPONSE, AttriBoTOptions(**cfg), resolve=models.__getitem__
        )
    return out


def _ll(lm: LanguageModel, context: str, response: str) -> float:
    """Ground truth: the response log-likelihood from one plain transformers forward pass."""
    prompt = DEFAULT_TEMPLATE.replace("{context}", context).replace("{query}", QUERY)
    p, r = lm.encode(prompt, bos=True), lm.encode(response, bos=False)
    with torch.inference_mode():
        logits = lm.hf(torch.tensor([p + r])).logits[0, len(p) - 1 : -1].double()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None]).sum())


def test_sentence_splitter_offsets_and_abbreviations() -> None:
    text = 'Dr. Smith met J. Doe at 5 p.m. in the U.S. office. "Fine," he said! Was it? Yes.'
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == [
        "Dr. Smith met J. Doe at 5 p.m. in the U.S. office.",
        '"Fine," he said!',
        "Was it?",
        "Yes.",
    ]
    tree = build_tree("First one. Second one.\n\n  \nThird paragraph here.")
    assert tree.text == "First one. Second one.\n\nThird paragraph here."
    assert all(tree.text[s.start : s.end] == s.text for s in (*tree.sentences, *tree.paragraphs))
    assert tree.paragraph_of == (0, 0, 1)
    assert tree.without({1}) == "First one.\n\nThird paragraph here."
    assert tree.without({2}) == "First one. Second one."
    with pytest.raises(OptionError):
        build_tree(["", "  "])


def test_planted_fact_gets_the_top_score_for_every_method(runs: dict[str, Explanation]) -> None:
    for key, e in runs.items():
        top = int(np.argmax(e.values))
        want = 1 if key == "paragraph" else FACT
        assert top == want, (key, e.values)
        assert e.details is not None and e.details["spans"][top]["text"].startswith("Zorblat")


def test_loo_equals_plain_transformers_forward(
    gemma: LanguageModel, runs: dict[str, Explanation]
) -> None:
    e = runs["loo"]
    tree = build_tree(CONTEXT)
    full = _ll(gemma, tree.text, RESPONSE)
    assert e.instance_output_value == pytest.approx(full, abs=1e-3)
    for j in (FACT,):
        expected = full - _ll(gemma, tree.without({j}), RESPONSE)
        assert e.values[j] == pytest.approx(expected, abs=2e-3)
    assert e.n_model_evals == 1 + N_SENTENCES and e.exact


def test_contextcite_equals_a_lasso_on_plain_forward_passes(
    gemma: LanguageModel, runs: dict[str, Explanation]
) -> None:
    """ContextCite (estimators/surrogate.py on the span game) = sklearn's Lasso on the seed's
    ablations, each scored by one plain transformers forward pass; a repeat costs no pass."""
    from sklearn.linear_model import Lasso

    e = runs["contextcite"]
    tree = build_tree(CONTEXT)
    masks = np.random.default_rng(0).random((24, N_SENTENCES)) < 0.5  # seed 0, 24 ablations
    memo: dict[tuple[bool, ...], float] = {}
    for row in masks:
        removed = {j for j in range(N_SENTENCES) if not row[j]}
        memo.setdefault(tuple(row), _ll(gemma, tree.without(removed), RESPONSE))
    y = np.array([memo[tuple(row)] for row in masks])
    n_response = len(gemma.encode(RESPONSE, bos=False))
    x = masks.astype(np.float64)
    mean, std = x.mean(axis=0), np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    fit = Lasso(alpha=0.01).fit((x - mean) / std, y / n_response)
    np.testing.assert_allclose(e.values, fit.coef_ / std * n_response, atol=5e-3)
    assert e.instance_output_value == pytest.approx(_ll(gemma, tree.text, RESPONSE), abs=1e-3)
    assert e.n_model_evals == 1 + len({tuple(row) for row in masks if not row.all()})


def test_kv_cache_equals_no_cache_and_computes_fewer_tokens(runs: dict[str, Explanation]) -> None:
    loo, kv = runs["loo"], runs["kv"]
    np.testing.assert_allclose(kv.values, loo.values, atol=2e-3)
    assert kv.n_model_evals == loo.n_model_evals
    assert loo.details and kv.details
    computed = kv.details["tokens_computed"]["gemma3-270m"]
    assert computed < 0.9 * loo.details["tokens_computed"]["gemma3-270m"]


def test_hierarchical_with_every_paragraph_kept_equals_sentence_loo(
    runs: dict[str, Explanation],
) -> None:
    np.testing.assert_allclose(runs["hier_all"].values, runs["loo"].values, atol=2e-3)
    hier = runs["hier_1"]
    assert hier.details and hier.details["kept_paragraphs"] == [1]
    scored = [s["scored"] for s in hier.details["spans"]]
    assert scored == [False, False, True, True, False, False]
    assert np.all(hier.values[[0, 1, 4, 5]] == 0)
    assert hier.n_model_evals == (1 + 3) + (1 + 2)


def test_proxy_scores_with_the_proxy_only(runs: dict[str, Explanation]) -> None:
    proxy = runs["proxy"]
    assert proxy.details and proxy.details["forward_passes"] == {"smollm2-135m": 1 + N_SENTENCES}
    assert not proxy.exact and proxy.details["spans"][FACT]["scored_by"].startswith("proxy")


def test_proxy_equal_to_target_gives_target_loo(gemma: LanguageModel) -> None:
    # A short context keeps this cheap: one paragraph of two sentences.
    ctx = [CONTEXT[1]]
    same, _ = attribute(gemma, ctx, QUERY, RESPONSE, AttriBoTOptions(proxy_model="gemma3-270m"))
    loo, _ = attribute(gemma, ctx, QUERY, RESPONSE, AttriBoTOptions(method="loo"))
    np.testing.assert_allclose(same.values, loo.values, atol=2e-3)


def test_pruning_rescores_the_kept_sentences_with_the_target(runs: dict[str, Explanation]) -> None:
    pruned = runs["prune_2"]
    assert pruned.details is not None
    assert pruned.details["forward_passes"] == {"smollm2-135m": 1 + N_SENTENCES, "gemma3-270m": 3}
    assert sum(s["scored"] for s in pruned.details["spans"]) == 2
    kept = [k for k, s in enumerate(pruned.details["spans"]) if s["scored"]]
    assert FACT in kept and pruned.details["reference_context"] == "pruned"


def test_empty_span_scores_zero_without_a_forward_pass(gemma: LanguageModel) -> None:
    ctx = [CONTEXT[1], "", CONTEXT[2]]
    e, _ = attribute(gemma, ctx, QUERY, RESPONSE, AttriBoTOptions(granularity="paragraph"))
    assert e.values[1] == 0.0 and e.values[0] > 1
    assert e.players is not None and e.players[1].start == e.players[1].end
    assert e.n_model_evals == 1 + 2


def test_generated_response_is_returned(gemma: LanguageModel) -> None:
    e, params = attribute(
        gemma, [CONTEXT[1]], QUERY, None, AttriBoTOptions(granularity="paragraph", max_new_tokens=4)
    )
    assert e.details is not None and e.details["response_generated"]
    assert e.details["response"].strip() and "\n" not in e.details["response"]
    assert params["max_new_tokens"] == 4


@pytest.mark.parametrize(
    "options",
    [
        {"prompt_template": "no placeholders"},
        {"prompt_template": "{context} {context} {query}"},
        {"prune": True, "proxy_model": "smollm2-135m"},
        {"method": "loo", "hierarchical": True},
        {"granularity": "paragraph", "prune": True},
    ],
)
def test_bad_options_are_refused(gemma: LanguageModel, options: dict[str, Any]) -> None:
    with pytest.raises(OptionError):
        attribute(gemma, CONTEXT, QUERY, RESPONSE, AttriBoTOptions(**options))
