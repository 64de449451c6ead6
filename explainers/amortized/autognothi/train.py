"""Training AutoGnothi's side network with FastSHAP's objective on coalitions drawn afresh.

Wang et al., "Gnothi Seauton: Empowering Faithful Self-Interpretability in Black-Box
Transformers" (ICLR 2025; code github.com/gszfwsb/AutoGnothi) train a side network beside a
frozen transformer to output Shapley values; the objective is FastSHAP's (Jethani et al., ICLR
2022): for coalitions S drawn from the Shapley kernel, minimise
n * mean (v(S) - v(empty) - sum_{i in S} phi_i(x))^2 with phi efficiency-projected, whose
minimiser is the Shapley values. As in the paper's training, every epoch draws new coalitions
for every sentence (`pairs` kernel coalitions and their complements), so the side network
fits the game, not the noise of one fixed draw. The game v is `shapley`'s text game on the
same model (words deleted: explainers/games/text.py), not the paper's side-tuned masking
surrogate; a coalition's value, once computed, is remembered for the run (a coalition drawn
again in a later epoch costs no model call). The frozen encoder's hidden states are computed
once per sentence: the model is never trained and its weights are checked unchanged (a hash
before and after). The artifact records its training range (longest sentence in words and
tokens, the words seen) so that explanations outside it carry a warning
(`outside_training_range`, explainers/amortized/autognothi/explainer.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from explainers.amortized.autognothi import corpus
from explainers.amortized.autognothi.net import Encoded, SideNet, empty_texts, encode, word_values
from explainers.amortized.autognothi.net import vocabulary as net_vocabulary
from explainers.amortized.masks import kernel_masks
from explainers.amortized.progress import Progress, Recorder
from explainers.estimators.mobius import mobius_transform, shapley_from_mobius
from explainers.explanation import Caveat, OptionError
from explainers.games.deadlines import check_deadline
from explainers.games.text import text_games, word_spans
from models.base import TextModel, weights_hash

TRAINING_VERSION = "3"  # 2: more sentence templates; 3: coalitions drawn afresh every epoch
ENCODE_BATCH = 64  # texts per frozen-encoder pass while caching hidden states
OOV_SHARE = 0.5  # more than this share of an input's words never seen in training: a warning


class AutoGnothiTrainOptions(BaseModel):
    """Training configuration of an AutoGnothi side network; defaults are ours (2-core CPU)."""

    model_config = ConfigDict(extra="forbid")
    sentences: int = Field(400, ge=8, le=2000, description="generated training sentences")
    max_words: int = Field(10, ge=2, le=40, description="longest training sentence, in words")
    pairs: int = Field(
        2,
        ge=1,
        le=256,
        description="Shapley-kernel coalitions (and their complements) per sentence, drawn "
        "afresh every epoch",
    )
    resample: bool = Field(
        True,
        description="draw new coalitions every epoch (the paper's training); false: one draw "
        "per sentence kept for every epoch (fits that draw's noise; an ablation)",
    )
    epochs: int = Field(30, ge=1, le=2000)
    batch_size: int = Field(32, ge=1, le=1024, description="sentences per step")
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate")
    width: int = Field(64, ge=8, le=512, description="side network width")
    heads: int = Field(4, ge=1, le=16)
    held_out: int = Field(
        16, ge=0, le=200, description="held-out sentences with exact Shapley values (metrics)"
    )
    held_out_words: int = Field(8, ge=2, le=12, description="longest held-out sentence")
    seed: int = Field(0, ge=0, le=2**32 - 1)

    def digest(self, data_id: str = "vader") -> str:
        """An artifact's id within a model version: the configuration, the data, the code."""
        text = json.dumps([self.model_dump(mode="json"), data_id, TRAINING_VERSION])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def word_key(word: str) -> str:
    """A word as the training vocabulary records it (lower case)."""
    return word.lower()


@dataclass(frozen=True)
class TrainingRange:
    """What the side network was trained on: the longest sentence (words, encoder tokens with
    [CLS] and [SEP]) and every word seen (lower case). Beyond it the network extrapolates."""

    max_words: int
    max_tokens: int
    vocabulary: frozenset[str]

    @classmethod
    def of(cls, texts: list[str], enc: Encoded) -> TrainingRange:
        words = {word_key(p.text) for text in texts for p in word_spans(text)}
        return cls(
            int(enc.word_mask.sum(dim=1).max()), int(enc.token_mask.sum(dim=1).max()),
            frozenset(words),
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        """Its form in an artifact's weights.pt (loads with weights_only=True)."""
        return {"max_words": self.max_words, "max_tokens": self.max_tokens,
                "vocabulary": sorted(self.vocabulary)}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TrainingRange:
        return cls(int(state["max_words"]), int(state["max_tokens"]),
                   frozenset(state["vocabulary"]))  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """For the artifact's metrics (no word list)."""
        return {"max_words": self.max_words, "max_tokens": self.max_tokens,
                "vocabulary_words": len(self.vocabulary)}  # fmt: skip

    def outside(self, words: list[str], n_tokens: int) -> Caveat | None:
        """`outside_training_range` when an input is longer than every training sentence (in
        words or tokens) or more than OOV_SHARE of its words were never seen in training."""
        reasons = []
        if len(words) > self.max_words or n_tokens > self.max_tokens:
            reasons.append(
                f"{len(words)} words and {n_tokens} tokens, the longest training sentence "
                f"{self.max_words} words and {self.max_tokens} tokens"
            )
        unseen = [w for w in words if word_key(w) not in self.vocabulary]
        if words and len(unseen) > OOV_SHARE * len(words):
            shown = ", ".join(dict.fromkeys(unseen[:5]))
            reasons.append(
                f"{len(unseen)} of its {len(words)} words never appear in the training "
                f"sentences (e.g. {shown})"
            )
        if not reasons:
            return None
        return Caveat(
            "outside_training_range",
            f"input outside the side network's training range: {'; '.join(reasons)}; its "
            "values are an extrapolation (measured less accurate there: docs/benchmarks.md, "
            "AutoGnothi); train on such sentences (a train-autognothi job with inputs) or use "
            "shapley",
        )


UNKNOWN_RANGE = Caveat(
    "outside_training_range",
    "this artifact records no training range (trained before it was recorded): whether the "
    "input is within it is unknown; train it again",
)


@dataclass(frozen=True)
class Trained:
    """A trained side network with what it needs to explain."""

    net: SideNet  # eval mode
    options: AutoGnothiTrainOptions
    metrics: dict[str, Any] = field(default_factory=dict)
    history: tuple[dict[str, Any], ...] = ()
    data_id: str = "vader"  # or the SHA-256 of the sentences it was given
    range: TrainingRange | None = None  # None: an artifact stored before ranges were recorded
    # v(empty) by (model version, text with every word deleted): few distinct strings
    empty: dict[tuple[str, str], np.ndarray] = field(default_factory=dict, compare=False)

    @property
    def id(self) -> str:
        return self.options.digest(self.data_id)


@dataclass(frozen=True)
class Targets:
    """One draw of coalitions per sentence and their v(S) - v(empty), padded to w words."""

    masks: torch.Tensor  # [m, K, w] bool
    gains: torch.Tensor  # [m, K, C]
    full: torch.Tensor  # [m, C] v(N)
    empty: torch.Tensor  # [m, C] v(empty)


class CoalitionValues:
    """`shapley`'s text game on the training sentences, its values remembered by text: each
    draw calls the model (one batched call) only for coalitions not evaluated before."""

    def __init__(self, model: TextModel, texts: list[str], width: int) -> None:
        self.model, self.width = model, width
        self.games = text_games(model, texts)
        self.values: dict[str, np.ndarray] = {}
        ends = [g.text for g in self.games]
        ends += [g.compose(np.zeros(g.n_players, dtype=bool)) for g in self.games]
        self._evaluate(ends)
        self.full = torch.from_numpy(np.stack([self.values[g.text] for g in self.games]))
        self.empty = torch.from_numpy(np.stack([self.values[t] for t in ends[len(texts) :]]))

    @property
    def model_rows(self) -> int:
        """Model rows so far (distinct texts evaluated)."""
        return len(self.values)

    def _evaluate(self, rows: list[str]) -> None:
        missing = [t for t in dict.fromkeys(rows) if t not in self.values]
        if missing:
            check_deadline()
            probs = np.asarray(self.model.predict_texts(missing), dtype=np.float32)
            self.values.update(zip(missing, probs, strict=True))

    def draw(self, pairs: int, gen: torch.Generator) -> Targets:
        """`pairs` kernel-drawn coalitions of each sentence and their complements."""
        masks = torch.zeros(len(self.games), 2 * pairs, self.width, dtype=torch.bool)
        rows: list[str] = []
        for i, game in enumerate(self.games):
            half = kernel_masks(game.n_players, pairs, gen)  # [pairs, n]
            both = torch.stack([half, ~half], dim=1).reshape(2 * pairs, game.n_players)
            masks[i, :, : game.n_players] = both
            rows += [game.compose(row) for row in both.numpy()]
        self._evaluate(rows)
        values = torch.from_numpy(np.stack([self.values[t] for t in rows]))
        gains = values.reshape(len(self.games), 2 * pairs, -1) - self.empty[:, None]
        return Targets(masks, gains, self.full, self.empty)


def fastshap_loss(phi: torch.Tensor, t: Targets, word_mask: torch.Tensor) -> torch.Tensor:
    """n * mean squared error of the additive prediction on the cached coalitions (FastSHAP).
    phi [b, w, C] (projected), masks [b, K, w], gains [b, K, C]."""
    pred = t.masks.to(phi.dtype) @ phi  # [b, K, C]
    n = word_mask.sum(dim=1).to(phi.dtype)  # [b]
    return (n * ((pred - t.gains) ** 2).mean(dim=(1, 2))).mean()


def _cat(parts: list[Encoded], width: int, n_words: int) -> Encoded:
    """Encoder passes of several batches, padded to `width` tokens and `n_words` words."""

    def pad(x: torch.Tensor, dims: dict[int, int]) -> torch.Tensor:
        spec = [0, 0] * x.dim()
        for d, size in dims.items():
            spec[2 * (x.dim() - 1 - d) + 1] = size - x.shape[d]
        return torch.nn.functional.pad(x, spec)

    return Encoded(
        torch.cat([pad(p.hidden, {2: width}) for p in parts]),
        torch.cat([pad(p.token_mask, {1: width}) for p in parts]),
        torch.cat([pad(p.words, {1: n_words, 2: width}) for p in parts]),
        torch.cat([pad(p.word_mask, {1: n_words}) for p in parts]),
        torch.cat([p.probs for p in parts]),
    )


def _take(enc: Encoded, t: Targets, idx: torch.Tensor) -> tuple[Encoded, Targets]:
    sub = Encoded(enc.hidden[idx], enc.token_mask[idx], enc.words[idx], enc.word_mask[idx],
                  enc.probs[idx])  # fmt: skip
    return sub, Targets(t.masks[idx], t.gains[idx], t.full[idx], t.empty[idx])


def encode_all(model: TextModel, texts: list[str]) -> Encoded:
    """The frozen encoder's pass over every text, in batches, padded to a common shape."""
    parts = []
    for s in range(0, len(texts), ENCODE_BATCH):
        check_deadline()  # a cancelled training job stops between encoder passes
        parts.append(encode(model, texts[s : s + ENCODE_BATCH]))
    width = max(p.hidden.shape[2] for p in parts)
    n_words = max(p.words.shape[1] for p in parts)
    return _cat(parts, width, n_words)


def data_digest(texts: list[str]) -> str:
    """The identity of training sentences sent by a caller."""
    return hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()


def exact_shapley(model: TextModel, texts: list[str]) -> list[np.ndarray]:
    """Exact word Shapley values [n, C] of each text: `shapley`'s game, every coalition."""
    out = []
    for game in text_games(model, texts):
        check_deadline()
        n = game.n_players
        masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)  # bit order
        out.append(shapley_from_mobius(mobius_transform(game(masks))))  # as estimators/exact
    return out


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum() + 1e-30))


def train(
    model: TextModel,
    options: AutoGnothiTrainOptions,
    texts: list[str] | None = None,
    progress: Progress | None = None,
) -> Trained | None:
    """Train a side network for a frozen text classifier; None if `progress` stops it.

    `texts`: training sentences (default: generated from the VADER lexicon)."""
    opts = options
    before = weights_hash(model.torch_module())
    vocabulary = net_vocabulary(model)
    data_id = "vader"
    if texts is None:
        texts = corpus.sentences(opts.sentences, opts.seed, False, opts.max_words, vocabulary)
    else:
        data_id = data_digest(texts)
    if len(texts) < 2:
        raise OptionError("AutoGnothi needs at least 2 training sentences")
    held = corpus.sentences(opts.held_out, opts.seed, True, opts.held_out_words, vocabulary)
    report = Recorder(progress)
    record: dict[str, Any]

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(opts.seed)
        gen = torch.Generator().manual_seed(opts.seed)
        enc = encode_all(model, texts)
        game = CoalitionValues(model, texts, enc.words.shape[1])
        fixed = None if opts.resample else game.draw(opts.pairs, gen)
        exact = exact_shapley(model, held) if held else []
        held_enc = encode_all(model, held) if held else None
        held_empty = _probs(model, empty_texts(model, held)) if held else None
        record = {"phase": "targets", "sentences": len(texts), "held_out_sentences": len(held),
                  "model_rows": game.model_rows}  # fmt: skip
        if not report(record):
            return None
        net = SideNet(enc.hidden.shape[1], enc.hidden.shape[3], game.full.shape[1],
                      opts.width, opts.heads)  # fmt: skip
        optimiser = torch.optim.Adam(net.parameters(), lr=opts.lr)
        for epoch in range(opts.epochs):
            tg = fixed if fixed is not None else game.draw(opts.pairs, gen)  # new coalitions
            net.train()
            losses = []
            for idx in torch.randperm(len(texts), generator=gen).split(opts.batch_size):
                check_deadline()  # between training steps
                sub, t = _take(enc, tg, idx)
                phi = word_values(net, sub, t.full, t.empty)
                loss = fastshap_loss(phi, t, sub.word_mask)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
            net.eval()
            record = {"phase": "side", "epoch": epoch, "loss": float(np.mean(losses)),
                      "model_rows": game.model_rows}  # fmt: skip
            if (
                held_enc is not None
                and held_empty is not None
                and (epoch % 10 == 9 or epoch == opts.epochs - 1)
            ):
                record.update(held_out(net, held_enc, held_empty, exact))
            if not report(record):
                return None
    if weights_hash(model.torch_module()) != before:  # cannot happen: nothing optimises the model
        raise RuntimeError("the frozen model's weights changed during AutoGnothi training")
    final = {k: v for r in report.history for k, v in r.items() if k.startswith("held_out_")}
    span = TrainingRange.of(texts, enc)
    metrics = {
        **final,
        "train_sentences": len(texts),
        "coalitions_per_sentence_and_epoch": 2 * opts.pairs,
        "coalitions_resampled": opts.resample,
        "coalitions_drawn": len(texts) * 2 * opts.pairs * (opts.epochs if opts.resample else 1),
        "model_rows": game.model_rows,
        "training_range": span.summary(),
        "train_seconds": report.seconds(),
        "model_weights": before,
        "corpus": corpus.source() if data_id == "vader" else "request",
        "torch_threads": torch.get_num_threads(),
    }
    return Trained(net, opts, metrics, tuple(report.history), data_id, span)


def _probs(model: TextModel, texts: list[str]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(model.predict_texts(texts), dtype=np.float32))


def held_out(
    net: SideNet, enc: Encoded, empty: torch.Tensor, exact: list[np.ndarray]
) -> dict[str, float]:
    """Agreement with exact Shapley values for the predicted class: Pearson over every word
    of every sentence, the mean per-sentence Pearson, and the RMSE."""
    with torch.inference_mode():
        phi = word_values(net, enc, enc.probs, empty).numpy()
    predicted = enc.probs.argmax(dim=1).numpy()
    ours, truth, per = [], [], []
    for i, values in enumerate(exact):
        c, n = int(predicted[i]), len(values)
        ours.append(phi[i, :n, c])
        truth.append(values[:, c])
        if n > 1:
            per.append(pearson(ours[-1], truth[-1]))
    a, b = np.concatenate(ours), np.concatenate(truth)
    return {
        "held_out_pearson": pearson(a, b),
        "held_out_pearson_per_sentence": float(np.mean(per)) if per else float("nan"),
        "held_out_rmse": float(np.sqrt(np.mean((a - b) ** 2))),
    }
