"""Fool-SHAP background audit on breast-cancer-mlp: biased backgrounds flagged, random ones not,
thresholds Holm-corrected over every test of every output, the caller's reference data used."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from explainers import shapley_values
from explainers.explanation import OptionError
from explainers.games.masked import MaskedModelGame
from explainers.shapley.explainer import ShapleyOptions, explain
from explainers.trust.audit import TESTS_PER_OUTPUT, audit_outputs, holm
from models.base import Model
from models.registry import ModelRegistry

ALPHA = 0.05


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Model:
    return ModelRegistry(model_dir).get("breast-cancer-mlp")


@pytest.fixture(scope="module")
def f_ref(model: Model) -> np.ndarray:
    assert model.reference is not None
    return model.predict(model.reference).astype(np.float64)  # [R, 2]


def test_holm_against_its_definition() -> None:
    """Step-down: reject p_(i) while p_(i) <= alpha / (m - i); adjusted p-values are monotone."""
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2, 0.0125])
    rejected, adjusted = holm(p, ALPHA)
    order = np.argsort(p)
    expected = np.zeros(p.size, dtype=bool)
    for i, j in enumerate(order):
        if p[j] > ALPHA / (p.size - i):
            break
        expected[j] = True
    np.testing.assert_array_equal(rejected, expected)
    # Adjusted: max over earlier steps of (m - i) p_(i), capped at 1.
    steps = np.minimum(np.maximum.accumulate((p.size - np.arange(p.size)) * p[order]), 1)
    np.testing.assert_allclose(adjusted[order], steps, rtol=1e-12)
    assert rejected.tolist() == [True, False, False, True, False, True]
    # Any rejection at all happens exactly when min p <= alpha / m (the flag is Bonferroni's).
    for m in range(1, 7):
        for idx in combinations(range(6), m):
            assert holm(p[list(idx)], ALPHA)[0].any() == (p[list(idx)].min() <= ALPHA / m)


def test_family_counts_every_test_of_every_output(f_ref: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    rows = rng.choice(len(f_ref), 100, replace=False)
    out = audit_outputs(f_ref[rows], f_ref, rng, output_indices=[0, 1])
    assert out["correction"] == "holm" and out["tests"] == 2 * TESTS_PER_OUTPUT == 6
    assert [o["output_index"] for o in out["outputs"]] == [0, 1]
    for o in out["outputs"]:
        assert all(a >= p for a, p in zip(o["ks_adjusted_pvalues"], o["ks_pvalues"], strict=True))
        assert o["wald_adjusted_pvalue"] >= o["wald_pvalue"]
    one = audit_outputs(f_ref[rows, 1], f_ref[:, 1], np.random.default_rng(0))
    assert one["tests"] == TESTS_PER_OUTPUT and one["outputs"][0]["output_index"] == 0


@pytest.mark.parametrize("columns", [[1], [0, 1]])
def test_random_backgrounds_are_flagged_at_most_at_the_nominal_rate(
    f_ref: np.ndarray, columns: list[int]
) -> None:
    """Holm over 3 tests per output bounds the false-flag rate by alpha for one output or for
    both (before: alpha/2 per output, uncorrected across outputs)."""
    rng = np.random.default_rng(0)
    trials = 400
    flagged = 0
    for _ in range(trials):
        rows = rng.choice(len(f_ref), 100, replace=False)
        flagged += audit_outputs(f_ref[rows][:, columns], f_ref[:, columns], rng)["suspicious"]
    # Subsamples of the reference itself are more conservative still; 0.05 + 2.5 binomial SEs.
    assert flagged / trials <= ALPHA + 2.5 * np.sqrt(ALPHA * (1 - ALPHA) / trials), flagged


def test_background_chosen_to_hide_a_feature_is_flagged(model: Model, f_ref: np.ndarray) -> None:
    assert model.reference is not None and model.background is not None
    x = model.reference[7]
    feature = int(np.argmax(np.abs(shap_of(model, x, model.background))))
    # The attacker keeps the rows that agree with x on that feature: its effect vanishes.
    closest = np.argsort(np.abs(model.reference[:, feature] - x[feature]))[:100]
    biased = model.reference[closest]
    honest_value = shap_of(model, x, model.background)[feature]
    biased_value = shap_of(model, x, biased)[feature]
    assert abs(biased_value) < 0.5 * abs(honest_value)
    result = audit_outputs(model.predict(biased), f_ref, np.random.default_rng(0), ALPHA, [0, 1])
    assert result["suspicious"]


def shap_of(model: Model, x: np.ndarray, background: np.ndarray) -> np.ndarray:
    game = MaskedModelGame(model.predict, x, background)
    return shapley_values(game, 30, estimator="kernel", budget=3000 * len(background)).values[:, 1]


def _population(model: Model, f_ref: np.ndarray) -> np.ndarray:
    """A deployment population unlike the training split: the rows the model calls benign."""
    assert model.reference is not None
    return model.reference[f_ref[:, 1] > 0.5]


def test_the_callers_reference_is_used(model: Model, f_ref: np.ndarray) -> None:
    """A fair sample of the caller's population is flagged against the training split (it is
    not a sample of it) and passes against the caller's own reference rows."""
    population = _population(model, f_ref)
    assert model.reference is not None and 100 < len(population) < len(model.reference)
    rows = np.random.default_rng(1).choice(len(population), 60, replace=False)
    background = population[rows]
    x = model.reference[:1]
    opts = ShapleyOptions(estimator="permutation")
    default = explain(model, x, options=opts, budget=4000, background=background)
    audit = default.meta["background_audit"]
    assert audit["reference"] == "training split" and audit["suspicious"]
    own = ShapleyOptions(estimator="permutation", audit_reference=population.tolist())
    result = explain(model, x, options=own, budget=4000, background=background)
    audit = result.meta["background_audit"]
    assert audit["reference"] == f"parameters.audit_reference ({len(population)} rows)"
    assert not audit["suspicious"]
    assert audit["outputs"][0]["reference_rows"] == len(population)
    assert audit["n_model_evals"] == len(background) + len(population)
    assert "audit_reference" not in result.parameters  # the rows are not echoed
    np.testing.assert_array_equal(result.explanations[0].values, default.explanations[0].values)


def test_reference_rows_are_checked(model: Model) -> None:
    assert model.reference is not None
    x, bg = model.reference[:1], model.reference[:20]
    rows = model.reference[20:40].tolist()
    with pytest.raises(OptionError, match="send a background"):
        explain(model, x, options=ShapleyOptions(audit_reference=rows), budget=4000)
    bad = [rows[0][:-1], rows[1]]
    with pytest.raises(OptionError, match=r"audit_reference\[0\]: expected 30 values"):
        explain(model, x, options=ShapleyOptions(audit_reference=bad), budget=4000, background=bg)
    text = [[str(v) for v in rows[0]], rows[1]]
    with pytest.raises(OptionError, match="numbers only"):
        explain(model, x, options=ShapleyOptions(audit_reference=text), budget=4000, background=bg)
    named = [dict(zip(model.feature_names, r, strict=True)) for r in rows]
    out = explain(
        model, x, options=ShapleyOptions(audit_reference=named), budget=4000, background=bg
    )
    assert out.meta["background_audit"]["outputs"][0]["reference_rows"] == 20


@pytest.fixture(scope="module")
def client(model_dir: Path, make_client: Callable[..., TestClient]) -> TestClient:
    registry = ModelRegistry(model_dir)
    registry.load_all()  # as tests/app does; with lazy loads the interpreter aborted at exit
    return make_client(registry)


def test_http_audit_reference(client: TestClient, model: Model, f_ref: np.ndarray) -> None:
    population = _population(model, f_ref)
    assert model.reference is not None
    url = "/v2/models/breast-cancer-mlp/explain/shapley"
    body = {
        "inputs": [model.reference[0].tolist()],
        "budget": 4000,
        "background": population[:40].tolist(),
        "parameters": {"estimator": "permutation", "audit_reference": population.tolist()},
    }
    r = client.post(url, json=body)
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    assert meta["background_audit"]["reference"].startswith("parameters.audit_reference")
    assert meta["background_audit"]["correction"] == "holm"
    assert "audit_reference" not in meta["parameters"]
    body["parameters"] = {"audit_reference": [["51"] * 30, population[0].tolist()]}
    r = client.post(url, json=body)
    assert r.status_code == 400 and "numbers only" in r.json()["error"], r.text
