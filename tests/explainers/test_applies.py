"""Options declare where they apply (explainers/options.py): every option field of every
registered explainer carries an AppliesTo, and the one check (`check_applies`) rejects an option
set for a modality it does not fit, for each modality, before any model call."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import pytest
from pydantic import BaseModel, Field

from explainers import cocoa
from explainers.explanation import OptionError
from explainers.options import EVERYWHERE, TEXTS, ExplainerOptions, declarations
from explainers.registry import EXPLAINERS
from explainers.shapley import explainer as shapley
from explainers.sufficient import explainer as sufficient
from explainers.trust.evaluation import EvaluateOptions
from models.base import Model, TextModel
from models.modality import Modality

OPTIONS: list[type[BaseModel]] = [spec.options for spec in EXPLAINERS] + [EvaluateOptions]
# `when` may name a fact of the request that is no option: AttriBoT's generated response,
# COCOA's foil (sent or 'auto'); the explainer passes it as a value
REQUEST_VALUES = {"generated", "foil"}
ARRAY_AND_TEXT = (Modality.TABULAR, Modality.IMAGE, Modality.TEXT)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.__name__)
def test_every_option_declares_where_it_applies(options: type[BaseModel]) -> None:
    where = declarations(options)
    assert set(where) == set(options.model_fields), set(options.model_fields) - set(where)
    for name, rule in where.items():
        for key, allowed in rule.when:
            assert key in options.model_fields or key in REQUEST_VALUES, (name, key)
            assert key != name and allowed, (name, key)


def test_an_undeclared_option_is_found() -> None:
    class Options(ExplainerOptions):
        declared: Annotated[int, EVERYWHERE] = Field(1)
        bare: int = Field(2)

    assert set(declarations(Options)) == {"declared"}


def _misplaced() -> list[tuple[str, Modality, str]]:
    """(explainer, modality, an option that does not fit it) for every such pair."""
    found = []
    for spec in EXPLAINERS:
        where = declarations(spec.options)
        for modality in (m for m in spec.modalities if m in ARRAY_AND_TEXT):
            for name, rule in where.items():
                if not rule.fits(modality):
                    found.append((spec.name, modality, name))
    return found


MISPLACED = _misplaced()


def test_each_array_and_text_modality_has_misplaced_options() -> None:
    assert {m for _, m, _ in MISPLACED} == set(ARRAY_AND_TEXT)
    assert {e for e, _, _ in MISPLACED} == {"shapley", "sufficient-subset", "uni"}


@pytest.mark.parametrize(("explainer", "modality", "option"), MISPLACED)
def test_the_one_check_rejects_a_misplaced_option(
    explainer: str, modality: Modality, option: str
) -> None:
    spec = next(s for s in EXPLAINERS if s.name == explainer)
    default = spec.options.model_fields[option].get_default(call_default_factory=True)
    options = spec.options.model_validate({option: default})  # set, to its default even
    assert isinstance(options, ExplainerOptions)
    with pytest.raises(OptionError, match=rf"{option}.*not apply to {modality} models"):
        options.check_applies(modality)
    spec.options.model_validate({}).check_applies(modality)  # nothing set: nothing misplaced
    assert option not in options.echo(modality)  # and never echoed there


class _Calls:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, x: Any) -> np.ndarray:
        self.n += 1
        rows = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return _two_classes(rows.sum(axis=1))


def _two_classes(score: np.ndarray) -> np.ndarray:
    p = 1 / (1 + np.exp(-score))
    return np.stack([1 - p, p], axis=1).astype(np.float32)


def _array_model(modality: Modality, shape: tuple[int, ...], calls: _Calls) -> Model:
    n = int(np.prod(shape))
    return Model(
        name=f"toy-{modality}", modality=modality, task="classification", input_shape=shape,
        feature_names=tuple(f"f{i}" for i in range(n)), output_names=("no", "yes"),
        predict_fn=calls, background=np.zeros((2, *shape), np.float32),
    )  # fmt: skip


def _text_model(calls: _Calls, modality: Modality = Modality.TEXT) -> TextModel:
    def predict(texts: list[str]) -> np.ndarray:
        calls.n += 1
        return _two_classes(np.array([t.split().count("good") - 0.5 for t in texts]))

    return TextModel(
        name="toy-text", modality=modality, task="classification", input_shape=(),
        feature_names=(), output_names=("no", "yes"), predict_texts=predict,
        token_spans=lambda t: [],
    )  # fmt: skip


CASES = [  # (modality, a misplaced option for shapley and sufficient-subset)
    (Modality.TABULAR, {"absence": "mask"}, {"players": "tokens"}),
    (Modality.TABULAR, {"patch_size": 2}, {"patch_size": 2}),
    (Modality.IMAGE, {"absence": "delete"}, {"players": "words"}),
    (Modality.TEXT, {"masker": {"type": "baseline"}}, {"masker": {"type": "baseline"}}),
    (Modality.TEXT, {"return_baseline": True}, {"patch_size": 2}),
]


@pytest.mark.parametrize(("modality", "for_shapley", "for_sufficient"), CASES)
def test_explainers_reject_a_misplaced_option_before_any_model_call(
    modality: Modality, for_shapley: dict[str, Any], for_sufficient: dict[str, Any]
) -> None:
    calls = _Calls()
    inputs: np.ndarray
    if modality == Modality.TEXT:
        model: Model = _text_model(calls)
        inputs = np.array(["a good day"])
    else:
        shape = (3,) if modality == Modality.TABULAR else (1, 4, 4)
        model = _array_model(modality, shape, calls)
        inputs = np.ones((1, *shape), np.float32)
    runs: list[tuple[Any, type[ExplainerOptions], dict[str, Any]]] = [
        (shapley.explain, shapley.ShapleyOptions, for_shapley),
        (sufficient.explain, sufficient.SufficientOptions, for_sufficient),
    ]
    for explain, options_type, raw in runs:
        calls.n = 0
        with pytest.raises(OptionError, match=rf"{next(iter(raw))}.*{modality} models"):
            explain(model, inputs, options=options_type.model_validate(raw))
        assert calls.n == 0  # failed before any model call
        result = explain(model, inputs, options=options_type())  # the options unset: an answer
        assert calls.n > 0 and len(result.explanations) == 1


def test_an_image_option_for_the_other_players_is_rejected() -> None:
    model = _array_model(Modality.IMAGE, (1, 4, 4), _Calls())
    options = shapley.ShapleyOptions(players="superpixels", patch_size=2)
    with pytest.raises(OptionError, match="patch_size applies to image models, players 'patches'"):
        shapley.explain(model, np.ones((1, 1, 4, 4), np.float32), options=options)
    options = shapley.ShapleyOptions(n_segments=8)  # players auto: patches
    with pytest.raises(OptionError, match=r"n_segments applies to .*'superpixels'"):
        shapley.explain(model, np.ones((1, 1, 4, 4), np.float32), options=options)


@pytest.mark.parametrize(
    ("text", "raw", "what"),
    [
        (True, {"patch_size": 2}, "text encoders"),
        (True, {"blur_sigma": 2.0}, "text encoders"),
        (False, {"players": "tokens"}, "tabular encoders"),
    ],
)
def test_cocoa_judges_options_by_what_the_encoder_embeds(
    text: bool, raw: dict[str, Any], what: str
) -> None:
    calls = _Calls()
    model = (
        _text_model(calls, Modality.ENCODER)
        if text
        else _array_model(Modality.ENCODER, (3,), calls)
    )
    options = cocoa.CocoaOptions.model_validate(raw)
    with pytest.raises(OptionError, match=rf"{next(iter(raw))}.*not apply to {what}"):
        cocoa.explain(model, np.ones((1, 3)), options=options, corpus=[[1.0, 2.0, 3.0]])
    assert calls.n == 0


def test_echo_leaves_out_what_did_not_apply() -> None:
    echo = shapley.ShapleyOptions(index="SII").echo(Modality.TABULAR)
    assert "max_order" in echo and "api_variant" not in echo and "audit_reference" not in echo
    assert not {"players", "absence", "patch_size", "n_segments"} & set(echo)
    echo = shapley.ShapleyOptions().echo(Modality.TEXT, values={"players": "words"})
    assert {"players", "absence"} <= set(echo)
    assert not {"masker", "output", "return_baseline", "max_order"} & set(echo)
    echo = shapley.ShapleyOptions().echo(Modality.IMAGE, values={"players": "superpixels"})
    assert "n_segments" in echo and "patch_size" not in echo
    assert TEXTS.fits(Modality.TEXT) and not TEXTS.fits(Modality.IMAGE) and TEXTS.fits(None)


def test_no_explainer_decides_applicability_by_hand() -> None:
    """No `model_fields_set` test and no popping of the echo in the families that had them:
    check_applies and echo decide from the declarations."""
    import inspect

    from explainers import attribot, rankshap
    from explainers.gradients import integrated, uni_text
    from explainers.trust import evaluation

    modules = (shapley, sufficient, cocoa, rankshap, attribot, evaluation, integrated, uni_text)
    for module in modules:
        source = inspect.getsource(module)
        assert "model_fields_set" not in source and "echo.pop(" not in source, module.__name__
