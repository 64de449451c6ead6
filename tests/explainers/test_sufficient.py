"""Minimal sufficient subsets against ground truth: closed-form threshold models, brute-force
enumeration of every subset through the model itself, 1-minimality checked removal by removal,
Shapley's player numbering, budgets counted in model rows."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from torch import nn

from explainers.explanation import OptionError
from explainers.games import BudgetError, DeadlineExceeded, deadline
from explainers.games.masked import patch_groups
from explainers.shapley.explainer import MaskerOptions, ShapleyOptions
from explainers.shapley.explainer import explain as shapley_explain
from explainers.sufficient.explainer import SufficientOptions, explain
from models.base import Model, TextModel
from models.builtin.trained import dataset_split

W = np.array([3.0, 2.0, 1.0, 1.0, 0.5, 0.0])


class Counter:
    """A black-box predict that counts the rows it is asked about."""

    def __init__(self, fn: object) -> None:
        self.fn = fn
        self.rows = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.rows += len(x)
        return self.fn(x)  # type: ignore[operator]  # a plain function of rows


def threshold_model(weights: np.ndarray, t: float, background: np.ndarray | None = None) -> Model:
    """p(class 1) = sigmoid(20 (w . x - t)): a subset kept from x = 1 (absent: 0) is sufficient
    for class 1 exactly when its weights sum past t."""

    def predict(x: np.ndarray) -> np.ndarray:
        z = 20.0 * (np.asarray(x, np.float64) @ weights - t)
        p = 1.0 / (1.0 + np.exp(-z))
        return np.stack([1 - p, p], axis=1)

    d = len(weights)
    return Model(
        "threshold", "tabular", "classification", (d,), tuple(f"f{i}" for i in range(d)),
        ("no", "yes"), nn.Identity(), background, predict_fn=Counter(predict),
        differentiable=False,
    )  # fmt: skip


def mlp_model(d: int, k: int, seed: int, background: np.ndarray | None = None) -> Model:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, k), nn.Softmax(dim=-1)).eval()
    names = tuple(f"f{i}" for i in range(d))
    return Model(
        "mlp", "tabular", "classification", (d,), names, tuple(map(str, range(k))), net,
        background,
    )  # fmt: skip


def keeps(model: Model, x: np.ndarray, refs: np.ndarray, mask: np.ndarray, c: int) -> bool:
    rows = np.where(mask, x, refs)
    return bool(np.argmax(model.predict(rows).mean(axis=0)) == c)


ZERO = MaskerOptions(type="baseline", value=0.0)


def test_threshold_model_closed_form() -> None:
    model = threshold_model(W, 4.5)
    x = np.ones((1, 6), np.float32)
    for search in ("exact", "greedy"):
        res = explain(model, x, options=SufficientOptions(search=search, masker=ZERO))
        (e,) = res.explanations
        d = e.details
        assert d is not None
        # {0, 1} is the only pair whose weights (3 + 2) pass 4.5.
        assert d["subset"] == [0, 1] and d["players"] == ["f0", "f1"] and d["size"] == 2
        assert d["class"] == 1 and d["class_name"] == "yes" and d["verified"] is True
        assert d["minimality"] == ("minimum" if search == "exact" else "1-minimal")
        np.testing.assert_allclose(d["probability_subset"], 1 / (1 + np.exp(-10)), rtol=1e-5)
        np.testing.assert_allclose(d["probability_complement"], 1 / (1 + np.exp(50)), atol=1e-9)
        np.testing.assert_array_equal(e.values, [1, 1, 0, 0, 0, 0])
        assert e.exact is (search == "exact") and res.additive is False


def test_exact_search_is_the_smallest_of_all_subsets_by_enumeration() -> None:
    rng = np.random.default_rng(0)
    bg = rng.normal(size=(8, 7)).astype(np.float32)
    for seed in range(4):
        model = mlp_model(7, 3, seed, bg)
        x = rng.normal(size=(2, 7)).astype(np.float32)
        res = explain(model, x, options=SufficientOptions(search="exact"))
        for xi, e in zip(x, res.explanations, strict=True):
            c = int(np.argmax(model.predict(xi[None])))
            d = e.details
            assert d is not None and d["class"] == c
            masks = np.array(list(itertools.product([False, True], repeat=7)))  # [128, 7]
            rows = np.where(masks[:, None, :], xi, bg)  # [128, 8, 7]
            probs = model.predict(rows.reshape(-1, 7)).reshape(128, 8, 3).mean(axis=1)
            brute = int(masks[np.argmax(probs, axis=1) == c].sum(axis=1).min())
            assert d["size"] == brute and d["verified"]
            assert keeps(model, xi, bg, np.isin(np.arange(7), d["subset"]), c)


def test_greedy_subsets_are_sufficient_and_one_minimal() -> None:
    rng = np.random.default_rng(1)
    bg = rng.normal(size=(10, 12)).astype(np.float32)
    for seed, order in itertools.product(range(3), ("shapley", "leave-one-out")):
        model = mlp_model(12, 4, seed, bg)
        x = rng.normal(size=(2, 12)).astype(np.float32)
        opts = SufficientOptions(search="greedy", order=order)
        exact_sizes = [
            e.details["size"]  # type: ignore[index]
            for e in explain(model, x, options=SufficientOptions(search="exact")).explanations
        ]
        greedy = explain(model, x, options=opts).explanations
        for xi, e, best in zip(x, greedy, exact_sizes, strict=True):
            d = e.details
            assert d is not None and d["minimality"] == "1-minimal" and d["verified"]
            mask = np.isin(np.arange(12), d["subset"])
            assert keeps(model, xi, bg, mask, d["class"])
            for i in d["subset"]:  # no single player can go
                smaller = mask.copy()
                smaller[i] = False
                assert not keeps(model, xi, bg, smaller, d["class"])
            assert d["size"] >= best
            assert d["order"].startswith("shapley" if order == "shapley" else "leave-one-out")
            assert len(d["order_values"]) == 12


def test_budget_counts_every_model_row() -> None:
    bg = np.random.default_rng(2).normal(size=(5, 6)).astype(np.float32)
    model = threshold_model(W, 4.5, bg)
    counter = model.predict_fn
    assert isinstance(counter, Counter)
    x = np.ones((1, 6), np.float32)
    for opts, budget in [
        (SufficientOptions(search="exact"), None),
        (SufficientOptions(search="greedy"), None),
        (SufficientOptions(search="greedy", order="leave-one-out"), 200),
    ]:
        counter.rows = 0
        res = explain(model, x, options=opts, budget=budget)
        e = res.explanations[0]
        assert e.n_model_evals == counter.rows <= res.budget
        if budget is not None:
            assert res.budget == budget
    with pytest.raises(BudgetError):
        explain(model, x, options=SufficientOptions(search="exact"), budget=100)
    with pytest.raises(BudgetError):
        explain(model, x, options=SufficientOptions(search="greedy"), budget=20)


def test_greedy_is_one_minimal_not_minimum_and_a_short_budget_says_so() -> None:
    weights = np.linspace(0.1, 2.0, 16)  # 16 players: greedy unless asked
    model = threshold_model(weights, 3.5)
    x = np.ones((1, 16), np.float32)
    # Every leave-one-out drop is 0 (the logit saturates): the order is the index order, the
    # smallest weights first, so the prefix is long and pruning leaves a 1-minimal subset that
    # is larger than the minimum (the two largest weights).
    opts = SufficientOptions(search="greedy", order="leave-one-out", masker=ZERO)
    greedy = explain(model, x, options=opts).explanations[0].details
    best = explain(model, x, options=SufficientOptions(search="exact", masker=ZERO))
    assert best.explanations[0].details is not None
    assert best.explanations[0].details["subset"] == [14, 15]
    assert greedy is not None and greedy["minimality"] == "1-minimal" and greedy["size"] > 2
    kept = weights[greedy["subset"]].sum()
    assert kept >= 3.5 and all(kept - w < 3.5 for w in weights[greedy["subset"]])
    # The least budget the greedy search accepts pays for no pruning pass here.
    least = (17 + 16 + 4) + 1
    with pytest.raises(BudgetError):
        explain(model, x, options=opts, budget=least - 1)
    tight = explain(model, x, options=opts, budget=least).explanations[0]
    assert tight.details is not None and tight.details["verified"]
    assert tight.details["minimality"] == "none" and tight.details["size"] == 8
    assert "not_minimal" in [w.code for w in tight.warnings]
    assert tight.n_model_evals <= least


def test_min_probability_and_precision() -> None:
    model = threshold_model(W, 7.3)  # p(yes | x) = sigmoid(4) = 0.982
    x = np.ones((1, 6), np.float32)
    loose = explain(model, x, options=SufficientOptions(masker=ZERO)).explanations[0]
    assert loose.details is not None and loose.details["subset"] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(loose.details["probability_full"], 1 / (1 + np.exp(-4)), rtol=1e-5)
    # Above the full input's own probability: nothing can be sufficient.
    hard = SufficientOptions(masker=ZERO, min_probability=0.99)
    none = explain(model, x, options=hard).explanations[0]
    assert none.details is not None and none.details["subset"] is None
    assert [w.code for w in none.warnings] == ["no_sufficient_subset"]
    # Precision: the share of background rows whose own prediction keeps the class.
    rng = np.random.default_rng(3)
    bg = (rng.random((40, 6)) < 0.5).astype(np.float32)
    model = threshold_model(W, 4.5, bg)
    for min_precision in (0.5, 0.9, 1.0):
        opts = SufficientOptions(search="exact", min_precision=min_precision)
        d = explain(model, x, options=opts).explanations[0].details
        assert d is not None
        rows = np.where(np.isin(np.arange(6), d["subset"]), x, bg)
        share = float(np.mean(np.argmax(model.predict(rows), axis=1) == 1))
        np.testing.assert_allclose(d["precision"], share, rtol=1e-12)
        assert share >= min_precision


def test_target_and_errors() -> None:
    model = threshold_model(W, 4.5)
    x = np.ones((1, 6), np.float32)
    d = explain(model, x, options=SufficientOptions(masker=ZERO), target=0).explanations[0]
    assert d.details is not None and d.output_index == 0
    # Class 0 on x needs the weights kept to stay under 4.5: the empty subset does.
    assert d.details["subset"] == [] and "empty_subset" in [w.code for w in d.warnings]
    with pytest.raises(OptionError):
        explain(model, x, options=SufficientOptions(), target=2)
    with pytest.raises(OptionError):
        explain(model, x, options=SufficientOptions(players="tokens"))
    wide = threshold_model(np.ones(21), 3.0)
    with pytest.raises(OptionError):
        explain(wide, np.ones((1, 21), np.float32), options=SufficientOptions(search="exact"))


def test_the_deadline_stops_the_search() -> None:
    model = threshold_model(W, 4.5)
    with deadline(time.monotonic() - 1), pytest.raises(DeadlineExceeded):
        explain(model, np.ones((1, 6), np.float32), options=SufficientOptions())


def test_text_players_are_shapleys_words() -> None:
    def predict(texts: list[str]) -> np.ndarray:
        score = np.array([2 * t.split().count("good") - t.split().count("bad") for t in texts])
        p = 1 / (1 + np.exp(-(score - 1.5)))
        return np.stack([1 - p, p], axis=1).astype(np.float32)

    model = TextModel(
        name="toy", modality="text", task="classification", input_shape=(),
        feature_names=(), output_names=("neg", "pos"), module=nn.Identity(),
        predict_texts=predict, token_spans=lambda t: [],
    )  # fmt: skip
    texts = np.array(["a good day , not bad but good"])
    res = explain(model, texts, options=SufficientOptions())
    e = res.explanations[0]
    d = e.details
    assert d is not None and d["class"] == 1 and d["search"] == "exact"
    assert d["players"] == ["good"] and d["size"] == 1
    assert d["subset_text"].split() == ["good", ","]  # punctuation is no player: it stays
    assert d["subset"] in ([1], [6]) and d["verified"]
    shap = shapley_explain(model, texts, options=ShapleyOptions()).explanations[0]
    assert e.players == shap.players  # the same numbering of the same words
    with pytest.raises(OptionError):
        explain(model, texts, options=SufficientOptions(), background=np.zeros((1, 1)))


def test_digits_patches_use_shapleys_numbering(digits: Model) -> None:
    x = dataset_split("digits-cnn").x_test[:2]
    res = explain(digits, x, options=SufficientOptions(), seed=3)
    shap = shapley_explain(digits, x, options=ShapleyOptions(estimator="kernel"))
    assert res.player_names == shap.player_names and len(res.player_names) == 16
    groups, _ = patch_groups(digits.input_shape, 2)
    for xi, e in zip(x, res.explanations, strict=True):
        d = e.details
        assert d is not None and d["verified"] and d["search"] == "greedy"
        assert d["players"] == [res.player_names[i] for i in d["subset"]]
        kept = np.isin(groups, d["subset"]).reshape(xi.shape)
        p = digits.predict(np.where(kept, xi, 0.0)[None])[0]  # the default zero baseline
        assert int(np.argmax(p)) == d["class"] == int(np.argmax(digits.predict(xi[None])))
        np.testing.assert_allclose(p[d["class"]], d["probability_subset"], rtol=1e-5)
        assert d["size"] < 16 and e.n_model_evals <= res.budget
    again = explain(digits, x, options=SufficientOptions(), seed=3)
    assert [e.details for e in again.explanations] == [e.details for e in res.explanations]
