"""ONNX text classifiers (model.onnx + tokenizer.json): registered from an archive as a black-box
text classifier; word Shapley values equal exact enumeration through onnxruntime directly and
the safetensors version of the same model; refusals name what is wrong."""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from explainers.shapley.explainer import ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from models.adapters.checkpoint import archive_checkpoint
from models.adapters.hf import declare
from models.adapters.user import register
from models.base import TextModel
from models.declaration import InvalidModelError
from tests.models import hf_fixtures as fx
from tests.models import onnx_text_fixtures as ofx

SENTENCE = "a truly wonderful and moving film"


def registered(
    data: bytes, name: str = "onnx-clf", output_names: tuple[str, ...] | None = None
) -> TextModel:
    decl = declare(name, archive_checkpoint(data), output_names=output_names)
    model = register(decl, {"model": data})[0]
    assert isinstance(model, TextModel)
    return model


@pytest.fixture(scope="module")
def onnx_model() -> TextModel:
    return registered(ofx.archived())


def onnxruntime_probabilities(texts: list[str]) -> np.ndarray:
    """Softmax of model.onnx's logits, one text per session run (no padding), float64."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    folder = ofx.folder()
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        enc = tok(text, return_tensors="np")
        feed = {k: np.asarray(enc[k], dtype=np.int64) for k in ofx.INPUTS}
        logits = session.run(["logits"], feed)[0][0].astype(np.float64)
        z = np.exp(logits - logits.max())
        out.append(z / z.sum())
    return np.array(out)


def exact_word_shapley(words: list[str], target: int) -> np.ndarray:
    """Shapley values by enumerating every coalition (absent words deleted, the rest joined by
    spaces), each text run through onnxruntime directly."""
    n = len(words)
    coalitions = list(itertools.product([0, 1], repeat=n))
    texts = [" ".join(w for w, keep in zip(words, c, strict=True) if keep) for c in coalitions]
    value = dict(zip(coalitions, onnxruntime_probabilities(texts)[:, target], strict=True))
    phi = np.zeros(n)
    for c in coalitions:
        s = sum(c)
        for i in range(n):
            if not c[i]:
                weight = math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)
                with_i = tuple(1 if j == i else c[j] for j in range(n))
                phi[i] += weight * (value[with_i] - value[c])
    return phi


def test_registers_as_a_black_box_text_classifier(onnx_model: TextModel) -> None:
    assert onnx_model.modality == "text" and onnx_model.task == "classification"
    assert onnx_model.output_names == ("negative", "positive")  # config.json id2label
    assert onnx_model.platform == "onnx" and onnx_model.module is None
    assert not onnx_model.differentiable
    assert onnx_model.info["outputs"] == "softmax of 'logits'"
    texts = ["a truly wonderful film", "The plot made no sense, and the acting was bad.", "ok"]
    np.testing.assert_allclose(
        onnx_model.predict(texts), onnxruntime_probabilities(texts), atol=1e-6
    )
    spans = onnx_model.token_spans(texts[0])
    assert [texts[0][s:e] for s, e in spans] == ["a", "truly", "wonderful", "film"]
    assert onnx_model.mask_token == "[MASK]" and onnx_model.max_tokens == 510


def test_word_shapley_equals_enumeration_and_the_safetensors_model(
    onnx_model: TextModel,
) -> None:
    words = SENTENCE.split()
    options = ShapleyOptions(estimator="exact")
    ours = shapley_explain(onnx_model, np.array([SENTENCE]), options=options, target=1, budget=64)
    e = ours.explanations[0]
    assert e.exact and [p.text for p in e.players or ()] == words
    expected = exact_word_shapley(words, target=1)
    np.testing.assert_allclose(e.values, expected, atol=1e-5)
    assert np.abs(expected).max() > 1e-2  # the values are not all ~0

    data = fx.archived("classifier")
    torch_model = register(declare("st-clf", archive_checkpoint(data)), {"model": data})[0]
    theirs = shapley_explain(torch_model, np.array([SENTENCE]), options=options, target=1)
    np.testing.assert_allclose(e.values, theirs.explanations[0].values, atol=1e-5)
    np.testing.assert_allclose(e.base_value, theirs.explanations[0].base_value, atol=1e-5)


def test_labels_from_declaration_when_there_is_no_config(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    shutil.copytree(ofx.folder(), folder)
    (folder / "config.json").unlink()
    data = fx.archive(folder, "zip")
    with pytest.raises(InvalidModelError, match="send output_names"):
        declare("bare", archive_checkpoint(data))
    model = registered(data, "bare", output_names=("neg", "pos"))
    assert model.output_names == ("neg", "pos") and model.max_tokens == 510
    with pytest.raises(
        InvalidModelError, match=r"has \(2,\) values per text; the model declares 3"
    ):
        registered(data, "bare3", output_names=("a", "b", "c"))


def test_refusals_name_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(ofx.folder(), folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(InvalidModelError, match=r"needs its fast tokenizer's tokenizer\.json"):
        archive_checkpoint(fx.archive(folder))
    with pytest.raises(InvalidModelError, match=r"model\.onnx with a tokenizer is a text"):
        declare("m", archive_checkpoint(ofx.archived()), modality="lm")
    from models.adapters.onnx import OnnxModelError, onnx_predictor

    with pytest.raises(OnnxModelError, match=r"model\.onnx beside its tokenizer\.json"):
        decl = declare("m", archive_checkpoint(ofx.archived()))
        onnx_predictor((ofx.folder() / "model.onnx").read_bytes(), decl)
