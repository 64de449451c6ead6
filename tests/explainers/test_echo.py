"""One echo rule and one strictness (explainers/options.py): every options model is an
ExplainerOptions, and meta.parameters is `options.echo(drop=...)` less what did not apply."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest
from pydantic import ValidationError

from explainers import attribot, rankshap
from explainers.attribot import AttriBoTOptions, attribute
from explainers.options import ExplainerOptions
from explainers.shapley import explainer as shapley
from explainers.shapley import trees as shapley_trees
from explainers.sufficient import explainer as sufficient
from explainers.trust import evaluation
from explainers.trust.evaluation import EvaluateOptions
from tests.explainers.closed_form_lm import ClosedFormLM

CONTEXT = ["Zorblat is the capital of Quenmoria. It has a harbour.", "Bread is baked from flour."]
QUERY = "What is the capital of Quenmoria?"


@pytest.mark.parametrize(
    "model",
    [
        shapley.ShapleyOptions,
        sufficient.SufficientOptions,
        rankshap.RankShapOptions,
        attribot.AttriBoTOptions,
        evaluation.EvaluateOptions,
    ],
)
def test_every_options_model_is_strict_and_forbids_extras(model: type[ExplainerOptions]) -> None:
    assert issubclass(model, ExplainerOptions)
    with pytest.raises(ValidationError):
        model.model_validate({"no_such_option": 1})


def test_a_string_for_a_number_fails_in_evaluate_like_everywhere() -> None:
    with pytest.raises(ValidationError):
        EvaluateOptions.model_validate({"steps": "3"})
    with pytest.raises(ValidationError):
        shapley.ShapleyOptions.model_validate({"patch_size": "3"})
    assert EvaluateOptions.model_validate({"steps": 3, "radius": 1}).radius == 1.0  # int -> float


GENERAL = ["method", "granularity", "prompt_template", "batch_size"]
TRICKS = ["kv_cache", "hierarchical", "proxy_model", "prune"]
GENERATION = ["max_new_tokens", "stop"]
CONTEXTCITE = ["n_ablations", "keep_prob", "lasso_alpha"]


@pytest.mark.parametrize(
    ("options", "reply", "echoed"),
    [
        ({"method": "loo"}, None, GENERAL),
        ({"method": "contextcite"}, None, [*GENERAL, "kv_cache", *CONTEXTCITE]),
        ({}, None, [*GENERAL, *TRICKS]),
        (
            {"hierarchical": True, "prune": True, "keep_sentences": 2},
            None,
            [*GENERAL, *TRICKS, "keep_paragraphs", "pruning_model", "keep_sentences"],
        ),
        ({"method": "loo"}, " Zorblat.", [*GENERAL, *GENERATION]),
    ],
)
def test_attribot_echoes_the_options_that_applied(
    options: dict[str, object], reply: str | None, echoed: list[str]
) -> None:
    lm = ClosedFormLM(reply)
    o = AttriBoTOptions.model_validate(options)
    response = None if reply else " Zorblat."
    explanation, echo = attribute(
        lm, CONTEXT, QUERY, response, o, resolve={"smollm2-135m": lm}.__getitem__
    )
    assert explanation.details and explanation.details["response_generated"] == bool(reply)
    assert sorted(echo) == sorted(echoed)
    dumped = o.model_dump(mode="json")
    assert list(echo) == [k for k in dumped if k in echoed]  # in the options' order
    assert echo == {k: dumped[k] for k in echoed}


@pytest.mark.parametrize(
    "module", [shapley, shapley_trees, sufficient, rankshap, attribot, evaluation]
)
def test_explainers_echo_through_the_one_rule(module: ModuleType) -> None:
    """No explainer prunes its own dump of the options: the echo is `options.echo(drop=...)`."""
    assert ".model_dump(" not in inspect.getsource(module)
