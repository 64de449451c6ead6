"""The `autognothi` explainer: its stored artifact, pinning, the players of `shapley` and
efficiency (a tiny side network trained on sentiment-minilm)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from explainers.amortized.autognothi import corpus as autognothi_corpus
from explainers.amortized.autognothi import explainer as autognothi
from explainers.amortized.autognothi import net as autognothi_net
from explainers.amortized.autognothi import train as autognothi_train
from explainers.context import Artifacts, NotTrainedError, RunContext
from explainers.explanation import OptionError
from explainers.shapley.explainer import ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from tests.explainers.autognothi_setup import TEXTS, TINY

# One torch thread, as in the service's job workers: much faster on a shared CPU.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_values_add_up_and_use_shapleys_players(
    text_model: Any, tiny: autognothi_train.Trained, tmp_path: Path
) -> None:
    context = RunContext(artifacts=Artifacts(tmp_path))
    store = autognothi.store_of(context.need_artifacts("autognothi"))
    info = store.save(text_model, tiny)
    assert info.id == tiny.id and info.model_version == text_model.version
    options = autognothi.PIN.bind(text_model, autognothi.AutoGnothiOptions(), context)
    assert options.artifact == tiny.id
    inputs = np.array(TEXTS, dtype=object)
    result = autognothi.explain(text_model, inputs, options=options, context=context)
    exact = shapley_explain(
        text_model, inputs, options=ShapleyOptions(estimator="exact"), budget=2**10
    )
    probs = text_model.predict_texts(TEXTS)
    for ours, truth, p in zip(result.explanations, exact.explanations, probs, strict=True):
        assert ours.players == truth.players
        assert ours.values.shape == truth.values.shape
        assert ours.output_index == truth.output_index == int(np.argmax(p))
        np.testing.assert_allclose(ours.base_value, truth.base_value, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            ours.instance_output_value, truth.instance_output_value, rtol=1e-5, atol=1e-6
        )
        total = ours.values.sum() + ours.base_value
        np.testing.assert_allclose(total, ours.instance_output_value, rtol=1e-5, atol=1e-6)
    other = autognothi.explain(text_model, inputs, options=options, target=0, context=context)
    for a, b in zip(result.explanations, other.explanations, strict=True):
        if a.output_index == 1:  # two classes: the other class's values are the negatives
            np.testing.assert_allclose(b.values, -a.values, rtol=1e-5, atol=1e-6)
    # A second store over the same folder loads the same network from disk.
    autognothi.AutoGnothiStore._loaded.clear()
    loaded = autognothi.AutoGnothiStore(store.root).load(text_model, tiny.id)
    assert loaded is not tiny
    for x, y in zip(
        autognothi.amortized(text_model, loaded, TEXTS).values,
        autognothi.amortized(text_model, tiny, TEXTS).values,
        strict=True,
    ):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_no_artifact_is_a_clear_error(text_model: Any, tmp_path: Path) -> None:
    context = RunContext(artifacts=Artifacts(tmp_path))
    with pytest.raises(NotTrainedError, match="no trained AutoGnothi"):
        autognothi.PIN.bind(text_model, autognothi.AutoGnothiOptions(), context)
    with pytest.raises(NotTrainedError):
        autognothi.PIN.bind(
            text_model, autognothi.AutoGnothiOptions(artifact="0123456789abcdef"), context
        )
    with pytest.raises(NotTrainedError):  # options not bound to an artifact
        autognothi.explain(
            text_model, np.array(TEXTS), options=autognothi.AutoGnothiOptions(), context=context
        )


def test_bad_inputs_are_option_errors(
    text_model: Any, tiny: autognothi_train.Trained, tmp_path: Path
) -> None:
    context = RunContext(artifacts=Artifacts(tmp_path))
    autognothi.store_of(context.need_artifacts("autognothi")).save(text_model, tiny)
    options = autognothi.PIN.bind(text_model, autognothi.AutoGnothiOptions(), context)
    with pytest.raises(OptionError, match="no words"):
        autognothi.explain(text_model, np.array(["...", "ok"]), options=options, context=context)
    with pytest.raises(OptionError, match="target"):
        autognothi.explain(text_model, np.array(TEXTS), options=options, target=2, context=context)
    with pytest.raises(OptionError, match="background"):
        autognothi.explain(
            text_model, np.array(TEXTS), options=options, background=np.zeros(1), context=context
        )
    wrapped = dataclasses.replace(text_model, predict_texts=lambda t: text_model.predict_texts(t))
    with pytest.raises(OptionError, match="BERT-encoder"):
        autognothi.explain(wrapped, np.array(TEXTS), options=options, context=context)


def test_a_batch_equals_one_text_at_a_time(text_model: Any, tiny: autognothi_train.Trained) -> None:
    """More texts than one encoder pass takes (chunks of CHUNK), of different lengths: padding
    and chunking change nothing beyond float32 rounding."""
    words = ["awful", "lovely", "dull", "superb", "rude"]
    texts = [
        " ".join(["The", words[i % 5], "meal", *["was", "very", "good"][: i % 4]]) + "."
        for i in range(autognothi.CHUNK + 4)
    ]
    batch = autognothi.amortized(text_model, tiny, texts)
    assert len(batch.values) == len(texts) and batch.full.shape == (len(texts), 2)
    for i, text in enumerate(texts):
        one = autognothi.amortized(text_model, tiny, [text])
        np.testing.assert_allclose(one.values[0], batch.values[i], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(one.full[0], batch.full[i], rtol=1e-5, atol=1e-6)


def test_inputs_outside_the_training_range_warn(
    text_model: Any, tiny: autognothi_train.Trained, tmp_path: Path
) -> None:
    """A 30-word review (three times the longest training sentence) and a sentence of unseen
    words answer with outside_training_range; a training sentence does not. The range survives
    the store; an artifact without one says its range is unknown."""
    context = RunContext(artifacts=Artifacts(tmp_path))
    store = autognothi.store_of(context.need_artifacts("autognothi"))
    store.save(text_model, tiny)
    autognothi.AutoGnothiStore._loaded.clear()
    loaded = autognothi.AutoGnothiStore(store.root).load(text_model, tiny.id)
    assert loaded.range == tiny.range and tiny.range is not None
    vocabulary = frozenset(autognothi_net.runner(text_model).tokenizer.get_vocab())
    seen = autognothi_corpus.sentences(TINY["sentences"], TINY["seed"], False, 10, vocabulary)
    review = autognothi_corpus.check_reviews(1, 0, 30, vocabulary)[0]
    unseen = "Quarterly spreadsheets bewildered accountants yesterday."
    options = autognothi.PIN.bind(text_model, autognothi.AutoGnothiOptions(), context)
    inputs = np.array([seen[0], review, unseen], dtype=object)
    result = autognothi.explain(text_model, inputs, options=options, context=context)
    codes = [[w.code for w in e.warnings] for e in result.explanations]
    assert codes == [[], ["outside_training_range"], ["outside_training_range"]]
    assert f"longest training sentence {tiny.range.max_words} words" in (
        result.explanations[1].warnings[0].message
    )
    assert "5 of its 5 words never appear" in result.explanations[2].warnings[0].message
    old = dataclasses.replace(tiny, range=None)
    assert autognothi.range_warnings(old, ["fine"], 3) == (autognothi_train.UNKNOWN_RANGE,)
