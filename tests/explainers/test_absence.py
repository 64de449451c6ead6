"""games/absence.py: one set of reference rows for shapley, gradients, evaluation and cocoa."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from explainers import cocoa
from explainers.explanation import OptionError
from explainers.games.absence import Absence, blur, references
from explainers.gradients import integrated as gradients
from explainers.shapley import explainer as shapley
from explainers.trust import evaluation
from models.base import Model


def _model(modality: str, shape: tuple[int, ...]) -> Model:
    rng = np.random.default_rng(0)
    n = int(np.prod(shape))
    return cast(
        Model,
        SimpleNamespace(
            name=f"fake-{modality}",
            modality=modality,
            input_shape=shape,
            n_features=n,
            input_dtype="float32",
            background=rng.normal(size=(7, *shape)).astype(np.float32),
        ),
    )


def _all_four(model: Model, x: np.ndarray, kind: str, value: Any = None) -> list[np.ndarray]:
    """The rows each explainer builds for one kind (no request background: the model's)."""
    rng = np.random.default_rng(0)
    out = []
    masker = {
        "zero": shapley.MaskerOptions(type="baseline", value=0.0),
        "mean": shapley.MaskerOptions(type="baseline") if model.modality == "tabular" else None,
        "value": shapley.MaskerOptions(type="baseline", value=value),
        "background": shapley.MaskerOptions(type="background"),
    }.get(kind)
    if masker is not None:
        out.append(shapley._references(model, masker, None)[0])
    ig_kind = {"value": "supplied", "background": None}.get(kind, kind)
    if ig_kind is not None:
        ig = gradients.IntegratedGradientsOptions(
            baseline=ig_kind, baseline_value=value, blur_sigma=1.5
        )
        out.append(gradients.make_baselines(model, x, ig, None, rng))
    ev = evaluation.EvaluateOptions(removal=kind, removal_value=value, blur_sigma=1.5)
    out.append(evaluation.removal_references(model, x, ev, None)[0])
    if kind in ("zero", "mean", "blur"):
        co = cocoa.CocoaOptions(baseline=kind, blur_sigma=1.5)
        out.append(cocoa._baseline(model, x, co)[None])
    return out


@pytest.mark.parametrize(
    ("modality", "shape", "kind"),
    [
        ("tabular", (5,), "zero"),
        ("tabular", (5,), "mean"),
        ("tabular", (5,), "value"),
        ("tabular", (5,), "background"),
        ("image", (1, 6, 6), "zero"),
        ("image", (1, 6, 6), "mean"),
        ("image", (1, 6, 6), "blur"),
        ("image", (1, 6, 6), "value"),
        ("encoder", (1, 6, 6), "blur"),
    ],
)
def test_every_explainer_gets_the_same_rows(
    modality: str, shape: tuple[int, ...], kind: str
) -> None:
    model = _model(modality, shape)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    value = np.arange(model.n_features, dtype=np.float64).tolist() if kind == "value" else None
    expected = references(model, x, Absence(cast(Any, kind), value, 1.5))
    rows = [r for r in _all_four(model, x, kind, value) if r is not None]
    assert len(rows) >= 2
    for got in rows:
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)  # float32 copies


def test_blur_is_for_images_only_and_repeats_edges() -> None:
    tabular = _model("tabular", (5,))
    with pytest.raises(OptionError, match="applies to image models"):
        references(tabular, np.zeros(5), Absence("blur", sigma=1.0))
    x = np.zeros((1, 5, 5))
    x[0, 0, 0] = 1.0
    from scipy.ndimage import gaussian_filter

    want = gaussian_filter(x, (0.0, 1.0, 1.0), mode="nearest")
    np.testing.assert_allclose(blur(x, 1.0), want, atol=1e-12)


def test_mean_prefers_the_request_background() -> None:
    model = _model("tabular", (3,))
    sent = np.ones((2, 3), dtype=np.float32) * 4
    np.testing.assert_allclose(references(model, np.zeros(3), Absence("mean"), sent), 4.0)
    own = model.background.astype(np.float64).mean(axis=0, keepdims=True)  # type: ignore[union-attr]
    np.testing.assert_allclose(references(model, np.zeros(3), Absence("mean")), own)


def test_games_and_estimators_do_not_import_torch() -> None:
    code = (
        "import sys, explainers.games, explainers.games.absence, explainers.games.masked, "
        "explainers.games.text, explainers.estimators; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "module",
    [
        "explainers.estimators.budget",
        "explainers.estimators",
        "explainers.estimators.registry",
        "explainers.estimators.library",
        "explainers.estimators.loo",
        "explainers.games.absence",
        "explainers.games.spans",
    ],
)
def test_each_module_imports_first_without_a_cycle(module: str) -> None:
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True)
