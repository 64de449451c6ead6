"""RankSHAP: Shapley values of terms for a ranking, with NDCG of the induced ranking as the game.

Chowdhury, Zick & Allan, "RankSHAP: Shapley Value Based Feature Attributions for Learning to
Rank" (ICLR 2025). The paper's code is not released; the choices marked [ours] in the option
descriptions reconstruct it (METHODS.md section 4): players are terms, an absent term is deleted
(or masked) everywhere it occurs, graded relevance comes from the model's own original ranking,
and Fidelity is Kendall's tau between the ranking and the explanation-implied one.
Every answer reports v(all) - v(none), the NDCG the players account for: a `flat_game` warning
by the generic rule on NDCG's own scale (explainers/trust/caveats.py: FLAT_RATIO of 1), and no
Fidelity when it is below `fidelity_min_range`, where the values are near zero and their
ranking is noise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from explainers.estimators.budget import default_budget
from explainers.estimators.library import shapley_values_chosen
from explainers.estimators.registry import (
    Ask,
    EstimatorChoice,
    SamplerName,
    canonical_estimator,
    choose,
)
from explainers.explanation import ExplainResult, Explanation, OptionError
from explainers.games import ExplainerError
from explainers.games.deadlines import check_deadline
from explainers.options import EVERYWHERE, ExplainerOptions, applies
from explainers.trust import caveats
from models.base import Model, RankerModel

VERSION = "2"  # 2: players="query" no longer echoes max_players (it does not apply)
TERM = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's and bm25s's token pattern, lowercased
MAX_DOCUMENTS = 100
GAME_CHUNK = 64  # coalitions per ranker call: a cancel or a passed deadline is seen between


class RankShapFields(BaseModel):
    """The instance of a RankSHAP request: one query and its candidate documents."""

    query: str = Field(..., min_length=1, max_length=4000, description="the query")
    documents: list[str] = Field(
        ...,
        min_length=2,
        max_length=MAX_DOCUMENTS,
        description=f"candidate documents to rank (2 to {MAX_DOCUMENTS})",
    )


# max_players chooses among the documents' terms: it does not apply to the query's
DOCUMENT_TERMS = applies(when={"players": ["documents"]})


class RankShapOptions(ExplainerOptions):
    """Options of the `rankshap` explainer."""
    players: Annotated[Literal["documents", "query"], EVERYWHERE] = Field(
        "documents",
        description="documents: terms of the query and documents, an absent term is removed "
        "from every document (METHODS.md: inferred); query: the query's terms, an absent term "
        "is removed from the query [ours]",
    )
    max_players: Annotated[int, DOCUMENT_TERMS] = Field(
        20,
        ge=1,
        le=64,
        description="players='documents': keep this many terms: query terms that occur in a "
        "document first, then by TF-IDF summed over the documents [ours: 20; METHODS caps at 64]",
    )
    absence: Annotated[Literal["delete", "mask"], EVERYWHERE] = Field(
        "delete",
        description="an absent term is deleted, or replaced by the ranker's mask token",
    )
    k: Annotated[int, EVERYWHERE] = Field(
        10, ge=1, le=MAX_DOCUMENTS, description="NDCG@k cut-off (capped at the number of documents)"
    )
    gain: Annotated[Literal["exponential", "linear"], EVERYWHERE] = Field(
        "exponential",
        description="graded relevance rel = K - original rank + 1 (inferred); gain 2^rel - 1 "
        "(exponential, inferred) or rel (linear, ours)",
    )
    estimator: Annotated[EstimatorChoice, EVERYWHERE] = Field(
        "auto",
        description="auto: exact when 2^n coalitions fit the budget, else gp below 3n "
        "coalitions, KernelSHAP from 3n; regression: surrogate_kernel's old name, accepted "
        "for this release only (deprecated_name warning)",
    )
    sampler: Annotated[SamplerName, EVERYWHERE] = Field(
        "kernel", description="coalition sampler of the kernel estimator"
    )
    fidelity_min_range: Annotated[float, EVERYWHERE] = Field(
        0.05,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Fidelity is null when v(all) - v(none), the NDCG the players account "
        "for, is below this: the values are then near zero and the implied ranking noise [ours]",
    )


def terms_of(text: str) -> list[str]:
    """The text's terms in order (lowercased words of two or more characters)."""
    return [m.group().lower() for m in TERM.finditer(text)]


def choose_players(
    query: str, documents: Sequence[str], mode: str, max_players: int
) -> tuple[str, ...]:
    """The player terms (see RankShapOptions.players)."""
    q_terms = list(dict.fromkeys(terms_of(query)))
    if mode == "query":
        return tuple(q_terms)
    doc_terms = [terms_of(d) for d in documents]
    vocab = list(dict.fromkeys(q_terms + [t for ts in doc_terms for t in ts]))
    n_docs = len(documents)
    df = {t: sum(t in set(ts) for ts in doc_terms) for t in vocab}
    tfidf = {
        t: sum(ts.count(t) for ts in doc_terms) * (math.log((1 + n_docs) / (1 + df[t])) + 1)
        for t in vocab
    }
    in_query = set(q_terms)
    order = sorted(
        range(len(vocab)),
        key=lambda i: (
            not (vocab[i] in in_query and df[vocab[i]] > 0),
            -tfidf[vocab[i]],
            i,
        ),
    )
    return tuple(vocab[i] for i in order[:max_players])


class _Pieces:
    """A text cut into pieces, each a player's occurrence (player index) or other text (-1)."""

    def __init__(self, text: str, index: dict[str, int]) -> None:
        self.parts: list[str] = []
        self.owner: list[int] = []
        last = 0
        for m in TERM.finditer(text):
            j = index.get(m.group().lower())
            if j is not None:
                self.parts += [text[last : m.start()], m.group()]
                self.owner += [-1, j]
                last = m.end()
        self.parts.append(text[last:])
        self.owner.append(-1)
        self.players = sorted({j for j in self.owner if j >= 0})

    def render(self, present: np.ndarray, mask_token: str | None) -> str:
        """The text with absent players deleted (mask_token None) or replaced."""
        out = []
        for part, j in zip(self.parts, self.owner, strict=True):
            if j < 0 or present[j]:
                out.append(part)
            elif mask_token is not None:
                out.append(mask_token)
        return "".join(out)

    def count(self, j: int) -> int:
        return self.owner.count(j)


def ndcg(scores: np.ndarray, gains: np.ndarray, k: int, ideal: float) -> float:
    """NDCG@k of the ranking by `scores` (descending); tied documents share the mean discount
    of the positions they occupy (the expected DCG over random tie-breaking) [ours]."""
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    disc = np.zeros(len(scores))
    disc[:k] = 1.0 / np.log2(np.arange(2, min(k, len(scores)) + 2))
    cum = np.concatenate([[0.0], np.cumsum(disc)])
    new = np.flatnonzero(~np.isclose(ranked[1:], ranked[:-1], rtol=1e-9, atol=1e-12)) + 1
    bounds = np.concatenate([[0], new, [len(scores)]])
    dcg = 0.0
    for a, b in pairwise(bounds):
        dcg += gains[order[a:b]].sum() * (cum[b] - cum[a]) / (b - a)
    return float(dcg / ideal)


@dataclass
class RankingGame:
    """v(S) = NDCG@k of the ranking the ranker gives when only the terms in S are present.

    Relevance grades come from the ranking of the unmasked input: rel(d) = K - rank(d) + 1
    (rank 1 = top), so v(all) = 1 unless the original scores tie.
    """

    model: RankerModel
    query: str
    documents: Sequence[str]
    players: tuple[str, ...]
    mode: str  # "documents" | "query"
    mask_token: str | None
    k: int
    gain: str

    def __post_init__(self) -> None:
        index = {t: j for j, t in enumerate(self.players)}
        self.query_pieces = _Pieces(self.query, index)
        self.doc_pieces = [_Pieces(d, index) for d in self.documents]
        self.rows_per_coalition = len(self.documents)
        self.scores = self.model.score(self.query, self.documents)  # [K]
        n_docs = len(self.documents)
        self.ranking = np.argsort(-self.scores, kind="stable")  # ties: input order
        rel = np.empty(n_docs)
        rel[self.ranking] = np.arange(n_docs, 0, -1)
        self.gains = 2.0**rel - 1.0 if self.gain == "exponential" else rel
        k = min(self.k, n_docs)
        self.k = k
        self.ideal = float((np.sort(self.gains)[::-1][:k] / np.log2(np.arange(2, k + 2))).sum())

    def masked(self, present: np.ndarray) -> tuple[str, list[str]]:
        """Query and documents with the absent players removed."""
        if self.mode == "query":
            return self.query_pieces.render(present, self.mask_token), list(self.documents)
        return self.query, [p.render(present, self.mask_token) for p in self.doc_pieces]

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        """bool [m, n] -> NDCG@k [m], scored GAME_CHUNK coalitions per ranker call: a
        cancel or a passed deadline is seen between them."""
        values: list[float] = []
        for start in range(0, len(masks), GAME_CHUNK):
            check_deadline()
            pairs = [self.masked(row) for row in masks[start : start + GAME_CHUNK]]
            scores = np.asarray(
                self.model.score_lists([q for q, _ in pairs], [d for _, d in pairs]),
                dtype=np.float64,
            )
            values += [ndcg(s, self.gains, self.k, self.ideal) for s in scores]
        return np.array(values, dtype=np.float64)

    def term_counts(self) -> np.ndarray:
        """How often each player occurs in each document. [K, n]"""
        return np.array([[p.count(j) for j in range(len(self.players))] for p in self.doc_pieces])


def fidelity(values: np.ndarray, counts: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """Kendall's tau (Fidelity) and top-weighted tau (weighted Fidelity) between the ranker's
    scores and the explanation-implied scores sum_j values_j * count(d, j) [inferred].

    The weighted tau weighs pairs by the ranker's ranking (hyperbolic, 1 / (rank + 1)); a
    constant ranking on either side gives None.
    """
    from scipy import stats

    # Equal up to rounding is equal: exact and sampled values of terms that occur alike differ
    # in the last bits, and Kendall's tau would rank documents by that noise.
    implied = _snap(counts @ values)
    scores = _snap(np.asarray(scores, dtype=np.float64))
    if np.ptp(implied) == 0 or np.ptp(scores) == 0:
        return {"fidelity": None, "weighted_fidelity": None}
    rank = np.empty(len(scores), dtype=np.int64)
    rank[np.argsort(-scores, kind="stable")] = np.arange(len(scores))
    tau = stats.kendalltau(scores, implied).statistic
    wtau = stats.weightedtau(scores, implied, rank=rank).statistic
    return {"fidelity": float(tau), "weighted_fidelity": float(wtau)}


def _snap(x: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """Values within rtol of the largest |value| of their sorted neighbour take its value."""
    tol = rtol * float(np.max(np.abs(x))) if x.size else 0.0
    order = np.argsort(x, kind="stable")
    out = x.astype(np.float64).copy()
    for a, b in pairwise(order):
        if x[b] - x[a] <= tol:
            out[b] = out[a]
    return out


def _scalar(x: Any) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def _check(
    model: Model, query: str, documents: Sequence[str], options: RankShapOptions
) -> RankerModel:
    if not isinstance(model, RankerModel):
        raise OptionError(f"rankshap explains rankers; {model.name!r} is a {model.modality} model")
    limit = model.max_chars
    texts = [("query", query), *((f"documents[{i}]", d) for i, d in enumerate(documents))]
    for where, text in texts:
        if not text.strip():
            raise OptionError(f"{where} is empty")
        if len(text) > limit or "\x00" in text:
            raise OptionError(f"{where}: at most {limit} characters and no NUL characters")
    if options.absence == "mask" and model.mask_token is None:
        raise OptionError(f"{model.name} has no mask token; use absence='delete'")
    return model


def explain(
    model: Model,
    inputs: np.ndarray,
    *,
    options: RankShapOptions,
    query: str,
    documents: list[str],
    target: int | None = None,
    seed: int = 0,
    budget: int | None = None,
    background: np.ndarray | None = None,
) -> ExplainResult:
    """RankSHAP values of the terms for the ranking of `documents` by `model` for `query`."""
    del inputs  # the instance is (query, documents)
    if target is not None:
        raise OptionError("rankshap explains the NDCG of the ranking; target does not apply")
    if background is not None:
        raise OptionError("rankshap takes no background: absent terms are deleted or masked")
    ranker = _check(model, query, documents, options)
    players = choose_players(query, documents, options.players, options.max_players)
    if not players:
        raise OptionError(
            f"the {'query' if options.players == 'query' else 'query and documents'} "
            "hold no terms (words of two or more letters or digits)"
        )
    mask = ranker.mask_token if options.absence == "mask" else None
    game = RankingGame(
        ranker, query, documents, players, options.players, mask, options.k, options.gain
    )
    n, cost = len(players), game.rows_per_coalition
    budget = default_budget(n, cost, options.estimator) if budget is None else budget
    choice = choose(Ask(), options.estimator, n, budget, cost)  # before any model call
    try:
        est, how = shapley_values_chosen(
            game, n, seed=seed, sampler=options.sampler, choice=choice
        )
    except ValueError as exc:  # e.g. a ranker refusing an input
        raise ExplainerError(str(exc)) from exc
    values = np.asarray(est.values, dtype=np.float64).reshape(n)
    v_empty, v_all = _scalar(est.base_value), _scalar(est.full_value)
    v_range = v_all - v_empty
    details: dict[str, Any] = {
        "terms": list(players),
        "ranking": game.ranking.tolist(),
        "scores": game.scores.tolist(),
        "k": game.k,
        "v_empty": v_empty,
        "v_all": v_all,
        "v_range": v_range,
        "value_scale": caveats.value_scale("NDCG", caveats.FLAT_RATIO),  # NDCG lies in [0, 1]
    }
    if how is not None:  # auto: what it measured and why it chose
        details["auto"] = how
    if abs(v_range) < options.fidelity_min_range:
        details.update(fidelity=None, weighted_fidelity=None)
        details["fidelity_note"] = (
            f"undefined: the players move NDCG@{game.k} by {v_range:.3g} in all "
            f"(< fidelity_min_range {options.fidelity_min_range:g})"
        )
    else:
        details.update(fidelity(values, game.term_counts(), game.scores))
    explanation = Explanation(
        output_index=0,
        values=values,
        base_value=v_empty,
        instance_output_value=v_all,
        exact=est.exact,
        n_model_evals=est.n_evaluations,
        estimator=est.estimator,
        error_std=None if est.error_std is None else np.asarray(est.error_std).reshape(n),
        details=details,
        output_name=f"ndcg@{game.k}",
    )
    flat = caveats.flat(explanation, model)  # the generic rule, so one caveat, not two
    if flat is not None:
        explanation = replace(explanation, warnings=(flat,))
    echo = options.echo()
    echo["estimator"] = canonical_estimator(options.estimator)  # an old name: the new one
    echo["k"] = game.k
    if options.absence == "mask":
        echo["mask_token"] = mask
    echo["value"] = f"NDCG@{game.k} of the induced ranking"
    return ExplainResult((explanation,), players, echo, budget, True, {})


__all__ = ["RankShapFields", "RankShapOptions", "RankingGame", "explain", "fidelity", "ndcg"]
