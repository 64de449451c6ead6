"""The one estimator contract (issue 29): every row of the estimator table takes a recorder and
returns an Estimate, spending only what the recorder meters; `choose` resolves a request's
estimator once, before any model call, and the explainers run that choice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from explainers import cocoa, rankshap
from explainers.estimators import library, registry
from explainers.estimators.base import Estimate
from explainers.estimators.registry import TABLE, Ask, Row, choose
from explainers.explanation import OptionError
from explainers.games import BudgetError, GameRecorder
from explainers.rankshap import RankShapOptions
from explainers.shapley import runs
from explainers.shapley.explainer import ShapleyOptions, explain
from models.base import Model
from models.builtin.rankers import load_bm25
from models.builtin.trained import dataset_split, load_builtin

N = 5  # 2^5 = 32 coalitions
HIERARCHY = ((0, 1), (2, (3, 4)))  # for partition (Owen values over the game's own grouping)


class CountingGame:
    """A random value table over N players with two outputs that counts the coalitions it
    is asked for (so nothing can reach it without the recorder's knowing)."""

    hierarchy = HIERARCHY

    def __init__(self, seed: int) -> None:
        self.table = np.random.default_rng(seed).normal(size=(1 << N, 2))
        self.coalitions = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool)
        self.coalitions += len(masks)
        return self.table[(masks.astype(np.int64) << np.arange(N)).sum(axis=1)]


def _ask(row: Row) -> Ask:
    return Ask(row.index, row.terms, 1 if row.index == "SV" else 2, output=1, seed=3)


def _budget(row: Row) -> int:
    """Enough for the row, below 2^n for the sampled ones where they allow it."""
    need = row.min_coalitions(N)
    return need if not row.sampled else max(need, 24)


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r.index}-{r.name}-{'terms' * r.terms}")
def test_every_row_takes_a_recorder_and_returns_an_estimate(row: Row) -> None:
    game = CountingGame(seed=1)
    budget = _budget(row)
    recorder = GameRecorder(game, N, budget)
    est = row.run(recorder, np.random.default_rng(0), _ask(row))
    assert isinstance(est, Estimate)
    assert game.coalitions == recorder.n_coalitions == est.n_coalitions <= budget
    assert est.n_evaluations == recorder.n_evaluations
    assert est.estimator.split(" ")[0] == row.name
    if row.sampled:  # below 2^n coalitions: an estimate
        assert not est.exact
    elif row.name != "partition":  # Owen values: exact over its hierarchy only
        assert est.exact
    assert np.asarray(est.values).shape[0] == N
    if row.terms:  # one output's terms: the one asked for
        assert est.output == 1 and est.interactions is not None and est.index == row.index
    elif row.index in ("API", "LOO", "surrogate"):
        assert est.index == row.index


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r.index}-{r.name}-{'terms' * r.terms}")
def test_choose_finds_each_row_by_name_and_checks_its_coalitions(row: Row) -> None:
    if row.index in ("LOO", "surrogate"):  # asked for by name by their explainer (attribot)
        return
    ask = _ask(row)
    budget = _budget(row)
    assert choose(ask, row.name, N, budget).row is row
    with pytest.raises(BudgetError):  # before any model call: choose has no game
        choose(ask, row.name, N, row.min_coalitions(N) - 1)


def test_names_outside_an_index_are_option_errors() -> None:
    with pytest.raises(OptionError, match="not available for FSII"):
        choose(Ask("FSII", True, 2), "svarm", N, 100)
    with pytest.raises(OptionError, match="API supports"):
        choose(Ask("API"), "kernel", N, 100)
    with pytest.raises(OptionError, match="unknown estimator"):
        choose(Ask(), "svarm", N, 100)


def test_text_players_steer_auto_and_carry_the_row_caveat() -> None:
    """gp's rows: preferred for Shapley values of text (costly coalitions), never chosen by
    auto for interaction terms of text, and prior_misfit when asked for by name there."""
    n, budget = 10, 300  # 10n coalitions, below 2^10
    assert choose(Ask(), "auto", n, budget, text=True).estimator == "gp"
    assert choose(Ask(), "auto", n, budget).estimator == "kernel"
    terms = Ask("k-SII", True, 2)
    assert choose(terms, "auto", n, budget).estimator == "gp"
    assert choose(terms, "auto", n, budget, text=True).estimator == "kernel"
    game = CountingGame(seed=2)
    small = Ask("k-SII", True, 2, seed=1)
    by_name = choose(small, "gp", N, 24, text=True)
    est = by_name.run(GameRecorder(game, N, 24), np.random.default_rng(1), small)
    assert [w.code for w in est.warnings][-1] == "prior_misfit"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every call of the real `choose`, wherever a module imported it, is recorded."""
    calls: list[str] = []
    real: Callable[..., Any] = registry.choose

    def counting(ask: Ask, estimator: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{ask.index}:{estimator}")
        return real(ask, estimator, *args, **kwargs)

    for module in (registry, library, runs, rankshap, cocoa):
        monkeypatch.setattr(module, "choose", counting)
    yield calls


@pytest.fixture(scope="module")
def mlp(model_dir: Path) -> Model:
    return load_builtin("breast-cancer-mlp", model_dir)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"estimator": "kernel"},
        {"target_se": 0.05},
        {"index": "k-SII", "max_order": 2},
        {"index": "API", "estimator": "permutation"},
    ],
    ids=["auto", "kernel", "target_se", "k-SII", "API"],
)
def test_the_shapley_explainer_chooses_once_per_request(
    counted: list[str], mlp: Model, options: dict[str, Any]
) -> None:
    rows = dataset_split("breast-cancer-mlp").x_test[:2]  # two instances, one player count
    background = dataset_split("breast-cancer-mlp").x_train[:2]
    res = explain(
        mlp, rows, options=ShapleyOptions(**options), seed=0, budget=2000, background=background
    )
    assert len(res.explanations) == 2 and all(e.n_model_evals > 0 for e in res.explanations)
    assert len(counted) == 1, counted


def test_an_impossible_budget_fails_at_the_one_choice(counted: list[str], mlp: Model) -> None:
    x = dataset_split("breast-cancer-mlp").x_test[:1]
    with pytest.raises(BudgetError):
        explain(mlp, x, options=ShapleyOptions(estimator="kernel"), budget=10)
    assert counted == ["SV:kernel"]


def test_rankshap_chooses_once(counted: list[str]) -> None:
    docs = ["solar panels make electricity", "wind power and solar power", "bread and flour"]
    res = rankshap.explain(
        load_bm25(Path(".")),
        np.empty(0),
        options=RankShapOptions(estimator="kernel"),
        query="solar electricity",
        documents=docs,
    )
    assert res.explanations[0].n_model_evals > 0
    assert counted == ["SV:kernel"]


def test_texts_of_two_lengths_choose_once_each(
    counted: list[str], text_model: Model, one_torch_thread: None
) -> None:
    """One choice per player count (the longest text sets no other's), with gp's text policy:
    auto takes gp for Shapley values of text and never for its interaction terms."""
    texts = np.array(
        ["a good film with a fine cast", "the worst film in years, dull and far too long"]
    )
    res = explain(text_model, texts, options=ShapleyOptions(), seed=0, budget=40)
    assert counted == ["SV:auto", "SV:auto"]
    assert [len(e.values) for e in res.explanations] == [7, 10]
    assert {e.estimator for e in res.explanations} == {"gp"}
    counted.clear()
    res = explain(text_model, texts, options=ShapleyOptions(index="k-SII"), seed=0, budget=40)
    assert counted == ["k-SII:auto", "k-SII:auto"]
    assert all(e.estimator.startswith("kernel") for e in res.explanations)
