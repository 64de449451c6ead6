"""RankSHAP: the Rank-Shapley axioms, exact values against an independent enumeration, NDCG and
Fidelity on hand-checked cases, and clean errors."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

from explainers import rankshap
from explainers.explanation import OptionError
from explainers.games import BudgetError
from explainers.rankshap import RankShapOptions, fidelity, ndcg
from explainers.trust.caveats import with_caveats
from models.base import RankerModel
from models.builtin.rankers import bm25_scores, load_bm25, load_minilm_ranker

DOCS = [
    "solar panels convert sunlight into electricity for the home",
    "the wind turbine spins and makes electricity",
    "a recipe for bread with flour and water",
    "solar power and wind power are renewable energy sources",
]
QUERY = "solar electricity"


@pytest.fixture(scope="module")
def bm25() -> RankerModel:
    return load_bm25(Path("."))


def _explain(
    model: RankerModel, query: str, docs: list[str], **opts: object
) -> rankshap.Explanation:
    res = rankshap.explain(
        model,
        np.empty(0),
        options=RankShapOptions(**opts),
        query=query,
        documents=docs,  # type: ignore[arg-type]
    )
    return res.explanations[0]


def _dcg_expected(scores: np.ndarray, gains: np.ndarray, k: int) -> float:
    """Mean DCG@k over every ordering that sorts the scores in descending order (ties: any)."""
    total, count = 0.0, 0
    for perm in itertools.permutations(range(len(scores))):
        if all(scores[perm[i]] >= scores[perm[i + 1]] for i in range(len(perm) - 1)):
            total += sum(gains[d] / math.log2(p + 2) for p, d in enumerate(perm[:k]))
            count += 1
    return total / count


def test_exact_values_match_an_independent_enumeration(bm25: RankerModel) -> None:
    k = 3
    e = _explain(bm25, QUERY, DOCS, max_players=5, k=k, estimator="exact")
    assert e.details is not None
    players = e.details["terms"]
    assert players[:2] == ["solar", "electricity"]  # query terms found in documents come first
    full = bm25_scores([QUERY], [DOCS])[0]
    rank = np.argsort(-full, kind="stable")
    rel = np.empty(len(DOCS))
    rel[rank] = np.arange(len(DOCS), 0, -1)
    gains = 2.0**rel - 1
    ideal = sum(gains[d] / math.log2(p + 2) for p, d in enumerate(rank[:k]))

    def v(present: frozenset[str]) -> float:
        docs = list(DOCS)
        for term in set(players) - present:
            docs = [re.sub(rf"(?i)\b{term}\b", "", d) for d in docs]
        return _dcg_expected(bm25_scores([QUERY], [docs])[0], gains, k) / ideal

    n = len(players)
    expected = np.zeros(n)
    for i, p in enumerate(players):
        others = [q for q in players if q != p]
        for size in range(n):
            for s in itertools.combinations(others, size):
                w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
                expected[i] += w * (v(frozenset(s) | {p}) - v(frozenset(s)))

    np.testing.assert_allclose(e.values, expected, atol=1e-9)
    assert np.abs(expected).max() > 0.01
    assert e.exact and e.n_model_evals == 2**n * len(DOCS)


@pytest.mark.parametrize("estimator", ["exact", "kernel", "permutation", "gp", "regression"])
def test_values_sum_to_v_all_minus_v_empty(bm25: RankerModel, estimator: str) -> None:
    e = _explain(bm25, QUERY, DOCS, max_players=8, estimator=estimator)
    assert e.details is not None
    assert e.instance_output_value == pytest.approx(1.0)  # no ties in the original ranking
    assert e.values.sum() == pytest.approx(e.details["v_all"] - e.details["v_empty"], abs=1e-9)
    assert e.base_value == e.details["v_empty"]


def test_range_is_reported_and_a_flat_game_warned(bm25: RankerModel) -> None:
    e = _explain(bm25, QUERY, DOCS, max_players=8, estimator="exact")
    assert e.details is not None
    assert e.details["v_range"] == pytest.approx(e.details["v_all"] - e.details["v_empty"])
    assert e.details["v_range"] > 0.05 and e.warnings == ()
    assert e.details["fidelity"] is not None and "fidelity_note" not in e.details
    # bm25 drops English stop words: a query of stop words gives a flat game
    flat = _explain(bm25, "the and", DOCS, players="query", estimator="exact")
    assert flat.details is not None and flat.details["v_range"] == 0.0
    assert [w.code for w in flat.warnings] == ["flat_game"]
    assert flat.details["fidelity"] is None and flat.details["weighted_fidelity"] is None
    assert "undefined" in flat.details["fidelity_note"]
    # The generic check (every explainer) finds the same caveat: one warning, not two.
    res = rankshap.explain(
        bm25,
        np.empty(0),
        options=RankShapOptions(players="query", estimator="exact"),
        query="the and",
        documents=DOCS,
    )
    checked = with_caveats(bm25, np.empty(0), res).explanations[0]
    assert [w.code for w in checked.warnings] == ["flat_game"]


def test_fidelity_is_undefined_below_the_tolerance(bm25: RankerModel) -> None:
    e = _explain(bm25, QUERY, DOCS, max_players=8, estimator="exact")
    assert e.details is not None
    r = e.details["v_range"]
    below = _explain(
        bm25, QUERY, DOCS, max_players=8, estimator="exact", fidelity_min_range=r + 1e-6
    )
    above = _explain(
        bm25, QUERY, DOCS, max_players=8, estimator="exact", fidelity_min_range=r - 1e-6
    )
    assert below.details is not None and above.details is not None
    assert below.details["fidelity"] is None and below.warnings == ()  # small, not flat
    assert above.details["fidelity"] == e.details["fidelity"]
    np.testing.assert_array_equal(below.values, above.values)


def test_term_in_no_document_gets_zero(bm25: RankerModel) -> None:
    # players = query terms: BM25 gives a term no document holds no weight
    e = _explain(bm25, "solar zeppelin electricity", DOCS, players="query", estimator="exact")
    assert e.details is not None and e.details["terms"] == ["solar", "zeppelin", "electricity"]
    assert e.values[1] == 0.0 and abs(e.values[0]) > 1e-3


@pytest.mark.parametrize("name", ["bm25", "minilm-ranker"])
def test_term_in_no_document_gets_zero_for_any_ranker(
    bm25: RankerModel, one_torch_thread: None, name: str
) -> None:
    # players = document terms: removing a term from documents that lack it changes nothing
    model = bm25 if name == "bm25" else load_minilm_ranker(Path("."))
    docs = ["solar cells", "wind farms", "solar wind"]
    e = _explain(model, "solar zeppelin", docs, max_players=64, estimator="exact")
    assert e.details is not None
    assert e.details["terms"] == ["solar", "wind", "cells", "farms", "zeppelin"]
    assert e.values[4] == 0.0 and abs(e.values[0]) > 1e-3


def test_terms_that_occur_identically_get_equal_values(bm25: RankerModel) -> None:
    docs = [
        "alpha beta report on rivers",
        "rivers and lakes",
        "alpha beta alpha beta lakes",
        "mountains report",
    ]
    e = _explain(bm25, "alpha beta rivers", docs, max_players=6, estimator="exact")
    assert e.details is not None
    values = dict(zip(e.details["terms"], e.values, strict=True))
    assert values["alpha"] == pytest.approx(values["beta"], abs=1e-12)
    assert abs(values["alpha"]) > 1e-3


def test_term_the_ranker_ignores_gets_zero(bm25: RankerModel) -> None:
    # bm25 drops English stop words: "the" never changes a score
    e = _explain(bm25, "the electricity", DOCS, max_players=6, estimator="exact")
    assert e.details is not None
    assert "the" in e.details["terms"]
    assert e.values[e.details["terms"].index("the")] == 0.0


def test_ndcg_hand_checked() -> None:
    gains = np.array([3.0, 2.0, 1.0])  # linear gains of a 3-document original ranking 0, 1, 2
    ideal = 3 + 2 / math.log2(3) + 1 / 2
    assert ndcg(np.array([0.9, 0.5, 0.1]), gains, 3, ideal) == pytest.approx(1.0)
    swapped = (2 + 3 / math.log2(3) + 1 / 2) / ideal
    assert ndcg(np.array([0.5, 0.9, 0.1]), gains, 3, ideal) == pytest.approx(swapped)
    tied = ((3 + 2) * (1 + 1 / math.log2(3)) / 2 + 1 / 2) / ideal
    assert ndcg(np.array([0.7, 0.7, 0.1]), gains, 3, ideal) == pytest.approx(tied)
    at1 = ndcg(np.array([0.5, 0.9, 0.1]), gains, 1, 3.0)
    assert at1 == pytest.approx(2 / 3)


def test_fidelity_hand_checked() -> None:
    scores = np.array([3.0, 2.0, 1.0, 0.0])
    counts = np.eye(4)  # document d holds term d once
    best = fidelity(np.array([4.0, 3.0, 2.0, 1.0]), counts, scores)
    assert best["fidelity"] == pytest.approx(1.0)
    assert best["weighted_fidelity"] == pytest.approx(1.0)
    worst = fidelity(np.array([1.0, 2.0, 3.0, 4.0]), counts, scores)
    assert worst["fidelity"] == pytest.approx(-1.0)
    # one swap at the top costs more weighted fidelity than one swap at the bottom
    top = fidelity(np.array([3.0, 4.0, 2.0, 1.0]), counts, scores)
    bottom = fidelity(np.array([4.0, 3.0, 1.0, 2.0]), counts, scores)
    assert top["fidelity"] == pytest.approx(bottom["fidelity"]) == pytest.approx(4 / 6)
    assert top["weighted_fidelity"] < bottom["weighted_fidelity"]
    assert fidelity(np.zeros(4), counts, scores) == {"fidelity": None, "weighted_fidelity": None}
    # Values equal up to rounding (exact vs sampled estimates of terms that occur alike) tie.
    tied = np.array([4.0, 2.0, 2.0, 1.0])
    jitter = tied + np.array([0.0, -4e-16, 4e-16, 0.0])
    assert fidelity(jitter, counts, scores) == fidelity(tied, counts, scores)
    assert (
        fidelity(tied, counts, scores)["fidelity"]
        != fidelity(np.array([4.0, 2.0, 1.9, 1.0]), counts, scores)["fidelity"]
    )


def test_budget_is_counted_in_document_scorings(bm25: RankerModel) -> None:
    res = rankshap.explain(
        bm25,
        np.empty(0),
        options=RankShapOptions(max_players=12, estimator="kernel"),
        query=QUERY,
        documents=DOCS,
        budget=400,
    )
    e = res.explanations[0]
    assert res.budget == 400 and e.n_model_evals <= 400 and e.n_model_evals % len(DOCS) == 0
    assert not e.exact and len(res.player_names) == 12


def test_errors(bm25: RankerModel) -> None:
    with pytest.raises(OptionError, match="target"):
        rankshap.explain(
            bm25, np.empty(0), options=RankShapOptions(), query=QUERY, documents=DOCS, target=0
        )
    with pytest.raises(OptionError, match="mask token"):
        _explain(bm25, QUERY, DOCS, absence="mask")
    with pytest.raises(OptionError, match="no terms"):
        _explain(bm25, "? !", DOCS, players="query")
    with pytest.raises(OptionError, match="empty"):
        _explain(bm25, QUERY, [*DOCS, "   "])
    with pytest.raises(BudgetError, match="at least 1024 coalitions"):
        rankshap.explain(
            bm25,
            np.empty(0),
            options=RankShapOptions(estimator="exact", max_players=10),
            query=QUERY,
            documents=DOCS,
            budget=100,
        )
