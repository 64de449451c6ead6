"""RankSHAP benchmark: Fidelity and weighted Fidelity against simpler term attributions.

    .venv/bin/python bench/rankshap_bench.py [--quick] [--out bench/out]

Corpus: the 83 prose paragraphs of scikit-learn's bundled dataset descriptions (offline); queries:
bench/data/rankshap_queries.json (12, written for this benchmark). Per query, a first stage
(bm25s over all paragraphs) picks 10 candidates, which `bm25` and `minilm-ranker` re-rank.
Players: the 8 terms chosen as RankSHAP's players='documents' does (query terms found in a
candidate first, then TF-IDF); an absent term is deleted from every candidate. NDCG@10 with the
model's own ranking as graded relevance (METHODS.md section 4).

Contenders, each giving one value per term:
- RankSHAP, exact (256 coalitions) and KernelSHAP at 64 coalitions;
- leave-one-out on NDCG: v(all) - v(all without the term) (9 coalitions);
- pointwise KernelSHAP on the score: Shapley values of each candidate's own score (exact over the
  same coalitions, all 10 scores from each ranker call), averaged over the candidates.
Fidelity = Kendall's tau between the ranker's scores and sum_j value_j * count(d, j); weighted
Fidelity = scipy's weighted tau, weighted by the ranker's ranking (RankSHAP's fidelity()).
Time per explanation is wall time, one thread, ranker calls included; minilm-ranker starts each
method with an empty embedding memo (texts repeated within one explanation are encoded once).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from explainers.rankshap import RankingGame, choose_players, fidelity  # noqa: E402
from explainers.shapley import shapley_values  # noqa: E402
from models.base import RankerModel  # noqa: E402
from models.encoders import descr_paragraphs  # noqa: E402
from models.rankers import load_bm25, load_minilm_ranker  # noqa: E402

N_CANDIDATES = 10
N_PLAYERS = 8


def first_stage(paragraphs: list[str], query: str) -> list[str]:
    import bm25s

    tokens = bm25s.tokenize(paragraphs, stopwords="en", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    q = bm25s.tokenize([query], stopwords="en", show_progress=False)
    docs, _ = retriever.retrieve(q, k=N_CANDIDATES, show_progress=False)
    return [paragraphs[int(i)] for i in docs[0]]


class ScoreGame:
    """v_d(S) = the ranker's score of every candidate with the terms outside S removed. [m, K]"""

    def __init__(self, game: RankingGame) -> None:
        self.game = game
        self.rows_per_coalition = len(game.documents)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        pairs = [self.game.masked(row) for row in masks]
        return np.asarray(
            self.game.model.score_lists([q for q, _ in pairs], [d for _, d in pairs]),
            dtype=np.float64,
        )


def fresh(model: RankerModel, query: str, docs: list[str], players: tuple[str, ...]) -> RankingGame:
    """A new game; minilm-ranker is reloaded (cheap) so no method reuses another's embeddings."""
    if model.name == "minilm-ranker":
        model = load_minilm_ranker(Path("."))
    return RankingGame(model, query, docs, players, "documents", None, N_CANDIDATES, "exponential")


def run_query(model: RankerModel, query: str, docs: list[str]) -> list[dict[str, Any]]:
    players = choose_players(query, docs, "documents", N_PLAYERS)
    n = len(players)
    out = []

    def record(name: str, values: np.ndarray, seconds: float, game: RankingGame) -> None:
        fid = fidelity(values, game.term_counts(), game.scores)
        out.append({"method": name, "seconds": seconds, **fid})

    for name, estimator, budget in (
        ("RankSHAP exact", "exact", (1 << n) * len(docs)),
        ("RankSHAP kernel-64", "kernel", 64 * len(docs)),
    ):
        start = time.perf_counter()
        game = fresh(model, query, docs, players)
        est = shapley_values(game, n, estimator=estimator, budget=budget, seed=0)
        record(name, np.asarray(est.values).reshape(n), time.perf_counter() - start, game)

    start = time.perf_counter()
    game = fresh(model, query, docs, players)
    masks = np.ones((n + 1, n), dtype=bool)
    masks[np.arange(1, n + 1), np.arange(n)] = False
    v = game(masks)
    record("leave-one-out NDCG", v[0] - v[1:], time.perf_counter() - start, game)

    start = time.perf_counter()
    game = fresh(model, query, docs, players)
    est = shapley_values(ScoreGame(game), n, estimator="exact", budget=(1 << n) * len(docs), seed=0)
    per_doc = np.asarray(est.values).reshape(n, len(docs))
    record("pointwise SHAP on scores", per_doc.mean(axis=1), time.perf_counter() - start, game)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 queries")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    queries = json.loads((ROOT / "bench" / "data" / "rankshap_queries.json").read_text())["queries"]
    if args.quick:
        queries = queries[:3]
    paragraphs = descr_paragraphs()
    rankers = [load_bm25(Path(".")), load_minilm_ranker(Path("."))]
    rows = []
    for query in queries:
        docs = first_stage(paragraphs, query)
        for model in rankers:
            for r in run_query(model, query, docs):
                rows.append({"query": query, "ranker": model.name, **r})
                print(json.dumps(rows[-1]), flush=True)
        print(f"done: {query}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rankshap_bench.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{len(queries)} queries x {N_CANDIDATES} candidates, {N_PLAYERS} term players")
    print("| ranker | method | Fidelity | weighted Fidelity | ms per explanation |")
    print("|---|---|---|---|---|")
    for model in rankers:
        for method in dict.fromkeys(r["method"] for r in rows):
            sel = [r for r in rows if r["ranker"] == model.name and r["method"] == method]
            cells = []
            for key in ("fidelity", "weighted_fidelity"):
                v = np.array([r[key] for r in sel if r[key] is not None])
                cells.append(f"{v.mean():.3f} ({v.std(ddof=1) / np.sqrt(len(v)):.3f}, n={len(v)})")
            ms = 1000 * np.mean([r["seconds"] for r in sel])
            print(f"| {model.name} | {method} | {cells[0]} | {cells[1]} | {ms:.0f} |")


if __name__ == "__main__":
    main()
