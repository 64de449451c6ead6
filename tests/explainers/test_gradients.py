"""Integrated gradients: closed forms on linear models, completeness, captum, re-calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from explainers.explanation import OptionError
from explainers.games import BudgetError, ExplainerError
from explainers.gradients.integrated import (
    IntegratedGradientsOptions,
    NotDifferentiableError,
    explain,
    quadrature,
    recalibrated,
    score_function,
)
from models.base import Model
from models.builtin.trained import dataset_split


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs (see tests/conftest.py)."""


def linear_model(w: np.ndarray, b: float = 0.5) -> Model:
    layer = nn.Linear(len(w), 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(w, dtype=torch.float32)[None])
        layer.bias.fill_(b)
    names = tuple(f"x{i}" for i in range(len(w)))
    bg = np.random.default_rng(1).normal(size=(20, len(w))).astype(np.float32)
    return Model("lin", "tabular", "regression", (len(w),), names, ("y",), layer.eval(), bg)


@pytest.fixture(scope="module")
def digit_images() -> np.ndarray:
    return dataset_split("digits-cnn").x_test[:3]


@pytest.mark.parametrize(
    "baseline", ["zero", "constant", "supplied", "mean", "uniform", "gaussian", "expected"]
)
def test_linear_model_closed_form(baseline: str) -> None:
    w = np.array([1.0, -2.0, 0.5, 3.0])
    model = linear_model(w)
    x = np.array([[0.3, 1.2, -0.7, 2.0]], dtype=np.float32)
    value = {"constant": 0.25, "supplied": [1.0, 0.0, -1.0, 0.5]}.get(baseline)
    opts = IntegratedGradientsOptions(baseline=baseline, baseline_value=value, steps=4)
    res = explain(model, x, options=opts, seed=3)
    e = res.explanations[0]
    # w * (x - baseline), with the baseline(s) the explainer drew for this seed
    base = {
        "zero": np.zeros(4),
        "constant": np.full(4, 0.25),
        "supplied": np.array([1.0, 0.0, -1.0, 0.5]),
        "mean": model.background.mean(axis=0),  # type: ignore[union-attr]
    }
    if baseline in base:
        np.testing.assert_allclose(e.values, w * (x[0] - base[baseline]), atol=1e-5)
    else:  # drawn baselines: the attribution still sums to f(x) - mean f(baseline)
        assert res.parameters["n_baselines"] == 10
    assert e.approximation_error < 1e-5  # IG is exactly complete on a linear model
    assert res.additive and e.n_model_evals == res.budget


def test_completeness_gap_shrinks_with_steps(digits: Model, digit_images: np.ndarray) -> None:
    gaps = []
    for steps in (2, 8, 64):
        opts = IntegratedGradientsOptions(steps=steps, method="riemann_right")
        res = explain(digits, digit_images, options=opts)
        gaps.append(np.mean([e.approximation_error for e in res.explanations]))
        assert all(
            abs(e.details["completeness_gap"]) == pytest.approx(e.approximation_error)  # type: ignore[index]
            for e in res.explanations
        )
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.01


@pytest.mark.parametrize(
    "method", ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle"]
)
@pytest.mark.parametrize("output", ["probability", "logit"])
def test_equals_captum(digits: Model, digit_images: np.ndarray, method: str, output: str) -> None:
    from captum.attr import IntegratedGradients

    opts = IntegratedGradientsOptions(
        baseline="constant", baseline_value=0.1, steps=20, method=method, output=output
    )
    res = explain(digits, digit_images, options=opts)
    targets = [e.output_index for e in res.explanations]
    forward = digits.module if output == "probability" else digits.module[:-1]  # type: ignore[index]
    x = torch.tensor(digit_images)
    theirs = IntegratedGradients(forward).attribute(
        x, baselines=0.1, target=targets, n_steps=20, method=method
    )
    ours = np.stack([e.values for e in res.explanations])
    np.testing.assert_allclose(ours, theirs.reshape(len(x), -1).numpy(), atol=1e-5)


def test_trapezoid_is_textbook() -> None:
    alphas, weights = quadrature("riemann_trapezoid", 5)
    np.testing.assert_allclose(weights.sum(), 1.0)
    np.testing.assert_allclose(weights @ alphas, 0.5)  # exact for linear integrands
    np.testing.assert_allclose(weights @ alphas**2, 1 / 3 + 0.25**2 / 6)  # its error term


def test_recalibrated_matches_hand_computation() -> None:
    """valid_ip / valid_ref on f(x) = sum(x^2): gradient 2s at every point s."""
    model = linear_model(np.ones(3))

    def score(z: torch.Tensor) -> torch.Tensor:
        return (z**2).sum(dim=1, keepdim=True)

    x = np.array([1.0, -1.0, 0.5])
    refs = np.array([[0.0, 0.0, 0.0], [2.0, -2.0, 1.0]])
    k = 3
    t = np.linspace(0, 1, k)
    for variant in ("valid_ip", "valid_ref"):
        terms = []  # valid_ip: one term per point; valid_ref: one per reference (whole path)
        for r in refs:
            points = [r + tt * (x - r) for tt in t]
            if variant == "valid_ip":
                terms += [2 * s / k * (x - s) for s in points]
            else:
                terms.append(sum(2 * s / k for s in points) * (x - r))
        arr = np.array(terms)
        keep = arr >= 0
        want = np.where(keep, arr, 0).sum(0) / np.maximum(keep.sum(0), 1)
        got = recalibrated(score, x, refs, 0, k, variant)  # type: ignore[arg-type]
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert np.all(got >= 0)
    assert model.n_features == 3


def test_valid_ip_is_non_negative_and_not_additive(digits: Model, digit_images: np.ndarray) -> None:
    opts = IntegratedGradientsOptions(estimator="valid_ip", baseline="uniform", n_baselines=4)
    res = explain(digits, digit_images, options=opts, seed=1)
    assert not res.additive
    assert res.parameters["steps"] == 5 and "method" not in res.parameters
    for e in res.explanations:
        assert np.all(e.values >= 0) and e.values.sum() > 0
        assert e.n_model_evals == 4 * 5 + 4 + 1
    again = explain(digits, digit_images, options=opts, seed=1)
    np.testing.assert_array_equal(again.explanations[0].values, res.explanations[0].values)


def test_blur_baseline_is_returned(digits: Model, digit_images: np.ndarray) -> None:
    res = explain(digits, digit_images[:1], options=IntegratedGradientsOptions(baseline="blur"))
    e = res.explanations[0]
    baseline = np.array(e.details["baseline"])  # type: ignore[index]
    assert baseline.shape == (64,) and res.parameters["blur_sigma"] == 2.0
    assert baseline.std() < digit_images[0].std()  # blurring smooths the image


def test_bad_options_and_models(digits: Model, digit_images: np.ndarray) -> None:
    lin = linear_model(np.ones(3))
    x = np.ones((1, 3), dtype=np.float32)
    with pytest.raises(OptionError):
        explain(lin, x, options=IntegratedGradientsOptions(baseline="blur"))
    with pytest.raises(OptionError):
        explain(lin, x, options=IntegratedGradientsOptions(baseline="supplied", baseline_value=[1]))
    with pytest.raises(OptionError):
        explain(lin, x, options=IntegratedGradientsOptions(output="logit"))
    with pytest.raises(OptionError):
        explain(lin, x, options=IntegratedGradientsOptions(n_baselines=3))
    with pytest.raises(BudgetError):
        explain(digits, digit_images, options=IntegratedGradientsOptions(), budget=10)
    remote = Model(
        "r", "tabular", "regression", (3,), ("a", "b", "c"), ("y",), lin.module, platform="remote",
        differentiable=False,
    )
    with pytest.raises(NotDifferentiableError):
        explain(remote, x, options=IntegratedGradientsOptions())


def test_parameters_untouched(digits: Model, digit_images: np.ndarray) -> None:
    explain(digits, digit_images, options=IntegratedGradientsOptions(steps=4))
    assert all(p.grad is None for p in digits.module.parameters())
    assert score_function(digits, "logit")(torch.tensor(digit_images)).shape == (3, 10)


@pytest.mark.parametrize("estimator", ["path", "valid_ip"])
def test_batches_do_not_change_values(
    digits: Model, digit_images: np.ndarray, estimator: str
) -> None:
    """Chunks of 7 rows cut across paths and references: same values as one batch."""
    kw = {"baseline": "uniform", "n_baselines": 3, "steps": 6, "estimator": estimator}
    one = explain(digits, digit_images[:1], options=IntegratedGradientsOptions(**kw), seed=2)
    small = IntegratedGradientsOptions(**kw, batch_size=7)  # type: ignore[arg-type]
    many = explain(digits, digit_images[:1], options=small, seed=2)
    # float32 sums in another order (8e-8 apart on an AVX-512 CPU): float32 tolerances
    np.testing.assert_allclose(
        many.explanations[0].values, one.explanations[0].values, rtol=1e-5, atol=1e-6
    )


def test_non_finite_gradients_are_refused() -> None:
    model = linear_model(np.array([1e38, 1e38, 1e38]))
    x = np.full((1, 3), 1e3, dtype=np.float32)  # w . x overflows float32
    with pytest.raises(ExplainerError):
        explain(model, x, options=IntegratedGradientsOptions(steps=2))
