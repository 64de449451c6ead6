"""COCOA: the contrastive target against its pairwise definition, corpus = foil gives 0, swapping
corpus and foil negates, exact patch Shapley against an enumeration, IG completeness, the mean
embedding cache, and a text explicand whose corpus-topic word comes out on top."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from explainers import cocoa
from explainers.cocoa import CocoaOptions, pairwise_score
from explainers.context import RunContext
from explainers.explanation import OptionError
from models.base import Model, TextModel
from models.builtin.encoders import load_digits_encoder, load_minilm_encoder
from models.builtin.trained import dataset_split


@pytest.fixture(scope="module")
def digits(model_dir: Path) -> Model:
    return load_digits_encoder(model_dir)


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    split = dataset_split("digits-cnn")
    return {
        "corpus": split.x_train[split.y_train == 3][:40],
        "foil": split.x_train[split.y_train != 3][:200],
        "x": split.x_test[split.y_test == 3][:2],
        "other": split.x_test[split.y_test == 0][:1],
    }


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def set(self, key: str, value: str) -> None:
        self.data[key] = value


class DeadStore:
    def get(self, key: str) -> str | None:
        raise ConnectionError("down")

    def set(self, key: str, value: str) -> None:
        raise ConnectionError("down")


def _run(model: Model, x: Any, corpus: Any, foil: Any, **opts: Any) -> cocoa.ExplainResult:
    store = opts.pop("store", None)
    budget = opts.pop("budget", None)
    return cocoa.explain(
        model,
        x,
        options=CocoaOptions(**opts),
        corpus=corpus.tolist() if isinstance(corpus, np.ndarray) else corpus,
        foil=foil.tolist() if isinstance(foil, np.ndarray) else foil,
        budget=budget,
        context=RunContext(store=store),
    )


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_mean_and_pairwise_implementations_agree(
    digits: Model, data: dict[str, np.ndarray], similarity: str
) -> None:
    x = np.concatenate([data["x"], data["other"]])
    res = _run(digits, x, data["corpus"], data["foil"], similarity=similarity, patch_size=4)
    pair = pairwise_score(digits, x, data["corpus"], data["foil"], similarity)
    got = [e.instance_output_value for e in res.explanations]
    np.testing.assert_allclose(got, pair, rtol=1e-5, atol=1e-6)
    assert got[0] > 0 and got[0] > got[2]  # a 3 is closer to the corpus of 3s than a 0 is
    details = [e.details["contrastive_similarity"] for e in res.explanations]  # type: ignore[index]
    np.testing.assert_allclose(details, pair, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["shapley", "integrated_gradients"])
def test_score_is_zero_when_corpus_equals_foil(
    digits: Model, data: dict[str, np.ndarray], method: str
) -> None:
    res = _run(digits, data["x"], data["corpus"], data["corpus"], method=method, patch_size=4)
    for e in res.explanations:
        assert e.instance_output_value == 0.0 and e.base_value == 0.0
        assert np.all(e.values == 0.0)


def test_swapping_corpus_and_foil_negates_integrated_gradients(
    digits: Model, data: dict[str, np.ndarray]
) -> None:
    kw = {"method": "integrated_gradients", "baseline": "blur"}
    a = _run(digits, data["x"], data["corpus"], data["foil"], **kw)
    b = _run(digits, data["x"], data["foil"], data["corpus"], **kw)
    assert a.player_names == digits.feature_names
    for ea, eb in zip(a.explanations, b.explanations, strict=True):
        assert np.abs(ea.values).max() > 1e-3
        np.testing.assert_allclose(ea.values, -eb.values, rtol=1e-5, atol=1e-6)  # float32
        # completeness of IG on s: the values add up to s(x) - s(baseline)
        gap = ea.values.sum() - (ea.instance_output_value - ea.base_value)
        assert abs(gap) < 0.02 * abs(ea.instance_output_value - ea.base_value) + 1e-4


def test_gp_patch_shapley_is_close_to_exact(digits: Model, data: dict[str, np.ndarray]) -> None:
    """COCOA's game through the sampled estimators (16 patches, 4n coalitions): gp is efficient,
    near the exact values and within its error bars for most patches."""
    x = data["x"][0][None]
    exact = _run(digits, x, data["corpus"], data["foil"], patch_size=2, estimator="exact")
    gp = _run(digits, x, data["corpus"], data["foil"], patch_size=2, estimator="gp", budget=64)
    e, g = exact.explanations[0], gp.explanations[0]
    assert not g.exact and g.n_model_evals <= 64 and g.error_std is not None
    assert g.values.sum() == pytest.approx(e.values.sum(), abs=1e-6)
    assert np.corrcoef(g.values, e.values)[0, 1] > 0.9
    assert np.mean(np.abs(g.values - e.values) <= 2 * g.error_std + 1e-9) >= 0.75


def test_exact_patch_shapley_matches_enumeration(
    digits: Model, data: dict[str, np.ndarray]
) -> None:
    x = data["x"][0]
    res = _run(digits, x[None], data["corpus"], data["foil"], patch_size=4, estimator="exact")
    e = res.explanations[0]
    assert res.player_names == ("patch_0_0", "patch_0_1", "patch_1_0", "patch_1_1")
    assert e.exact and e.n_model_evals == 16
    swapped = _run(digits, x[None], data["foil"], data["corpus"], patch_size=4, estimator="exact")
    np.testing.assert_allclose(swapped.explanations[0].values, -e.values, rtol=1e-5, atol=1e-6)

    def v(present: tuple[int, ...]) -> float:
        img = np.zeros_like(x)
        for p in present:
            r, c = divmod(p, 2)
            img[:, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = x[
                :, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4
            ]
        e = digits.predict(img[None]).astype(np.float64)[0]
        e /= np.linalg.norm(e)
        return float((ec @ e).mean() - (ef @ e).mean())

    ec, ef = (digits.predict(data[k]).astype(np.float64) for k in ("corpus", "foil"))
    ec /= np.linalg.norm(ec, axis=1, keepdims=True)
    ef /= np.linalg.norm(ef, axis=1, keepdims=True)

    expected = np.zeros(4)
    for i in range(4):
        others = [j for j in range(4) if j != i]
        for size in range(4):
            for s in itertools.combinations(others, size):
                w = math.factorial(size) * math.factorial(3 - size) / math.factorial(4)
                expected[i] += w * (v((*s, i)) - v(s))
    np.testing.assert_allclose(e.values, expected, atol=1e-5)


def test_targets_for_comparison(digits: Model, data: dict[str, np.ndarray]) -> None:
    x = data["x"][:1]
    own = _run(digits, x, data["corpus"], data["foil"], objective="explicand", patch_size=4)
    assert own.explanations[0].instance_output_value == pytest.approx(1.0)  # cos(f(x), f(x))
    plain = _run(digits, x, data["corpus"], data["foil"], objective="corpus", patch_size=4)
    d = plain.explanations[0].details
    assert d is not None
    assert plain.explanations[0].instance_output_value == pytest.approx(d["corpus_similarity"])
    assert d["corpus_similarity"] - d["foil_similarity"] == pytest.approx(
        d["contrastive_similarity"]
    )


def test_mean_embeddings_are_cached(digits: Model, data: dict[str, np.ndarray]) -> None:
    store = DictStore()
    first = _run(digits, data["x"][:1], data["corpus"], data["foil"], patch_size=4, store=store)
    assert (
        first.meta["corpus"]["embedding_cache"] == "miss" == first.meta["foil"]["embedding_cache"]
    )
    assert len(store.data) == 2
    second = _run(digits, data["x"][1:], data["corpus"], data["foil"], patch_size=4, store=store)
    assert (
        second.meta["corpus"]["embedding_cache"] == "hit" == second.meta["foil"]["embedding_cache"]
    )
    again = _run(digits, data["x"][1:], data["corpus"], data["foil"], patch_size=4)
    np.testing.assert_array_equal(second.explanations[0].values, again.explanations[0].values)
    dead = _run(
        digits, data["x"][:1], data["corpus"], data["foil"], patch_size=4, store=DeadStore()
    )
    assert dead.meta["corpus"]["embedding_cache"] == "none"
    np.testing.assert_array_equal(dead.explanations[0].values, first.explanations[0].values)


def test_auto_foil_is_seeded_and_excludes_the_corpus(
    digits: Model, data: dict[str, np.ndarray]
) -> None:
    assert digits.reference is not None
    corpus = digits.reference[:300]
    a = _run(digits, data["x"][:1], corpus, "auto", foil_size=500, patch_size=4)
    b = _run(digits, data["x"][:1], corpus, "auto", foil_size=500, patch_size=4)
    assert a.meta["foil"] == {"source": "auto", "rows": 500, "seed": 0, "embedding_cache": "none"}
    assert a.explanations[0].instance_output_value == b.explanations[0].instance_output_value
    foil = cocoa._auto_foil(digits, corpus, 500, 0)
    corpus_rows = {r.tobytes() for r in corpus}
    assert not any(r.tobytes() in corpus_rows for r in foil)


def test_errors(digits: Model, data: dict[str, np.ndarray], model_dir: Path) -> None:
    from models.builtin.trained import load_digits_cnn

    with pytest.raises(OptionError, match="encoders"):
        _run(load_digits_cnn(model_dir), data["x"], data["corpus"], data["foil"])
    with pytest.raises(OptionError, match="target"):
        cocoa.explain(
            digits, data["x"], options=CocoaOptions(), corpus=data["corpus"].tolist(), target=1
        )
    with pytest.raises(OptionError, match="corpus\\[1\\]"):
        _run(digits, data["x"], [data["corpus"][0].tolist(), [1.0, 2.0]], data["foil"])
    with pytest.raises(OptionError, match="foil"):
        _run(digits, data["x"], data["corpus"], [])
    with pytest.raises(OptionError, match="text encoders only"):
        _run(digits, data["x"], data["corpus"], data["foil"], players="tokens")


@pytest.fixture(scope="module")
def minilm() -> TextModel:
    return load_minilm_encoder(Path("."))


FOOD = [
    "The chef baked fresh bread and a cheese pizza.",
    "We cooked pasta with tomato sauce for dinner.",
    "This restaurant serves delicious soup and salad.",
    "She bought vegetables and fruit to make a stew.",
    "Grilled chicken with rice is my favourite meal.",
]
SPORT = [
    "The team won the football match in extra time.",
    "He runs a marathon every spring.",
    "The tennis player served an ace to win the set.",
    "Our club trains for the swimming championship.",
    "The referee stopped the basketball game.",
]


def test_text_word_tied_to_the_corpus_topic_comes_out_on_top(
    minilm: TextModel, one_torch_thread: None
) -> None:
    x = np.array(["We discussed pizza at the meeting."])
    res = _run(minilm, x, FOOD, SPORT)
    e = res.explanations[0]
    assert e.exact and e.players is not None and res.player_names == ()
    words = [p.text for p in e.players]
    assert words[int(np.argmax(e.values))] == "pizza"
    assert e.instance_output_value > 0
    assert e.values.sum() + e.base_value == pytest.approx(e.instance_output_value)
    swapped = _run(minilm, x, SPORT, FOOD)
    np.testing.assert_allclose(swapped.explanations[0].values, -e.values, rtol=1e-5, atol=1e-6)
    with pytest.raises(OptionError, match="integrated_gradients"):
        _run(minilm, x, FOOD, SPORT, method="integrated_gradients")
    auto = _run(minilm, x, FOOD, "auto", estimator="kernel", budget=64)
    assert auto.meta["foil"]["rows"] == len(minilm.reference)  # type: ignore[arg-type]


@pytest.mark.parametrize("baseline", ["zero", "blur"])
def test_integrated_gradients_equals_captum(
    digits: Model, data: dict[str, np.ndarray], baseline: str
) -> None:
    """cocoa's IG branch runs explainers/gradients/integrated.py; captum on the same model and
    inputs."""
    torch = pytest.importorskip("torch")
    captum_attr = pytest.importorskip("captum.attr")
    normalize = True
    mu_c, _ = cocoa.mean_embedding(digits, data["corpus"], normalize)
    mu_f, _ = cocoa.mean_embedding(digits, data["foil"], normalize)
    target = cocoa.Target(mu_c - mu_f, normalize)
    options = CocoaOptions(method="integrated_gradients", baseline=baseline, steps=32)
    x = data["x"][0]
    base = cocoa._baseline(digits, x, options)
    ours = cocoa._integrated_gradients(digits, x, base, target, options.steps)

    def forward(inp: Any) -> Any:
        return target.torch(digits.module(inp).reshape(inp.shape[0], -1))

    xt = torch.as_tensor(x[None], dtype=torch.float32)
    bt = torch.as_tensor(base[None], dtype=torch.float32)
    with torch.enable_grad():
        ig = captum_attr.IntegratedGradients(forward)
        theirs = ig.attribute(xt, baselines=bt, n_steps=options.steps, method="gausslegendre")
    theirs = theirs.detach().double().numpy().reshape(-1)
    assert np.abs(theirs).max() > 1e-3
    # float32 forward/backward passes in both; captum sums in float32, ours in float64
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max())
