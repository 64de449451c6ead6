"""One explainer contract (explainers/context.py, explainers/registry.py): a typed request in, a
result out; each registry line declares its capabilities typed, and the one adapter hands every
family's library function exactly the keyword arguments it takes."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

from explainers.context import Explainer, ExplainRequest, RunContext
from explainers.registry import EXPLAINERS, ExplainerSpec, LibraryExplainer, Need
from explainers.shapley import explainer as shapley
from models.base import Model
from models.modality import Modality

COMMON = {"options", "target", "seed", "budget", "background"}


@pytest.mark.parametrize("spec", EXPLAINERS, ids=lambda s: s.name)
def test_every_library_function_takes_what_the_adapter_passes(spec: ExplainerSpec) -> None:
    params = inspect.signature(spec.run).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    own = set(spec.fields.model_fields) if spec.fields is not None else set()
    assert COMMON | own <= keywords, (spec.name, (COMMON | own) - keywords)
    assert ("context" in keywords and "context" not in own) == spec.uses_context, spec.name
    required = {n for n in keywords if params[n].default is inspect.Parameter.empty}
    assert required <= COMMON | own | {"context"}, (spec.name, required)


@pytest.mark.parametrize("spec", EXPLAINERS, ids=lambda s: s.name)
def test_capabilities_are_typed(spec: ExplainerSpec) -> None:
    assert spec.modalities and all(isinstance(m, Modality) for m in spec.modalities)
    assert all(isinstance(n, Need) for n in spec.needs)
    explainer: Explainer = spec.explainer
    assert isinstance(explainer, LibraryExplainer) and explainer.function is spec.run


def _linear() -> Model:
    weights = np.array([1.0, -2.0, 0.5])

    def predict(x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, np.float64).reshape(len(x), -1) @ weights)[:, None]

    return Model(
        name="linear", modality="tabular", task="regression", input_shape=(3,),
        feature_names=("a", "b", "c"), output_names=("y",), predict_fn=predict,
        background=np.zeros((4, 3), np.float32),
    )  # fmt: skip


def test_a_request_answers_as_the_library_call() -> None:
    model, x = _linear(), np.array([[1.0, 2.0, 3.0]], np.float32)
    assert model.modality is Modality.TABULAR  # a plain string becomes the enum
    spec = next(s for s in EXPLAINERS if s.name == "shapley")
    options = shapley.ShapleyOptions(estimator="exact")
    request = ExplainRequest(model, x, options, seed=3, context=RunContext())
    via_contract = spec.explain(request)
    direct = shapley.explain(model, x, options=options, seed=3)
    np.testing.assert_allclose(
        via_contract.explanations[0].values, direct.explanations[0].values, rtol=1e-6
    )
    # exact Shapley values of a linear model against a zero background: w * x
    np.testing.assert_allclose(direct.explanations[0].values, [1.0, -4.0, 1.5], atol=1e-6)
    assert via_contract.parameters == direct.parameters
    again = spec.explain(replace(request, inputs=2 * x))  # requests are values: replace
    np.testing.assert_allclose(again.explanations[0].values, [2.0, -8.0, 3.0], atol=1e-6)


def test_trained_explainers_declare_their_training_once() -> None:
    from app.jobs.kinds import NAMES, kind

    trained = [s for s in EXPLAINERS if s.training is not None]
    assert {s.name for s in trained} == {"salvage", "autognothi"}
    for spec in trained:
        assert spec.training is not None and spec.train_job == spec.training.job
        assert spec.uses_context and spec.pin is not None  # answers from a stored artifact
        assert set(spec.training.summary) <= set(spec.training.options.model_fields)
        assert spec.training.job in NAMES and kind(spec.training.job).training
        assert spec.training.total(spec.training.options()) >= 2  # progress, then the artifact
    assert [n for n in NAMES if n.startswith("train-")] == [s.train_job for s in trained]
