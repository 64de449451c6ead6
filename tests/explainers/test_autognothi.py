"""AutoGnothi on sentiment-minilm as a library: the frozen-encoder pass, the generated corpus,
a tiny side network's training (model weights unchanged, seeded determinism, efficiency) and
held-out accuracy against exact word Shapley values."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from explainers.amortized.autognothi import corpus as autognothi_corpus
from explainers.amortized.autognothi import net as autognothi_net
from explainers.amortized.autognothi import train as autognothi_train
from explainers.amortized.autognothi.train import AutoGnothiTrainOptions
from explainers.explanation import OptionError
from explainers.games.text import word_spans
from models.base import weights_hash
from tests.explainers.autognothi_setup import TEXTS, TINY

# One torch thread, as in the service's job workers: much faster on a shared CPU.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_one_encoder_pass_gives_the_models_probabilities_and_word_players(text_model: Any) -> None:
    texts = [*TEXTS, "Don't go."]
    enc = autognothi_net.encode(text_model, texts)
    np.testing.assert_allclose(
        enc.probs.numpy(), text_model.predict_texts(texts), rtol=1e-5, atol=1e-6
    )
    assert enc.hidden.shape[1] == 7  # the embeddings and six layers of MiniLM-L6
    for i, text in enumerate(texts):
        n = len(word_spans(text))
        assert int(enc.word_mask[i].sum()) == n
        per_word = enc.words[i, :n].sum(dim=1)
        assert (per_word >= 1).all()  # every word has its tokens
        assert int(enc.words[i].sum()) <= int(enc.token_mask[i].sum()) - 2  # no [CLS], [SEP]
    # "Don't" is one word of three tokens (don ' t); the final "." belongs to no word.
    assert enc.words[2, 0].sum().item() == 3
    assert enc.words[2].sum().item() == 4


def test_corpus_is_seeded_and_holds_out_its_own_words() -> None:
    a = autognothi_corpus.sentences(30, seed=1)
    assert a == autognothi_corpus.sentences(30, seed=1)
    assert a != autognothi_corpus.sentences(30, seed=2)
    assert len(set(a)) == 30
    assert all(2 <= len(word_spans(s)) <= 10 for s in a)
    train, held = autognothi_corpus.lexicon(False), autognothi_corpus.lexicon(True)
    for slot in ("adjectives", "adverbs", "nouns", "verbs"):
        assert not set(getattr(train, slot)) & set(getattr(held, slot))
    assert autognothi_corpus.source().startswith("vaderSentiment ")


def test_training_leaves_the_model_unchanged_and_is_seeded(
    text_model: Any, tiny: autognothi_train.Trained
) -> None:
    before = weights_hash(text_model.module)
    again = autognothi_train.train(text_model, AutoGnothiTrainOptions(**TINY))
    assert again is not None
    assert weights_hash(text_model.module) == before == tiny.metrics["model_weights"]
    a, b = _values(text_model, tiny), _values(text_model, again)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    other = autognothi_train.train(text_model, AutoGnothiTrainOptions(**{**TINY, "seed": 6}))
    assert other is not None
    assert not np.allclose(a, _values(text_model, other), atol=1e-4)
    # Efficiency: every class's values add up to v(N) - v(empty).
    empty = text_model.predict_texts(autognothi_net.empty_texts(text_model, TEXTS))
    full = text_model.predict_texts(TEXTS)
    np.testing.assert_allclose(a.sum(axis=1), full - empty, rtol=1e-5, atol=1e-6)


def _values(model: Any, trained: autognothi_train.Trained) -> np.ndarray:
    """Projected word values [m, w, C] of TEXTS (0 on padding words)."""
    enc = autognothi_net.encode(model, TEXTS)
    empty = model.predict_texts(autognothi_net.empty_texts(model, TEXTS))
    with torch.inference_mode():
        phi = autognothi_net.word_values(
            trained.net, enc, enc.probs, torch.from_numpy(np.asarray(empty, dtype=np.float32))
        )
    return phi.numpy()


def test_only_bert_encoder_classifiers(text_model: Any) -> None:
    wrapped = dataclasses.replace(text_model, predict_texts=lambda t: text_model.predict_texts(t))
    with pytest.raises(OptionError, match="BERT-encoder"):
        autognothi_train.train(wrapped, AutoGnothiTrainOptions(**TINY))


def test_held_out_agreement_beats_an_untrained_side_network(text_model: Any) -> None:
    """A small training run on generated sentences; held-out sentences carry sentiment words
    no training sentence has. The untrained network (same architecture and projection) is the
    trivial baseline."""
    opts = AutoGnothiTrainOptions(
        sentences=60, pairs=8, epochs=25, batch_size=16, held_out=10, held_out_words=6, seed=0
    )
    trained = autognothi_train.train(text_model, opts)
    assert trained is not None
    vocabulary = frozenset(autognothi_net.runner(text_model).tokenizer.get_vocab())
    held = autognothi_corpus.sentences(10, 0, True, 6, vocabulary)
    exact = autognothi_train.exact_shapley(text_model, held)
    enc = autognothi_train.encode_all(text_model, held)
    empty = text_model.predict_texts(autognothi_net.empty_texts(text_model, held))
    empty_t = torch.from_numpy(np.asarray(empty, dtype=np.float32))
    ours = autognothi_train.held_out(trained.net, enc, empty_t, exact)
    torch.manual_seed(0)
    untrained = autognothi_net.SideNet(7, 384, 2, opts.width, opts.heads).eval()
    baseline = autognothi_train.held_out(untrained, enc, empty_t, exact)
    assert ours["held_out_pearson"] == pytest.approx(trained.metrics["held_out_pearson"], 1e-5)
    assert ours["held_out_pearson"] > 0.6
    assert ours["held_out_pearson"] > baseline["held_out_pearson"] + 0.2
    assert ours["held_out_rmse"] < baseline["held_out_rmse"]


def test_every_epoch_draws_new_coalitions(text_model: Any) -> None:
    """Resampled training calls the model for new coalitions in later epochs (each distinct
    text once); the fixed-draw ablation evaluates its one draw before the first epoch."""
    base = {**TINY, "epochs": 4, "pairs": 2}
    fresh = autognothi_train.train(text_model, AutoGnothiTrainOptions(**base))
    fixed = autognothi_train.train(
        text_model, AutoGnothiTrainOptions(**{**base, "resample": False})
    )
    assert fresh is not None and fixed is not None
    rows = [r["model_rows"] for r in fresh.history if r.get("phase") == "side"]
    assert len(rows) == 4 and rows[0] < rows[1] < rows[2] < rows[3]
    frozen = [r["model_rows"] for r in fixed.history if r.get("phase") == "side"]
    assert frozen[0] == frozen[-1] == fixed.history[0]["model_rows"]
    assert fresh.metrics["coalitions_drawn"] == 4 * fixed.metrics["coalitions_drawn"]
    # A coalition drawn twice is evaluated once: the game remembers every distinct text.
    texts = autognothi_corpus.sentences(6, 0)
    enc = autognothi_train.encode_all(text_model, texts)
    game = autognothi_train.CoalitionValues(text_model, texts, enc.words.shape[1])
    gen = torch.Generator().manual_seed(0)
    a, b = game.draw(3, gen), game.draw(3, gen)
    assert not torch.equal(a.masks, b.masks)
    distinct = {
        g.compose(m[: g.n_players].numpy())
        for t in (a, b)
        for g, ms in zip(game.games, t.masks, strict=True)
        for m in ms
    }
    ends = {g.text for g in game.games} | {
        g.compose(np.zeros(g.n_players, dtype=bool)) for g in game.games
    }
    assert game.model_rows == len(distinct | ends)
    # The gains are the game's values: v(S) - v(empty) from the model itself.
    g, mask = game.games[0], a.masks[0, 0, : game.games[0].n_players].numpy()
    direct = text_model.predict_texts([g.compose(mask), g.compose(np.zeros(g.n_players, bool))])
    np.testing.assert_allclose(a.gains[0, 0].numpy(), direct[0] - direct[1], atol=1e-5)


def test_check_templates_share_no_subject_or_sentence_with_training() -> None:
    """The check set (issue 28) is generated from templates and subjects no training or
    validation sentence uses, with the held-out words."""
    train = autognothi_corpus.sentences(400, 0) + autognothi_corpus.sentences(40, 1, True)
    check = autognothi_corpus.check_sentences(40, 0)
    assert len(check) == 40 and not set(check) & set(train)
    words = {p.text.lower() for s in train for p in word_spans(s)}
    assert not set(autognothi_corpus.CHECK_SUBJECTS) & words
    assert not set(autognothi_corpus.CHECK_SUBJECTS) & set(autognothi_corpus.SUBJECTS)
    assert all(any(s in c.lower() for s in autognothi_corpus.CHECK_SUBJECTS) for c in check)
    reviews = autognothi_corpus.check_reviews(5, 0)
    assert all(30 <= len(word_spans(r)) <= 34 for r in reviews)
    assert reviews == autognothi_corpus.check_reviews(5, 0)


def test_training_range_flags_length_and_unseen_words() -> None:
    span = autognothi_train.TrainingRange(5, 9, frozenset({"the", "food", "was", "good"}))
    assert span.outside(["The", "food", "was", "good"], 6) is None
    assert span.outside(["The", "food", "was", "awful"], 6) is None  # 1 of 4 unseen
    long = span.outside(["the"] * 6, 8)
    assert long is not None and long.code == "outside_training_range"
    assert "6 words" in long.message and "5 words" in long.message
    tokens = span.outside(["the", "food"], 10)  # few words, but more tokens than ever seen
    assert tokens is not None and "10 tokens" in tokens.message
    unseen = span.outside(["A", "rancid", "soup", "was"], 6)  # 3 of 4 never seen
    assert unseen is not None and "3 of its 4 words" in unseen.message
    half = span.outside(["the", "food", "rancid", "soup"], 6)  # exactly OOV_SHARE: in range
    assert half is None
    again = autognothi_train.TrainingRange.from_state(span.state())
    assert again == span
