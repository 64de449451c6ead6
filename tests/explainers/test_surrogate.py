"""estimators/surrogate.py (ContextCite's Lasso surrogate), alone and through AttriBoT.

The references are written out here: the random ablations of the seed, sklearn's Lasso on the
standardised presence indicators (what attribot.py did inline before the estimator existed),
and a closed-form language model whose log-likelihoods need no torch.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Lasso

from explainers.attribot import DEFAULT_TEMPLATE, AttriBoTOptions, attribute
from explainers.estimators.surrogate import linear_surrogate
from explainers.games import BudgetError, GameRecorder
from explainers.games.sentences import build_tree
from tests.explainers.closed_form_lm import ClosedFormLM


def lasso_reference(
    masks: np.ndarray, y: np.ndarray, alpha: float, scale: float
) -> tuple[np.ndarray, float]:
    """ContextCite's fit as attribot.py wrote it: Lasso of y / scale on standardised masks."""
    x = masks.astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    fit = Lasso(alpha=alpha, fit_intercept=True).fit((x - mean) / std, y / scale)
    return fit.coef_ / std * scale, (fit.intercept_ - (fit.coef_ * mean / std).sum()) * scale


W = np.array([1.5, -0.7, 0.0, 2.2, 0.4, -1.1, 0.9])


def pair_game(masks: np.ndarray) -> np.ndarray:
    """A linear game with one pair term: [m]"""
    masks = np.atleast_2d(masks)
    return masks @ W + 0.8 * (masks[:, 0] & masks[:, 3])


@pytest.mark.parametrize("seed", [0, 3])
def test_equals_sklearn_lasso_on_the_same_masks(seed: int) -> None:
    n, m, p = len(W), 40, 0.5
    calls: list[int] = []

    def game(masks: np.ndarray) -> np.ndarray:
        calls.append(len(masks))
        return pair_game(masks)

    recorder = GameRecorder(game, n, m + 1)
    est = linear_surrogate(recorder, np.random.default_rng(seed), m, p, alpha=0.01, scale=2.0)
    masks = np.random.default_rng(seed).random((m, n)) < p
    weights, intercept = lasso_reference(masks, pair_game(masks), 0.01, 2.0)
    np.testing.assert_allclose(est.values, weights, rtol=1e-10, atol=1e-12)
    assert float(est.base_value) == pytest.approx(intercept, rel=1e-10, abs=1e-12)
    assert float(est.full_value) == pytest.approx(W.sum() + 0.8)
    assert not est.exact and est.index == "surrogate" and est.interactions is None
    # One batch; every distinct coalition (the ablations and v(all)) paid once.
    distinct = {tuple(row) for row in masks} | {(True,) * n}
    assert calls == [len(distinct)] and est.n_coalitions == est.n_evaluations == len(distinct)


def test_recovers_a_linear_game_and_handles_several_outputs() -> None:
    n = len(W)

    def game(masks: np.ndarray) -> np.ndarray:
        lin = np.atleast_2d(masks) @ W
        return np.stack([lin, -2 * lin + 1], axis=1)  # [m, 2]

    est = linear_surrogate(GameRecorder(game, n), np.random.default_rng(1), 400, alpha=1e-6)
    assert est.values.shape == (n, 2) and est.base_value.shape == (2,)
    np.testing.assert_allclose(est.values[:, 0], W, atol=1e-4)
    np.testing.assert_allclose(est.values[:, 1], -2 * W, atol=1e-4)
    np.testing.assert_allclose(est.base_value, [0.0, 1.0], atol=1e-4)


def test_too_few_ablations_and_a_small_budget_are_refused() -> None:
    with pytest.raises(BudgetError):
        linear_surrogate(GameRecorder(pair_game, len(W)), np.random.default_rng(0), 1)
    with pytest.raises(BudgetError):
        linear_surrogate(GameRecorder(pair_game, len(W), 5), np.random.default_rng(0), 40)


CONTEXT = [
    "The weather in Lisbon was mild that week. Many tourists visited the old town.",
    "Zorblat is the capital of Quenmoria. It has a famous harbour.",
    "Bread is baked from flour and water. Some bakers add seeds.",
]
QUERY = "What is the capital of Quenmoria?"
RESPONSE = " Zorblat is the capital."


@pytest.mark.parametrize(
    ("granularity", "n_ablations", "seed"), [("sentence", 24, 0), ("paragraph", 16, 3)]
)
def test_contextcite_through_attribot_equals_the_inline_fit(
    granularity: str, n_ablations: int, seed: int
) -> None:
    lm = ClosedFormLM()
    options = AttriBoTOptions.model_validate(
        {"method": "contextcite", "granularity": granularity, "n_ablations": n_ablations}
    )
    explanation, _ = attribute(lm, CONTEXT, QUERY, RESPONSE, options, seed=seed)

    tree = build_tree(CONTEXT)
    units = (
        [frozenset({j}) for j in range(len(tree.sentences))]
        if granularity == "sentence"
        else [frozenset(tree.sentences_in(p)) for p in range(len(tree.paragraphs))]
    )
    n = len(units)
    response = lm.encode(RESPONSE, bos=False)

    def ll(removed: frozenset[int]) -> float:
        text = DEFAULT_TEMPLATE.replace("{context}", tree.without(removed))
        return lm.value(lm.encode(text.replace("{query}", QUERY), bos=True), response)

    masks = np.random.default_rng(seed).random((n_ablations, n)) < 0.5
    removals = [frozenset().union(*(units[j] for j in np.flatnonzero(~row))) for row in masks]
    y = np.array([ll(r) for r in removals])
    weights, intercept = lasso_reference(masks, y, 0.01, len(response))
    np.testing.assert_allclose(explanation.values, weights, rtol=1e-9, atol=1e-12)
    details = explanation.details or {}
    assert details["surrogate_intercept"] == pytest.approx(intercept, rel=1e-9, abs=1e-12)
    full = ll(frozenset())
    assert explanation.base_value == explanation.instance_output_value == pytest.approx(full)
    assert details["log_likelihood"] == pytest.approx(full)
    assert details["ablations"] == n_ablations and not explanation.exact
    # One reference pass, then each distinct ablation that changes the prompt once.
    changed = {tuple(row) for row in masks if not row.all()}
    assert explanation.n_model_evals == lm.passes == 1 + len(changed)
    assert len(changed) < n_ablations  # repeats happened: the memo saved passes
