"""Text players and games: offsets, the strings a coalition builds, and Shapley values on text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainers import interaction_values, shapley_values
from explainers.explanation import OptionError, Span
from explainers.games import all_masks
from explainers.games.text import TextGame, text_games, token_spans, word_spans
from explainers.shapley.explainer import ShapleyOptions, explain
from models import Model, TextModel


class Recorder:
    """A fake text model: records the strings it is given, returns [len, 1] per string."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts])

    @property
    def seen(self) -> list[str]:
        return [t for call in self.calls for t in call]


def rows(*bits: str) -> np.ndarray:
    return np.array([[c == "1" for c in b] for b in bits])


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Text tests run on one torch thread (see tests/conftest.py)."""


@pytest.fixture()
def model(text_model: TextModel) -> TextModel:
    return text_model


def test_word_spans_keep_offsets() -> None:
    text = "  Don't   stop, it's well-made… Café 42!\nNew_line"
    spans = word_spans(text)
    assert [s.text for s in spans] == [
        "Don't",
        "stop",
        "it's",
        "well-made",
        "Café",
        "42",
        "New_line",
    ]
    assert all(text[s.start : s.end] == s.text for s in spans)
    assert word_spans("!!! ... ?") == []


def test_token_spans_skip_empty_offsets() -> None:
    text = "terrible!"
    spans = token_spans(text, [(0, 0), (0, 4), (4, 8), (8, 9), (9, 9)])
    assert spans == [Span("terr", 0, 4), Span("ible", 4, 8), Span("!", 8, 9)]


def test_deletion_builds_the_right_strings() -> None:
    text = "The movie was terrible."
    fake = Recorder()
    game = TextGame(fake, text, word_spans(text))
    assert game.n_players == 4 and game.rows_per_coalition == 1
    values = game(rows("1111", "0111", "1101", "1110", "0000", "1010"))
    assert fake.seen == [
        "The movie was terrible.",  # all present: the text itself
        "movie was terrible.",
        "The movie terrible.",
        "The movie was.",
        ".",
        "The was.",
    ]
    assert values.shape == (6, 2)
    np.testing.assert_array_equal(values[:, 0], [len(t) for t in fake.seen])


def test_masking_builds_the_right_strings() -> None:
    text = "good, not bad"
    fake = Recorder()
    game = TextGame(fake, text, word_spans(text), absence="mask", mask_token="<m>")
    game(rows("111", "011", "100", "000"))
    assert fake.seen == ["good, not bad", "<m>, not bad", "good, <m> <m>", "<m>, <m> <m>"]


def test_deleting_a_subword_token_keeps_words_apart() -> None:
    text = "was terrible."
    pieces = [Span("was", 0, 3), Span("terr", 4, 8), Span("ible", 8, 12), Span(".", 12, 13)]
    fake = Recorder()
    TextGame(fake, text, pieces)(rows("1011", "1101", "1001", "0111"))
    assert fake.seen == ["was ible.", "was terr.", "was .", "terrible."]


def test_game_batches_and_predicts_duplicates_once() -> None:
    text = "very very good"
    fake = Recorder()
    game = TextGame(fake, text, word_spans(text), max_rows=3)
    masks = all_masks(3)  # 8 coalitions; "very good" twice, "very" twice
    values = game(masks)
    assert values.shape == (8, 2)
    assert sorted(fake.seen) == sorted(set(fake.seen)) and len(fake.seen) == 6
    assert [len(c) for c in fake.calls] == [3, 3]
    assert values[0b011, 0] == values[0b110, 0] == len("very very")


def test_bad_pieces_and_options() -> None:
    with pytest.raises(OptionError):
        TextGame(Recorder(), "ab", [])
    with pytest.raises(OptionError):
        TextGame(Recorder(), "ab", [Span("b", 1, 2), Span("a", 0, 1)])
    with pytest.raises(OptionError):
        TextGame(Recorder(), "ab", [Span("ab", 0, 2)], absence="blur")


def _top_word(model: TextModel, text: str, absence: str) -> tuple[str, str]:
    result = explain(model, np.array([text]), options=ShapleyOptions(absence=absence))  # type: ignore[arg-type]
    e = result.explanations[0]
    assert e.players is not None and e.exact
    return model.output_names[e.output_index], e.players[int(np.argmax(e.values))].text


@pytest.mark.parametrize("absence", ["delete", "mask"])
@pytest.mark.parametrize(
    ("text", "label", "word"),
    [
        ("the movie was terrible", "negative", "terrible"),
        ("the food was delicious", "positive", "delicious"),
    ],
)
def test_the_sentiment_word_gets_the_top_value(
    model: TextModel, absence: str, text: str, label: str, word: str
) -> None:
    assert _top_word(model, text, absence) == (label, word)


def test_exact_shapley_on_text_is_efficient(model: TextModel) -> None:
    text = "the plot was dull, the cast shone"
    game = text_games(model, [text])[0]
    assert game.n_players == 7
    est = shapley_values(game, game.n_players, estimator="exact")
    assert est.exact and est.n_evaluations == 2**7
    full = model.predict([text])[0]
    empty = model.predict([game.compose(np.zeros(7, bool))])[0]
    assert game.compose(np.zeros(7, bool)) == ", "  # punctuation is not a player
    np.testing.assert_allclose(est.full_value, full, atol=1e-5)
    np.testing.assert_allclose(est.base_value, empty, atol=1e-5)
    np.testing.assert_allclose(est.values.sum(axis=0) + est.base_value, est.full_value, atol=1e-9)


def test_every_estimator_and_index_runs_on_the_text_game(model: TextModel) -> None:
    text = "a truly awful and boring film"
    game = text_games(model, [text], players="tokens", absence="mask")[0]
    n = game.n_players
    exact = shapley_values(game, n, estimator="exact").values[:, 0]
    for estimator in ("permutation", "kernel"):
        est = shapley_values(game, n, estimator=estimator, budget=40, seed=1)
        assert not est.exact and est.n_evaluations <= 40
        assert abs(est.values[:, 0].sum() - exact.sum()) < 1e-6  # both end at v(N) - v(empty)
    for index in ("k-SII", "STII", "FSII"):
        res = interaction_values(game, n, index=index, max_order=2, output=0)
        assert res.exact and res.efficiency_gap < 1e-8
        assert res.interactions is not None and len(res.values) == n
        assert len(res.interactions) == n + n * (n - 1) // 2


def test_explain_options_fit_the_modality(model: TextModel) -> None:
    texts = np.array(["nice", "a bad day"])
    result = explain(model, texts, options=ShapleyOptions(players="tokens", absence="mask"))
    assert result.player_names == ()
    assert [len(e.values) for e in result.explanations] == [1, 3]
    assert result.parameters["mask_token"] == "[MASK]"
    assert "masker" not in result.parameters and "patch_size" not in result.parameters
    assert result.budget == 8  # 2^3 for the longest text, so both are exact
    assert all(e.exact for e in result.explanations)
    with pytest.raises(OptionError, match="masker"):
        explain(
            model, texts, options=ShapleyOptions.model_validate({"masker": {"type": "baseline"}})
        )
    with pytest.raises(OptionError, match="no words"):
        explain(model, np.array(["?!"]), options=ShapleyOptions())
    with pytest.raises(OptionError, match="background"):
        explain(model, texts, options=ShapleyOptions(), background=np.zeros((1, 1)))


def test_text_options_are_refused_for_tabular_models() -> None:
    tabular = Model(
        name="lin",
        modality="tabular",
        task="regression",
        input_shape=(2,),
        feature_names=("a", "b"),
        output_names=("y",),
        module=torch.nn.Linear(2, 1).eval(),
        background=np.zeros((1, 2), np.float32),
    )
    with pytest.raises(OptionError, match="text models only"):
        explain(tabular, np.zeros((1, 2), np.float32), options=ShapleyOptions(players="tokens"))
    plain = explain(tabular, np.zeros((1, 2), np.float32), options=ShapleyOptions())
    assert "players" not in plain.parameters and "absence" not in plain.parameters
    assert plain.explanations[0].players is None
