"""RankSHAP benchmark: Fidelity and weighted Fidelity against simpler term attributions.

    .venv/bin/python bench/rankshap_bench.py [--quick] [--players 8,16,32,64] [--coalitions 512]
        [--rankers bm25,minilm-ranker] [--out bench/out]

Corpus: the 83 prose paragraphs of scikit-learn's bundled dataset descriptions (offline); queries:
bench/data/rankshap_queries.json (12, written for this benchmark). Per query, a first stage
(bm25s over all paragraphs) picks 10 candidates, which `bm25` and `minilm-ranker` re-rank.
Players: the m terms (m in --players, up to 64, RankSHAP's cap) chosen as RankSHAP's
players='documents' does (query terms found in a candidate first, then TF-IDF; fewer when the
candidates hold fewer terms); an absent term is deleted from every candidate. NDCG@10 with the
model's own ranking as graded relevance (METHODS.md section 4).

Contenders, each giving one value per term:
- RankSHAP: exact when m <= 10, and KernelSHAP at 64 (when 64 >= 2m) and --coalitions coalitions;
- leave-one-out on NDCG: v(all) - v(all without the term) (m + 1 coalitions);
- pointwise SHAP on the score: Shapley values of each candidate's own score (exact when m <= 10,
  else KernelSHAP at --coalitions; all 10 scores from each ranker call), averaged over the
  candidates.
Fidelity = Kendall's tau between the ranker's scores and sum_j value_j * count(d, j); weighted
Fidelity = scipy's weighted tau, weighted by the ranker's ranking (RankSHAP's fidelity()). Each
row records v(none) and v(all) - v(none); Fidelity counts only where v(all) - v(none) is at
least RankShapOptions' fidelity_min_range (0.05), as the service reports it, and the raw figure
is kept as raw_fidelity.
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

from explainers.rankshap import (  # noqa: E402
    RankingGame,
    RankShapOptions,
    choose_players,
    fidelity,
)
from explainers.shapley.explainer import shapley_values  # noqa: E402
from models.base import RankerModel  # noqa: E402
from models.builtin.encoders import descr_paragraphs  # noqa: E402
from models.builtin.rankers import load_bm25, load_minilm_ranker  # noqa: E402

N_CANDIDATES = 10
EXACT_UP_TO = 10
MIN_RANGE = RankShapOptions().fidelity_min_range


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


def run_query(
    model: RankerModel, query: str, docs: list[str], m: int, coalitions: int
) -> list[dict[str, Any]]:
    players = choose_players(query, docs, "documents", m)
    n = len(players)
    out = []
    full = fresh(model, query, docs, players)
    v = full(np.array([np.zeros(n, dtype=bool), np.ones(n, dtype=bool)]))
    v_empty, v_range = float(v[0]), float(v[1] - v[0])

    def record(name: str, values: np.ndarray, seconds: float, game: RankingGame) -> None:
        fid = fidelity(values, game.term_counts(), game.scores)
        kept = fid if abs(v_range) >= MIN_RANGE else dict.fromkeys(fid)
        out.append(
            {
                "method": name,
                "players": n,
                "seconds": seconds,
                "v_empty": v_empty,
                "v_range": v_range,
                **kept,
                "raw_fidelity": fid["fidelity"],
            }
        )

    runs = [("RankSHAP exact", "exact", 1 << n)] if n <= EXACT_UP_TO else []
    for count in dict.fromkeys((64, coalitions)):  # KernelSHAP needs at least 2n coalitions
        if count >= 2 * n:
            runs.append((f"RankSHAP kernel-{count}", "kernel", count))
    for name, estimator, count in runs:
        start = time.perf_counter()
        game = fresh(model, query, docs, players)
        est = shapley_values(game, n, estimator=estimator, budget=count * len(docs), seed=0)
        record(name, np.asarray(est.values).reshape(n), time.perf_counter() - start, game)

    start = time.perf_counter()
    game = fresh(model, query, docs, players)
    masks = np.ones((n + 1, n), dtype=bool)
    masks[np.arange(1, n + 1), np.arange(n)] = False
    v = game(masks)
    record("leave-one-out NDCG", v[0] - v[1:], time.perf_counter() - start, game)

    start = time.perf_counter()
    game = fresh(model, query, docs, players)
    estimator, count = ("exact", 1 << n) if n <= EXACT_UP_TO else ("kernel", coalitions)
    est = shapley_values(ScoreGame(game), n, estimator=estimator, budget=count * len(docs), seed=0)
    per_doc = np.asarray(est.values).reshape(n, len(docs))
    name = "pointwise SHAP on scores" + ("" if estimator == "exact" else f" (kernel-{count})")
    record(name, per_doc.mean(axis=1), time.perf_counter() - start, game)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 queries")
    parser.add_argument("--players", default="8,16,32,64", help="term players per explanation")
    parser.add_argument("--coalitions", type=int, default=512, help="KernelSHAP coalitions")
    parser.add_argument("--rankers", default="bm25,minilm-ranker")
    parser.add_argument("--queries", type=int, default=None, help="the first N queries")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    queries = json.loads((ROOT / "bench" / "data" / "rankshap_queries.json").read_text())["queries"]
    queries = queries[: 3 if args.quick else args.queries]
    sizes = [int(m) for m in args.players.split(",")]
    paragraphs = descr_paragraphs()
    loaders = {"bm25": load_bm25, "minilm-ranker": load_minilm_ranker}
    rankers = [loaders[name](Path(".")) for name in args.rankers.split(",")]
    rows = []
    for query in queries:
        docs = first_stage(paragraphs, query)
        for model in rankers:
            for m in sizes:
                for r in run_query(model, query, docs, m, args.coalitions):
                    rows.append({"query": query, "ranker": model.name, "max_players": m, **r})
                    print(json.dumps(rows[-1]), flush=True)
        print(f"done: {query}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "rankshap_bench" + "_".join(["", *args.rankers.split(",")]) + ".json"
    (args.out / name).write_text(json.dumps(rows, indent=1))
    print(f"\n{len(queries)} queries x {N_CANDIDATES} candidates")
    for model in rankers:
        sel = [r for r in rows if r["ranker"] == model.name and r["max_players"] == sizes[0]]
        flat = {r["query"] for r in sel if abs(r["v_range"]) < MIN_RANGE}
        v0 = sorted({r["query"]: r["v_empty"] for r in sel}.values())
        print(
            f"{model.name}, {sizes[0]} players: v(none) = {', '.join(f'{x:.3f}' for x in v0)}; "
            f"{len(flat)} of {len(v0)} queries with v(all) - v(none) < {MIN_RANGE:g}"
        )
    print(
        "| ranker | players (max / mean) | method | Fidelity | weighted Fidelity | raw Fidelity "
        "(all queries) | ms per explanation |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in rankers:
        for m in sizes:
            here = [r for r in rows if r["ranker"] == model.name and r["max_players"] == m]
            for method in dict.fromkeys(r["method"] for r in here):
                sel = [r for r in here if r["method"] == method]
                cells = []
                for key in ("fidelity", "weighted_fidelity", "raw_fidelity"):
                    v = np.array([r[key] for r in sel if r[key] is not None])
                    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
                    cells.append(f"{v.mean():.3f} ({se:.3f}, {len(v)})" if len(v) else "-")
                ms = 1000 * np.mean([r["seconds"] for r in sel])
                mean_n = np.mean([r["players"] for r in sel])
                print(
                    f"| {model.name} | {m} / {mean_n:.1f} | {method} | {cells[0]} | {cells[1]} | "
                    f"{cells[2]} | {ms:.0f} |"
                )


if __name__ == "__main__":
    main()
