"""Warnings judged on each explainer's own value scale (issue 28): flat_game on AttriBoT's
log-likelihoods in nats, baseline_out_of_data on gradient baselines outside the model's data."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_diabetes

from explainers.attribot import AttriBoTOptions, attribute
from explainers.explanation import ExplainResult
from explainers.gradients.integrated import IntegratedGradientsOptions
from explainers.gradients.integrated import explain as integrated_gradients
from explainers.trust.caveats import FLAT_NATS, baseline_out_of_data, flat, with_caveats
from models.base import Model
from models.builtin.trained import load_builtin
from tests.explainers.closed_form_lm import ClosedFormLM

CONTEXT = [
    "The weather in Lisbon was mild that week. Many tourists visited the old town.",
    "Zorblat is the capital of Quenmoria. It has a famous harbour.",
    "Bread is baked from flour and water. Some bakers add seeds.",
]
QUERY = "What is the capital of Quenmoria?"
RESPONSE = " Zorblat is the capital."
LM = Model("closed-form", "lm", "generation", (), (), ("log_likelihood",))


class PlantedLM(ClosedFormLM):
    """ℓ = -|response| + `planted` nats when the sentence naming the harbour is in the prompt."""

    def __init__(self, planted: float) -> None:
        super().__init__()
        self.planted = planted

    def value(self, prompt: list[int], response: list[int]) -> float:
        words = {i: w for w, i in self.vocab.items()}
        present = {words[i] for i in prompt if i}
        return -len(response) + (self.planted if "harbour." in present else 0.0)


def loo(lm: ClosedFormLM, response: str = RESPONSE) -> ExplainResult:
    e, _ = attribute(lm, CONTEXT, QUERY, response, AttriBoTOptions(method="loo"))
    return with_caveats(LM, np.empty(0), ExplainResult((e,), (), {}, e.n_model_evals, False))


def codes(result: ExplainResult) -> list[list[str]]:
    return [[w.code for w in e.warnings] for e in result.explanations]


@pytest.mark.parametrize("planted", [24.6, 0.05])
def test_a_planted_span_is_not_flat_whatever_the_log_likelihood(planted: float) -> None:
    # a 400-word response: |ℓ| ~ 400 nats, so 1e-3 of it (0.4 nats) would call 0.05 nats flat
    result = loo(PlantedLM(planted), " ".join(["word"] * 400))
    e = result.explanations[0]
    assert e.base_value == e.instance_output_value  # LOO: v(all) - v(none) is 0 by construction
    harbour = [k for k, s in enumerate(e.players or ()) if "harbour" in s.text]
    assert e.values[harbour] == pytest.approx([planted]) and abs(e.values).max() == pytest.approx(
        planted
    )
    assert codes(result) == [[]]


def test_the_closed_form_lm_game_is_not_flat() -> None:
    assert codes(loo(ClosedFormLM())) == [[]]


@pytest.mark.parametrize("planted", [0.0, FLAT_NATS / 2])
def test_a_truly_flat_game_is_flat_in_nats(planted: float) -> None:
    result = loo(PlantedLM(planted))
    assert np.abs(result.explanations[0].values).max() == pytest.approx(planted)
    assert codes(result) == [["flat_game"]]
    assert "nats" in result.explanations[0].warnings[0].message


def test_values_that_cancel_are_not_flat() -> None:
    e = loo(PlantedLM(3.0)).explanations[0]
    cancel = replace(e, values=np.array([3.0, -3.0, 0.0]), details=None)  # sum 0, not flat
    assert flat(cancel, LM) is None
    assert flat(replace(cancel, values=np.zeros(3)), LM) is not None  # the generic scale


@pytest.fixture(scope="module")
def diabetes(model_dir: Path) -> Model:
    return load_builtin("diabetes-mlp", model_dir)


def ig(model: Model, x: np.ndarray, baseline: str = "zero", **kw: object) -> ExplainResult:
    options = IntegratedGradientsOptions(baseline=baseline, steps=16)  # type: ignore[arg-type]
    return integrated_gradients(model, x, options=options, **kw)  # type: ignore[arg-type]


def test_zero_baseline_on_raw_unit_diabetes_is_out_of_data(diabetes: Model) -> None:
    assert diabetes.background is not None and diabetes.module is not None
    x = diabetes.background[:4]
    zero = ig(diabetes, x)
    assert codes(zero) == [["baseline_out_of_data"]] * 4
    message = zero.explanations[0].warnings[0].message
    assert '"mean"' in message and '"expected"' in message
    assert codes(ig(diabetes, x, "mean")) == [[]] * 4
    # the ground truth behind the warning: f(0) is far outside the outputs of the data
    outputs = diabetes.module(torch.as_tensor(diabetes.background)).detach().numpy()[:, 0]
    f_zero = zero.explanations[0].base_value
    assert not outputs.min() <= f_zero <= outputs.max()


def test_zero_baseline_on_a_standardized_model_is_in_the_data() -> None:
    rows = load_diabetes(scaled=True).data.astype(np.float32)  # centred columns: 0 is the mean
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    names = tuple(load_diabetes().feature_names)
    model = Model("std", "tabular", "regression", (10,), names, ("y",), net, rows[:100])
    assert codes(ig(model, rows[:3])) == [[]] * 3
    # the same network on the raw units, same rule: the warning
    raw = load_diabetes(scaled=False).data.astype(np.float32)
    raw_model = Model("raw", "tabular", "regression", (10,), names, ("y",), net, raw[:100])
    assert codes(ig(raw_model, raw[:3])) == [["baseline_out_of_data"]] * 3


def test_black_image_baseline_in_range_is_in_the_data(model_dir: Path) -> None:
    digits = load_builtin("digits-cnn", model_dir)
    assert digits.input_range == (0.0, 1.0) and digits.background is not None
    x = digits.background[:2]
    assert codes(ig(digits, x)) == [[]] * 2  # black: the data's own darkest pixel


def test_an_image_baseline_truly_out_of_data_warns(model_dir: Path) -> None:
    digits = load_builtin("digits-cnn", model_dir)
    assert digits.background is not None
    caveat = baseline_out_of_data(digits, np.full(digits.input_shape, 5.0))
    assert caveat is not None and caveat.code == "baseline_out_of_data"
    assert baseline_out_of_data(digits, np.zeros(digits.input_shape)) is None
    assert baseline_out_of_data(digits, np.ones(digits.input_shape)) is None
