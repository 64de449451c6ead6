"""Evaluation metrics on cases with known answers: orderings, exact Shapley, closed-form noise."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from explainers.explanation import Explanation, OptionError
from explainers.games.masked import MaskedModelGame
from explainers.gradients.integrated import IntegratedGradientsOptions
from explainers.gradients.integrated import explain as ig_explain
from explainers.shapley.explainer import MaskerOptions, ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from explainers.trust.evaluation import (
    EvaluateOptions,
    evaluate,
    evaluate_result,
    faithfulness,
    max_sensitivity,
)
from models.base import Model, TextModel
from models.builtin.trained import dataset_split, load_digits_cnn


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs (see tests/conftest.py)."""


W = np.array([3.0, -1.0, 0.5, 2.0, -2.5])


def linear_model() -> Model:
    layer = nn.Linear(len(W), 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(W, dtype=torch.float32)[None])
        layer.bias.fill_(0.3)
    bg = np.random.default_rng(0).normal(size=(30, len(W))).astype(np.float32)
    names = tuple(f"x{i}" for i in range(len(W)))
    return Model("lin", "tabular", "regression", (len(W),), names, ("y",), layer.eval(), bg)


X = np.array([[1.0, 2.0, -1.0, 0.5, 1.5]], dtype=np.float32)


def test_perfect_ordering_is_best_and_reversed_is_worst() -> None:
    model = linear_model()
    base = model.background.mean(axis=0)  # type: ignore[union-attr]
    game = MaskedModelGame(model.predict, X[0], base[None])
    truth = W * (X[0] - base)  # each feature's exact contribution under mean removal
    opts = EvaluateOptions(metrics=["deletion", "insertion"])
    rng = np.random.default_rng(0)
    results = {}
    for perm in itertools.permutations(range(len(W))):
        scores = np.empty(len(W))
        scores[list(perm)] = np.arange(len(W), 0, -1)  # perm[0] ranked first
        results[perm] = faithfulness(game, scores, 0, opts, rng)
    best = tuple(np.argsort(-truth))
    worst = best[::-1]
    deletions = {p: r["deletion_auc"] for p, r in results.items()}
    insertions = {p: r["insertion_auc"] for p, r in results.items()}
    assert deletions[best] == pytest.approx(min(deletions.values()))
    assert deletions[worst] == pytest.approx(max(deletions.values()))
    assert insertions[best] == pytest.approx(max(insertions.values()))
    assert insertions[worst] == pytest.approx(min(insertions.values()))
    # the curve's end points are f(x) and f(baseline): deletion of the true order by hand
    fx, fb = float(model.predict(X)[0, 0]), float(model.predict(base[None])[0, 0])
    points = fx - np.concatenate([[0], np.cumsum(np.sort(truth)[::-1])])
    assert points[-1] == pytest.approx(fb, abs=1e-5)
    want = np.trapezoid(points, np.linspace(0, 1, len(W) + 1))
    assert deletions[best] == pytest.approx(want, abs=1e-5)


def test_mufidelity_of_exact_shapley_on_linear_model_is_one() -> None:
    model = linear_model()
    options = ShapleyOptions(estimator="exact", masker=MaskerOptions(type="baseline"))
    res = shapley_explain(model, X, options=options)
    assert res.explanations[0].exact
    figures, echo = evaluate(
        model, X, res.explanations, EvaluateOptions(metrics=["mufidelity"]), seed=1
    )
    assert figures[0]["mufidelity"] == pytest.approx(1.0, abs=1e-9)
    assert echo["removal"] == "mean" and echo["n_subsets"] == 128
    # a wrong explanation is visibly less faithful
    wrong = Explanation(0, W[::-1].copy(), 0.0, 0.0, False, 0, "x")
    bad, _ = evaluate(model, X, [wrong], EvaluateOptions(metrics=["mufidelity"]), seed=1)
    assert bad[0]["mufidelity"] < 0.9


def test_sensitivity_closed_form_for_ig_on_linear_model() -> None:
    model = linear_model()
    zero = IntegratedGradientsOptions(baseline="zero", steps=4)
    values = ig_explain(model, X, options=zero).explanations[0].values  # w * x

    def rerun(xs: np.ndarray, out: int) -> np.ndarray:
        again = ig_explain(model, xs, options=zero, target=out).explanations
        return np.stack([e.values for e in again])

    opts = EvaluateOptions(n_perturbations=5, radius=0.1)
    got = max_sensitivity(rerun, 0, X[0], values, np.ones(5), opts, np.random.default_rng(7))
    noise = np.random.default_rng(7).uniform(-0.1, 0.1, (5, 5)).astype(np.float32)
    ratios = np.linalg.norm(W * noise, axis=1) / np.linalg.norm(values)
    assert got["max"] == pytest.approx(ratios.max(), rel=1e-4)
    assert got["mean"] == pytest.approx(ratios.mean(), rel=1e-4)


def test_evaluate_result_on_image_patches_and_pixels(model_dir: Path) -> None:
    model = load_digits_cnn(model_dir)
    x = dataset_split("digits-cnn").x_test[:2]
    options = ShapleyOptions(estimator="exact", patch_size=4)
    res = shapley_explain(model, x, options=options)

    def rerun(xs: np.ndarray, out: int) -> np.ndarray:
        again = shapley_explain(model, xs, options=options, target=out)
        return np.stack([e.values for e in again.explanations])

    opts = EvaluateOptions(curves=True, n_perturbations=2)
    scored = evaluate_result(model, x, res, opts, rerun=rerun)
    meta = scored.meta["evaluation"]
    assert meta["parameters"]["removal"] == "zero" and "blur_sigma" not in meta["parameters"]
    for e in scored.explanations:
        f = e.details["evaluation"]  # type: ignore[index]
        assert set(f) >= {"deletion_auc", "insertion_auc", "mufidelity", "sensitivity"}
        assert len(f["deletion_curve"]["score"]) == 5  # 4 patches: 0..4 removed
        assert f["deletion_curve"]["score"][0] == pytest.approx(e.instance_output_value, abs=1e-6)
        assert f["insertion_minus_deletion"] > 0  # exact patch Shapley beats random order
        assert f["mufidelity"] > 0.5
    # IG per pixel on the same images: 64 players
    ig = ig_explain(model, x, options=IntegratedGradientsOptions(steps=8))
    blur = EvaluateOptions(metrics=["deletion"], removal="blur")
    figures, echo = evaluate(model, x, ig.explanations, blur)
    assert figures[0]["n_model_evals"] == 1 + 51  # full row + 51 curve points (64 players)
    assert echo["blur_sigma"] == 2.0
    with pytest.raises(OptionError):  # 4 values, no patch size: cannot map to pixels
        evaluate(model, x, res.explanations, EvaluateOptions(metrics=["deletion"]))
    with pytest.raises(OptionError):
        evaluate(model, x, ig.explanations, EvaluateOptions())  # sensitivity needs a rerun


def test_text_explanations_are_evaluated_by_deleting_words() -> None:
    def predict(texts: list[str]) -> np.ndarray:
        good = np.array([t.split().count("good") - t.split().count("bad") for t in texts])
        return np.stack([-good, good], axis=1).astype(np.float32)

    model = TextModel(
        name="toy", modality="text", task="classification", input_shape=(),
        feature_names=(), output_names=("neg", "pos"), module=nn.Identity(),
        predict_texts=predict, token_spans=lambda t: [],
    )  # fmt: skip
    texts = np.array(["a good day , not bad but good"])
    res = shapley_explain(model, texts, options=ShapleyOptions(estimator="exact"), target=1)
    figures, echo = evaluate(
        model, texts, res.explanations, EvaluateOptions(metrics=["deletion", "mufidelity"])
    )
    assert echo["removal"] == "delete"
    assert figures[0]["mufidelity"] == pytest.approx(1.0)
    with pytest.raises(OptionError):
        evaluate(model, texts, res.explanations, EvaluateOptions(), rerun=lambda xs, o: xs)
