"""sentiment-minilm: offline loading, zero-shot accuracy, batching, versions, peer encoder."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models import BUILTINS, TextModel
from models.builtin import text as text_model
from models.builtin.text import CHECK_SET, load_sentiment_minilm


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Text tests run on one torch thread (see tests/conftest.py)."""


@pytest.fixture()
def model(text_model: TextModel) -> TextModel:
    return text_model


def test_loads_offline_and_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network access while loading: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    rng_state = torch.random.get_rng_state()
    start = time.perf_counter()
    model = load_sentiment_minilm(tmp_path)
    elapsed = time.perf_counter() - start
    assert elapsed < 15.0  # ~0.3 s warm, ~2 s cold on a two-core machine
    assert list(tmp_path.iterdir()) == []  # nothing written: the weights ship with the package
    assert torch.equal(torch.random.get_rng_state(), rng_state)
    assert model.info["load_seconds"] > 0


def test_metadata(model: TextModel) -> None:
    assert (model.name, model.modality, model.task) == (
        "sentiment-minilm",
        "text",
        "classification",
    )
    assert model.output_names == ("negative", "positive")
    assert model.input_shape == () and model.feature_names == ()
    assert model.background is None and model.reference is None
    assert len(model.version) == 16 and int(model.version, 16) >= 0
    assert not model.torch_module().training
    assert model.info["prompts"] == text_model.PROMPTS
    assert model.info["temperature"] == text_model.TEMPERATURE
    entry = next(b for b in BUILTINS if b.name == "sentiment-minilm")
    assert entry.modality == "text"


def test_zero_shot_accuracy_on_the_handmade_set(model: TextModel) -> None:
    texts = [t for t, _ in CHECK_SET]
    labels = np.array([y for _, y in CHECK_SET])
    accuracy = float((model.predict(texts).argmax(axis=1) == labels).mean())
    assert len(CHECK_SET) >= 20 and accuracy >= 0.85
    assert model.info["check_set"] == {"sentences": len(CHECK_SET), "accuracy": accuracy}
    prompts = {p for ps in text_model.PROMPTS.values() for p in ps}
    assert not prompts & set(texts)  # the check set is not the prompts


def test_predict_probabilities_and_batching(model: TextModel) -> None:
    texts = [t for t, _ in CHECK_SET] + ["", "[MASK] was [MASK]", "word " * 200]
    out = model.predict(texts)
    assert out.shape == (len(texts), 2) and out.dtype == np.float32
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)
    one_by_one = np.concatenate([model.predict([t]) for t in texts])
    np.testing.assert_allclose(one_by_one, out, atol=1e-5)  # padding does not leak
    np.testing.assert_allclose(model.predict(np.array(texts[:3])), out[:3], atol=1e-6)
    assert model.predict([]).shape[0] == 0


def test_predict_splits_long_batches(model: TextModel, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    module = model.torch_module()
    real_forward = module.forward

    def counting(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(ids.shape))
        return real_forward(ids, mask)

    monkeypatch.setattr(module, "forward", counting)
    texts = [f"text number {i} is {'very ' * (i % 7)}fine" for i in range(150)]
    out = model.predict(texts)
    assert out.shape == (150, 2)
    assert sum(rows for rows, _ in calls) == 150
    assert max(rows for rows, _ in calls) <= text_model.BATCH_SIZE
    assert all(rows * width <= text_model.TOKENS_PER_BATCH for rows, width in calls)


def test_version_covers_prompts_and_temperature(
    model: TextModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_sentiment_minilm(tmp_path).version == model.version
    monkeypatch.setattr(text_model, "TEMPERATURE", 0.1)
    assert load_sentiment_minilm(tmp_path).version != model.version
    monkeypatch.undo()
    prompts = {**text_model.PROMPTS, "positive": ("This is great.",)}
    monkeypatch.setattr(text_model, "PROMPTS", prompts)
    assert load_sentiment_minilm(tmp_path).version != model.version


def test_token_spans_are_character_offsets(model: TextModel) -> None:
    text = "The movie wasn't terrible!"
    spans = model.token_spans(text)
    assert [text[s:e] for s, e in spans] == ["The", "movie", "wasn", "'", "t", "terrible", "!"]


def test_encoder_matches_sentence_transformers(model: TextModel) -> None:
    st = pytest.importorskip("sentence_transformers")
    peer = st.SentenceTransformer(str(text_model.model_dir()), device="cpu", local_files_only=True)
    texts = [t for t, _ in CHECK_SET[:8]] + ["", "a " * 300]  # the last one is truncated
    runner = model.predict_texts.__self__  # type: ignore[attr-defined]
    ours = runner.embed(texts).numpy()
    np.testing.assert_allclose(ours, peer.encode(texts, batch_size=4), atol=1e-5)
