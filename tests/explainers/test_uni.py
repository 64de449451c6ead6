"""UNI: weights untouched, baseline inside the ball, lower target score, completeness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from explainers.explanation import OptionError
from explainers.gradients import NotDifferentiableError
from explainers.uni import UniOptions, explain
from models.base import Model, weights_hash
from models.builtin import dataset_split, load_breast_cancer_mlp, load_diabetes_mlp, load_digits_cnn


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def digits(model_dir: Path) -> Model:
    return load_digits_cnn(model_dir)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return dataset_split("digits-cnn").x_test[:5]


def test_weights_unchanged(digits: Model, images: np.ndarray) -> None:
    before = weights_hash(digits.module)
    explain(digits, images[:2], options=UniOptions(unlearning_steps=3, unlearning_lr=0.05))
    explain(digits, images[:1], options=UniOptions(unlearning_rule="sgd", unlearning_lr=10.0))
    assert weights_hash(digits.module) == before
    assert all(p.grad is None for p in digits.module.parameters())


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_baseline_within_epsilon_and_below(digits: Model, images: np.ndarray, norm: str) -> None:
    eps = 0.1 if norm == "linf" else 0.5
    res = explain(digits, images, options=UniOptions(epsilon=eps, norm=norm))
    assert res.parameters["epsilon_units"] == "input" and res.parameters["pgd_step_size"] == eps / 4
    for x, e in zip(images, res.explanations, strict=True):
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        delta = baseline - x.reshape(-1)
        size = np.abs(delta).max() if norm == "linf" else np.linalg.norm(delta)
        assert 0 < size <= eps + 1e-6
        # the matched baseline is what the unlearned model "sees": the class score drops
        assert e.base_value < e.instance_output_value
        assert e.details["kl_baseline"] < e.details["kl_start"]  # type: ignore[index]
        assert e.output_index == int(np.argmax(digits.predict(x[None])[0]))


def test_default_ball_and_clipping(digits: Model, images: np.ndarray) -> None:
    res = explain(digits, images[:4], options=UniOptions(clip_min=0.0, clip_max=1.0))
    for x, e in zip(images[:4], res.explanations, strict=True):
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        assert np.abs(baseline - x.reshape(-1)).max() <= 8 / 255 + 1e-6
        assert baseline.min() >= 0 and baseline.max() <= 1
        assert e.base_value < e.instance_output_value


def test_completeness_gap_shrinks(digits: Model, images: np.ndarray) -> None:
    gaps = []
    for steps in (1, 4, 64):
        res = explain(digits, images[:2], options=UniOptions(epsilon=0.1, ig_steps=steps))
        gaps.append(np.mean([e.approximation_error for e in res.explanations]))
    assert gaps[2] < gaps[1] < gaps[0]
    assert gaps[2] < 0.01 and gaps[2] < gaps[0] / 5


def test_tabular_classifier_uses_std_units(model_dir: Path) -> None:
    model = load_breast_cancer_mlp(model_dir)
    x = dataset_split("breast-cancer-mlp").x_test[:3]
    res = explain(model, x, options=UniOptions(epsilon=0.5, unlearning_lr=0.1))
    std = model.background.std(axis=0)  # type: ignore[union-attr]
    for row, e in zip(x, res.explanations, strict=True):
        delta = np.array(e.details["baseline"]) - row  # type: ignore[index]
        assert np.all(np.abs(delta) <= 0.5 * np.where(std > 0, std, 1) * (1 + 1e-5) + 1e-6)
        assert e.base_value <= e.instance_output_value
    assert res.parameters["epsilon_units"] == "std"


def test_refusals(model_dir: Path, digits: Model, images: np.ndarray) -> None:
    with pytest.raises(OptionError):
        explain(load_diabetes_mlp(model_dir), np.zeros((1, 10), np.float32), options=UniOptions())
    with pytest.raises(OptionError):
        explain(digits, images[:1], options=UniOptions(clip_min=1.0, clip_max=0.0))
    remote = Model(
        "remote", "image", "classification", (1, 8, 8), digits.feature_names,
        digits.output_names, torch.nn.Identity(), platform="remote", differentiable=False,
    )  # fmt: skip
    with pytest.raises(NotDifferentiableError):
        explain(remote, images[:1], options=UniOptions())
