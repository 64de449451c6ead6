"""UNI: weights untouched, baseline inside the ball, lower target score, completeness, useful
defaults on confident digits, and the warnings when unlearning or the match fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from explainers.explanation import OptionError
from explainers.gradients.integrated import NotDifferentiableError
from explainers.gradients.uni import UniOptions, explain
from models.base import Model, weights_hash
from models.builtin.trained import dataset_split, load_breast_cancer_mlp, load_diabetes_mlp


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """One torch thread, as the service runs (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return dataset_split("digits-cnn").x_test[:5]


def test_weights_unchanged(digits: Model, images: np.ndarray) -> None:
    before = weights_hash(digits.module)
    explain(
        digits, images[:2], options=UniOptions(unlearning_steps=3, unlearning_rule="normalized")
    )
    explain(digits, images[:1], options=UniOptions(unlearning_rule="sgd", unlearning_lr=10.0))
    explain(digits, images[:2], options=UniOptions())  # line search
    assert weights_hash(digits.module) == before
    assert all(p.grad is None for p in digits.module.parameters())


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_baseline_within_epsilon_and_below(digits: Model, images: np.ndarray, norm: str) -> None:
    eps = 0.1
    res = explain(digits, images, options=UniOptions(epsilon=eps, norm=norm))
    assert res.parameters["epsilon_units"] == "input" and res.parameters["pgd_step_size"] == eps / 4
    for x, e in zip(images, res.explanations, strict=True):
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        delta = baseline - x.reshape(-1)
        # linf: every pixel within eps; l2: the root-mean-square change within eps
        size = np.abs(delta).max() if norm == "linf" else np.sqrt(np.mean(delta**2))
        assert 0 < size <= eps + 1e-6
        # the matched baseline is what the unlearned model "sees": the class score drops
        assert e.base_value < e.instance_output_value
        assert e.details["kl_final"] < e.details["kl_start"]  # type: ignore[index]
        assert e.output_index == int(np.argmax(digits.predict(x[None])[0]))


def test_defaults_explain_confident_digits(digits: Model) -> None:
    """Issue 15: on 10 confident test digits the baseline keeps at most half of f(x) (median),
    stays in [0, 1], and the attributions explain most of f(x)."""
    x = dataset_split("digits-cnn").x_test
    confident = x[digits.predict(x).max(axis=1) > 0.99][:10]
    assert len(confident) == 10
    res = explain(digits, confident, options=UniOptions())
    p = res.parameters
    assert (p["norm"], p["epsilon"], p["epsilon_units"]) == ("l2", 0.15, "input")
    assert (p["clip_min"], p["clip_max"]) == (0.0, 1.0)
    drops, explained = [], []
    for e in res.explanations:
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        assert baseline.min() >= 0 and baseline.max() <= 1
        drops.append((e.instance_output_value - e.base_value) / e.instance_output_value)
        explained.append(e.values.sum() / e.instance_output_value)
        d = e.details
        assert d is not None and d["probability_baseline"] == pytest.approx(e.base_value)
        assert d["unlearned_probability"] <= 0.1 * d["probability_input"] + 1e-6
        assert {w.code for w in e.warnings} <= {"baseline_not_reached"}
        if d["match_share"] >= 0.75:
            assert not e.warnings
    assert np.median(drops) >= 0.5
    assert np.median(explained) >= 0.5
    assert sum(bool(e.warnings) for e in res.explanations) <= 2


def test_failed_match_and_unlearning_warn(digits: Model, images: np.ndarray) -> None:
    """The issue's old defaults (8/255 linf ball): the match fails and says so; the paper's
    single SGD step does not unlearn a confident model and says so."""
    small = explain(digits, images[:2], options=UniOptions(norm="linf", epsilon=8 / 255))
    for e in small.explanations:
        assert [w.code for w in e.warnings] == ["baseline_not_reached"]
        assert e.details["match_share"] < 0.75  # type: ignore[index]
    sgd = explain(digits, images[:2], options=UniOptions(unlearning_rule="sgd"))
    for e in sgd.explanations:
        assert "not_converged" in {w.code for w in e.warnings}
        assert e.details["unlearned_probability"] > 0.5  # type: ignore[index]
    paper = UniOptions(unlearning_rule="sgd", unlearning_target=None)  # no goal, no claim
    assert all(
        "not_converged" not in {w.code for w in e.warnings}
        for e in explain(digits, images[:1], options=paper).explanations
    )


def test_default_ball_and_clipping(digits: Model, images: np.ndarray) -> None:
    res = explain(digits, images[:4], options=UniOptions())
    for x, e in zip(images[:4], res.explanations, strict=True):
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        assert np.sqrt(np.mean((baseline - x.reshape(-1)) ** 2)) <= 0.15 + 1e-6
        assert baseline.min() >= 0 and baseline.max() <= 1
        assert e.base_value < e.instance_output_value
    boxed = explain(digits, images[:2], options=UniOptions(clip_min=0.2, clip_max=0.9))
    for e in boxed.explanations:  # the caller's box wins over the model's input_range
        baseline = np.array(e.details["baseline"])  # type: ignore[index]
        assert baseline.min() >= 0.2 - 1e-7 and baseline.max() <= 0.9 + 1e-7


def test_completeness_gap_shrinks(digits: Model, images: np.ndarray) -> None:
    gaps = []
    for steps in (1, 8, 256):
        res = explain(digits, images[:2], options=UniOptions(epsilon=0.1, ig_steps=steps))
        gaps.append(np.mean([e.approximation_error for e in res.explanations]))
    assert gaps[2] < gaps[1] < gaps[0]
    assert gaps[2] < 0.01 and gaps[2] < gaps[0] / 5


def test_tabular_classifier_uses_std_units(model_dir: Path) -> None:
    model = load_breast_cancer_mlp(model_dir)
    x = dataset_split("breast-cancer-mlp").x_test[:3]
    res = explain(model, x, options=UniOptions(epsilon=0.5, norm="linf"))
    std = model.background.std(axis=0)  # type: ignore[union-attr]
    for row, e in zip(x, res.explanations, strict=True):
        delta = np.array(e.details["baseline"]) - row  # type: ignore[index]
        assert np.all(np.abs(delta) <= 0.5 * np.where(std > 0, std, 1) * (1 + 1e-5) + 1e-6)
        assert e.base_value <= e.instance_output_value
    assert res.parameters["epsilon_units"] == "std"
    default = explain(model, x, options=UniOptions())
    assert default.parameters["epsilon"] == 1.0 and default.parameters["norm"] == "l2"
    for row, e in zip(x, default.explanations, strict=True):
        scaled = (np.array(e.details["baseline"]) - row) / np.where(std > 0, std, 1)  # type: ignore[index]
        assert np.sqrt(np.mean(scaled**2)) <= 1 + 1e-5


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
